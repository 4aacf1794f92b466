// xpv-xenstored's journal for crash restart (see journal.h). io_context thread only.
#include "xpv/xenbus/daemon/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <utility>

namespace xpv::xenbus::daemon {

namespace {

constexpr std::uint64_t kMinSnapshotEvery = 4u << 20;

// Writes all of `data` to `fd`; false with errno set on failure.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

Journal::Contents Journal::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(fmt::format("{}: cannot read", path));
  Contents out;
  std::size_t pos = 0;
  for (std::size_t line = 1; pos < text.size(); ++line) {
    const std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {  // cut short by the death of the process that wrote it
      if (line == 1) throw std::runtime_error(fmt::format("{}:1: the snapshot line is incomplete", path));
      out.torn_tail = true;
      break;
    }
    nlohmann::json j = nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(pos),
                                             text.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw std::runtime_error(fmt::format("{}:{}: not a JSON object", path, line));
    if (line == 1) {
      if (!j.contains("xpv-xenstored-journal") || j.at("xpv-xenstored-journal") != kJournalVersion ||
          !j.contains("snapshot")) {
        throw std::runtime_error(fmt::format("{}:1: not a version {} xpv-xenstored journal", path, kJournalVersion));
      }
      out.snapshot = std::move(j.at("snapshot"));
      if (j.contains("rings")) {
        if (!j.at("rings").is_array()) throw std::runtime_error(fmt::format("{}:1: 'rings' is not a list", path));
        out.rings = std::move(j.at("rings"));
      }
    } else {
      out.changes.push_back(std::move(j));
    }
    pos = nl + 1;
  }
  if (out.snapshot.is_null()) throw std::runtime_error(fmt::format("{}: empty", path));
  return out;
}

std::map<DomId, RingJournalState> Journal::Contents::ring_states() const {
  std::map<DomId, RingJournalState> out;
  auto domid_of = [](const nlohmann::json& r) {
    if (!r.contains("domid") || !r.at("domid").is_number_integer() || r.at("domid").get<std::int64_t>() < 0 ||
        r.at("domid").get<std::int64_t>() > 0xffff) {
      throw std::runtime_error("'domid' is missing or not a domain id");
    }
    return r.at("domid").get<DomId>();
  };
  for (std::size_t i = 0; i < rings.size(); ++i) {
    try {
      out[domid_of(rings[i])].apply(rings[i]);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("ring {} of the journal's snapshot: {}", i + 1, e.what()));
    }
  }
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const auto& r = changes[i];
    const auto op = r.value("op", std::string());
    try {
      if (op == "ring") {
        out[domid_of(r)].apply(r);
      } else if (op == "introduce" || op == "release") {
        out.erase(domid_of(r));  // another ring, or none
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("change {} of the journal: {}", i + 1, e.what()));
    }
  }
  return out;
}

Journal::Journal(boost::asio::io_context& io, Store& store, std::string path, std::function<nlohmann::json()> rings,
                 bool carried_over)
    : io_(io), store_(store), path_(std::move(path)), rings_(std::move(rings)), retry_timer_(io) {
  if (auto err = write_snapshot()) {
    if (!carried_over) throw std::runtime_error(fmt::format("journal {}: {}", path_, *err));
    // The store stays; the journal comes when it can be written. Until something changes, the
    // journal this store was recovered from (if any) still holds it: kept until then.
    fail(*err, /*keep_file=*/true);
  }
  store_.set_change_log(this);
}

Journal::~Journal() {
  store_.set_change_log(nullptr);
  try {
    retry_timer_.cancel();
  } catch (...) {
  }
  if (fd_ >= 0) ::close(fd_);
}

void Journal::record(std::string_view change) {
  if (failed_) {
    fail("a change it does not hold");  // a file kept by a carried-over start goes now
    return;
  }
  try {
    pending_ += change;
    pending_.push_back('\n');
  } catch (const std::bad_alloc&) {
    fail("out of memory recording a change");
    return;
  }
  ++changes_;
}

void Journal::lost(std::string_view what) noexcept { fail(what); }

