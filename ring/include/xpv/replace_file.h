// replace_file — writes a small file so that a reader sees the old content or the new, never half
// of either: `content` goes to PATH.tmp, which is then renamed over PATH. Used for the toolstack's
// records and pid files (toolstack/fs.h wraps it with its error line) and for the backends'
// statistics files (stats_file.h).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "xpv/unique_fd.h"

namespace xpv {

// Returns 0, or the errno of the step that failed; then PATH is as it was, PATH.tmp is gone, and
// `failed_at` (if given) names the file that step was about (PATH.tmp for its writing, PATH for the
// rename).
inline int replace_file(const std::string& path, std::string_view content, unsigned mode = 0644,
                        std::string* failed_at = nullptr) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](int e, const std::string& where) {
    ::unlink(tmp.c_str());
    if (failed_at != nullptr) *failed_at = where;
    return e;
  };
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) {
    const int e = errno;
    if (failed_at != nullptr) *failed_at = tmp;
    return e;
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : EIO, tmp);
    done += static_cast<std::size_t>(n);
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, path);
  return 0;
}

}  // namespace xpv
