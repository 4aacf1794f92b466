#include "xpv/platform_pci/unplug_ports.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace xpv::platform_pci {
namespace {

std::uint32_t gather(std::span<const std::uint8_t> data) noexcept {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < data.size() && i < 4; ++i) v |= std::uint32_t{data[i]} << (8 * i);
  return v;
}

void scatter(std::span<std::uint8_t> data, std::uint32_t v) noexcept {
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = i < 4 ? static_cast<std::uint8_t>(v >> (8 * i)) : 0xff;
}

std::string suppressed_note(std::uint64_t n) {
  return n ? fmt::format(" ({} similar lines suppressed)", n) : std::string();
}

}  // namespace

std::string describe_unplug_mask(std::uint16_t mask) {
  static constexpr struct {
    std::uint16_t bit;
    const char* name;
  } kNames[] = {{kUnplugIdeScsiDisks, "IDE/SCSI disks"},
                {kUnplugNics, "NICs"},
                {kUnplugAuxIde, "aux IDE disks"},
                {kUnplugNvme, "NVMe disks"}};
  std::string s;
  for (const auto& n : kNames) {
    if (mask & n.bit) {
      if (!s.empty()) s += ", ";
      s += n.name;
    }
  }
  if (const std::uint16_t unknown = mask & ~kUnplugKnownBits; unknown != 0) {
    if (!s.empty()) s += ", ";
    s += fmt::format("unknown bits {:#x}", unknown);
  }
  return s.empty() ? "nothing" : s;
}

UnplugPorts::UnplugPorts(UnplugConfig config)
    : blacklist_(std::move(config.blacklist)),
      on_unplug_(std::move(config.on_unplug)),
      on_guest_log_(std::move(config.on_guest_log)) {}

void UnplugPorts::read(std::uint64_t, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  std::uint32_t v = 0xffff'ffffu;
  {
    std::lock_guard lk(mu_);
    if (offset == 0 && data.size() == 2) {
      v = blacklisted_ ? kMagicBlacklisted : kMagic;
      ++stats_.magic_reads;
    } else if (offset == 0 && data.size() == 1) {
      v = flags_;
    } else if (offset == 2 && data.size() == 1) {
      v = kProtocolVersion;
    } else {
      ++stats_.ignored;
    }
  }
  scatter(data, v);
}

void UnplugPorts::write(std::uint64_t, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept {
  const std::uint32_t v = gather(data);
  if (offset == 0 && data.size() == 1) return set_platform_flags(static_cast<std::uint8_t>(v));
  if (offset == 2 && data.size() == 1) return log_byte(static_cast<std::uint8_t>(v));

  enum class Event { none, unplug, refused, blacklisted } event = Event::none;
  bool log_it = false;
  std::uint64_t suppressed = 0;
  std::optional<std::uint16_t> product;
  std::optional<std::uint32_t> build;
  {
    std::lock_guard lk(mu_);
    if (offset == 0 && data.size() == 2) {
      if (blacklisted_) {
        ++stats_.refused_unplugs;
        event = Event::refused;
      } else {
        unplugged_ = static_cast<std::uint16_t>(unplugged_ | v);
        ++stats_.unplug_writes;
        event = Event::unplug;
      }
    } else if (offset == 2 && data.size() == 2) {
      product_ = static_cast<std::uint16_t>(v);
    } else if (offset == 0 && data.size() == 4) {
      build_ = v;
      // Checked at the build write: the guest re-reads the magic right after it (step 5).
      const bool was = blacklisted_;
      blacklisted_ = product_.has_value() &&
                     std::any_of(blacklist_.begin(), blacklist_.end(), [&](const BlacklistEntry& e) {
                       return e.product == *product_ && (!e.build || *e.build == v);
                     });
      if (blacklisted_ && !was) event = Event::blacklisted;
    } else {
      ++stats_.ignored;
    }
    if (event != Event::none) {
      log_it = unplug_log_limit_.allow();
      if (log_it) suppressed = unplug_log_limit_.take_suppressed();
      product = product_;
      build = build_;
    }
  }
  const auto who = [&] {
    return fmt::format("product {} build {}", product ? fmt::format("{:#x}", *product) : "unset",
                       build ? fmt::format("{}", *build) : "unset");
  };
  const auto mask = static_cast<std::uint16_t>(v);
  switch (event) {
    case Event::none:
      return;
    case Event::unplug:
      if (log_it) {
        spdlog::info("xen-platform: guest ({}) unplugs emulated {} (mask {:#x}){}", who(), describe_unplug_mask(mask),
                     mask, suppressed_note(suppressed));
      }
      if (on_unplug_) on_unplug_(mask);
      return;
    case Event::refused:
      if (log_it) {
        spdlog::warn("xen-platform: blacklisted guest driver ({}) wrote unplug mask {:#x} ({}): ignored{}", who(),
                     mask, describe_unplug_mask(mask), suppressed_note(suppressed));
      }
      return;
    case Event::blacklisted:
      if (log_it) {
        spdlog::warn("xen-platform: guest PV driver ({}) is blacklisted: magic now reads {:#x}{}", who(),
                     kMagicBlacklisted, suppressed_note(suppressed));
      }
      return;
  }
}

std::uint8_t UnplugPorts::platform_flags() const noexcept {
  std::lock_guard lk(mu_);
  return flags_;
}

void UnplugPorts::set_platform_flags(std::uint8_t v) noexcept {
  std::lock_guard lk(mu_);
  flags_ = v & kFlagRomLock;
}

void UnplugPorts::log_byte(std::uint8_t c) noexcept {
  Line done;
  bool have_line = false;
  bool log_it = false;
  std::uint64_t suppressed = 0;
  {
    std::lock_guard lk(mu_);
    if (c != '\n') {
      line_.text[line_.len++] = (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
    }
    if (c == '\n' || line_.len == kLogLineMax) {
      done = line_;
      line_.len = 0;
      have_line = true;
      ++stats_.log_lines;
      if (!on_guest_log_) {
        log_it = guest_log_limit_.allow();
        if (log_it) suppressed = guest_log_limit_.take_suppressed();
      }
    }
  }
  if (!have_line) return;
  const std::string_view text(done.text.data(), done.len);
  if (on_guest_log_) {
    on_guest_log_(text);
  } else if (log_it) {
    spdlog::info("xen-platform: guest: {}{}", text, suppressed_note(suppressed));
  }
}

std::uint16_t UnplugPorts::unplugged_mask() const noexcept {
  std::lock_guard lk(mu_);
  return unplugged_;
}

std::optional<std::uint16_t> UnplugPorts::product() const noexcept {
  std::lock_guard lk(mu_);
  return product_;
}

std::optional<std::uint32_t> UnplugPorts::build() const noexcept {
  std::lock_guard lk(mu_);
  return build_;
}

bool UnplugPorts::blacklisted() const noexcept {
  std::lock_guard lk(mu_);
  return blacklisted_;
}

UnplugStats UnplugPorts::stats() const noexcept {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace xpv::platform_pci