void Journal::commit() noexcept {
  if (failed_ || pending_.empty()) return;
  if (!write_all(fd_, pending_)) {
    // Formatted on the stack: this is noexcept, and memory may be what ran out.
    const int e = errno;
    char what[160];
    const auto r = fmt::format_to_n(what, sizeof what, "write: {}", std::strerror(e));
    fail(std::string_view(what, std::min(r.size, sizeof what)));
    return;
  }
  bytes_ += pending_.size();
  pending_.clear();
  if (!snapshot_posted_ && bytes_ > std::max(kMinSnapshotEvery, 2 * snapshot_bytes_)) {
    snapshot_posted_ = true;
    try {
      boost::asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
        if (alive.expired()) return;
        snapshot_posted_ = false;
        snapshot();
      });
    } catch (...) {
      snapshot_posted_ = false;  // tried again at the next commit
    }
  }
}

void Journal::snapshot() {
  if (failed_) return;
  if (auto err = write_snapshot()) fail(*err);
}

std::optional<std::string> Journal::write_snapshot() {
  try {
    nlohmann::json head{{"xpv-xenstored-journal", kJournalVersion}, {"snapshot", store_.save()}};
    if (rings_) head["rings"] = rings_();
    std::string text = head.dump();
    text.push_back('\n');
    const std::string tmp = path_ + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return fmt::format("{}: {}", tmp, std::strerror(errno));
    if (!write_all(fd, text) || ::rename(tmp.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fmt::format("{}: {}", tmp, std::strerror(err));
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    bytes_ = snapshot_bytes_ = text.size();
    pending_.clear();  // every change so far is in the snapshot
    ++snapshots_;
    spdlog::debug("xenstored: journal {}: snapshot of {} nodes, {} bytes", path_, store_.node_count(), text.size());
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

void Journal::remove_file(std::string_view why) noexcept {
  // A journal that misses changes must not be recovered from: better no recovery than a wrong one.
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    // Still there (a read-only file system, EIO…): emptied through the descriptor instead, which
    // read() refuses ("empty"), so that no recovery takes it.
    const int err = errno;
    if (fd_ < 0 || ::ftruncate(fd_, 0) != 0) {
      spdlog::error("xenstored: journal {} ({}) can be neither removed ({}) nor emptied: a crash now would be "
                    "recovered from a journal that misses changes",
                    path_, why, std::strerror(err));
    }
  }
}

void Journal::fail(std::string_view what, bool keep_file) noexcept {
  if (removed_) return;
  if (failed_) {  // given up already: a try to write it again is on its way
    if (std::exchange(stale_at_change_, false)) remove_file(what);  // it misses a change now
    return;
  }
  failed_ = true;
  ++failures_;
  pending_.clear();
  if (keep_file) {
    stale_at_change_ = true;
  } else {
    remove_file(what);
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  spdlog::error("xenstored: journal {} given up ({}): {}, and a crash of this daemon cannot be "
                "recovered from until it is written again",
                path_, what, keep_file ? "it is removed at the first change" : "it is removed");
  // Not from here: the request being handled may not be finished (its ring index not published,
  // its reply not queued), and a snapshot is only whole between requests.
  retry_delay_ = std::chrono::milliseconds(0);
  retry_after(retry_delay_);
}

void Journal::retry_after(std::chrono::milliseconds delay) noexcept {
  try {
    retry_timer_.expires_after(delay);
    retry_timer_.async_wait([this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
      if (!ec && !alive.expired()) retry();
    });
  } catch (const std::exception& e) {
    spdlog::error("xenstored: journal {}: cannot schedule writing it again ({}); it stays given up", path_, e.what());
  }
}

void Journal::retry() noexcept {
  if (removed_ || !failed_) return;
  if (auto err = write_snapshot()) {
    constexpr std::chrono::milliseconds kMaxDelay{32000};
    retry_delay_ = retry_delay_.count() == 0 ? std::chrono::milliseconds(1000) : std::min(2 * retry_delay_, kMaxDelay);
    spdlog::warn("xenstored: journal {} still cannot be written ({}); next try in {} s", path_, *err,
                 retry_delay_.count() / 1000);
    retry_after(retry_delay_);
    return;
  }
  failed_ = false;
  stale_at_change_ = false;  // renamed over
  retry_delay_ = std::chrono::milliseconds(0);
  spdlog::warn("xenstored: journal {} written again (a snapshot of {} nodes): a crash can be recovered from again",
               path_, store_.node_count());
}

void Journal::remove() noexcept {
  removed_ = true;
  try {
    retry_timer_.cancel();
  } catch (...) {
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  failed_ = true;
  store_.set_change_log(nullptr);
  ::unlink(path_.c_str());
}

}  // namespace xpv::xenbus::daemon
