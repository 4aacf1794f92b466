#include "xpv/toolstack/fs.h"

#include "xpv/replace_file.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "xpv/toolstack/error.h"
#include "xpv/unique_fd.h"

namespace xpv::toolstack {

std::optional<std::string> read_file(const std::string& path) {
  // Read in small steps: the monitor and the supervisor call this twice a second, and a buffer
  // of the full 1 MiB limit zeroed (and faulted in) each time cost them more than the reads.
  constexpr std::size_t kLimit = std::size_t{1} << 20;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string s;
  char buf[8192];
  while (s.size() < kLimit) {
    const ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, kLimit - s.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<std::size_t>(n));
  }
  return s;
}

void write_file_atomic(const std::string& path, const std::string& content, unsigned mode) {
  std::string where;
  if (const int e = replace_file(path, content, mode, &where); e != 0) {
    throw ToolstackError(fmt::format("cannot write {}: {}", where, std::strerror(e)));
  }
}

void make_dirs(const std::string& path, unsigned mode) {
  std::filesystem::path p;
  for (const auto& part : std::filesystem::path(path)) {
    p /= part;
    if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) {
      throw ToolstackError(fmt::format("cannot create directory {}: {}", p.string(), std::strerror(errno)));
    }
  }
}

std::string read_from(const std::string& path, std::uint64_t offset, std::size_t max) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  f.seekg(static_cast<std::streamoff>(offset));
  if (!f) return {};
  std::string s(max, '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<std::size_t>(f.gcount()));
  return s;
}

std::string last_line(const std::string& path) {
  const std::uint64_t size = file_size(path);
  const std::string text = read_from(path, size > 4096 ? size - 4096 : 0, 4096);
  std::string_view s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  auto nl = s.rfind('\n');
  if (nl != std::string_view::npos) s.remove_prefix(nl + 1);
  if (s.size() > 300) s = s.substr(0, 300);
  return std::string(s);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

}  // namespace xpv::toolstack
