#include "xpv/config/vdev.h"

#include <charconv>

namespace xpv::config {
namespace {

constexpr std::uint32_t kMaxDisk = (1u << 20) - 1;

// Disk letters to an index, bijective base 26: a=0 … z=25, aa=26. Up to five letters: four
// name only disks up to 475253 (zzzz), and xvd_name() names every disk up to kMaxDisk, with five
// from 475254 (aaaaa) on — a name it gives must parse back.
std::optional<std::uint32_t> letters_to_disk(std::string_view s) {
  if (s.empty() || s.size() > 5) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < 'a' || c > 'z') return std::nullopt;
    v = v * 26 + static_cast<std::uint64_t>(c - 'a' + 1);
  }
  if (v - 1 > kMaxDisk) return std::nullopt;
  return static_cast<std::uint32_t>(v - 1);
}

std::string disk_to_letters(std::uint32_t disk) {
  std::string s;
  std::uint64_t v = std::uint64_t{disk} + 1;
  while (v > 0) {
    --v;
    s.insert(s.begin(), static_cast<char>('a' + v % 26));
    v /= 26;
  }
  return s;
}

std::optional<std::uint32_t> number(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint32_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<Vdev> xvd(std::uint32_t disk, std::uint32_t partition) {
  Vdev v{0, disk, partition, ""};
  if (disk < 16 && partition < 16) {
    v.devid = (202u << 8) | (disk << 4) | partition;
  } else if (disk <= kMaxDisk && partition < 256) {
    v.devid = (1u << 28) | (disk << 8) | partition;
  } else {
    return std::nullopt;
  }
  v.name = "xvd" + disk_to_letters(disk) + (partition ? std::to_string(partition) : "");
  return v;
}

}  // namespace

std::optional<Vdev> parse_vdev(std::string_view name) {
  auto split = [](std::string_view rest) {
    std::size_t i = 0;
    while (i < rest.size() && rest[i] >= 'a' && rest[i] <= 'z') ++i;
    return std::pair{rest.substr(0, i), rest.substr(i)};
  };
  auto partition_of = [](std::string_view digits) -> std::optional<std::uint32_t> {
    if (digits.empty()) return 0u;
    return number(digits);
  };

  if (name.starts_with("xvd")) {
    auto [letters, digits] = split(name.substr(3));
    auto disk = letters_to_disk(letters);
    auto part = partition_of(digits);
    if (!disk || !part) return std::nullopt;
    return xvd(*disk, *part);
  }
  if (name.starts_with("hd") || name.starts_with("sd")) {
    const bool ide = name[0] == 'h';
    auto [letters, digits] = split(name.substr(2));
    auto disk = letters_to_disk(letters);
    auto part = partition_of(digits);
    if (!disk || !part) return std::nullopt;
    Vdev v{0, *disk, *part, ""};
    if (ide) {
      if (*disk > 3 || *part > 63) return std::nullopt;
      const std::uint32_t major = *disk < 2 ? 3 : 22;
      v.devid = (major << 8) | ((*disk % 2) << 6) | *part;
    } else {
      if (*disk > 15 || *part > 15) return std::nullopt;
      v.devid = (8u << 8) | (*disk << 4) | *part;
    }
    v.name = std::string(name);
    return v;
  }
  if (name.starts_with("d")) {
    auto p = name.find('p');
    auto disk = number(name.substr(1, p == std::string_view::npos ? std::string_view::npos : p - 1));
    auto part = p == std::string_view::npos ? std::optional<std::uint32_t>(0) : number(name.substr(p + 1));
    if (!disk || !part) return std::nullopt;
    return xvd(*disk, *part);
  }
  return std::nullopt;
}

std::optional<std::string> xvd_name(std::uint32_t devid) {
  if ((devid >> 8) == 202) {
    return xvd((devid >> 4) & 0xf, devid & 0xf).value().name;
  }
  if ((devid >> 28) == 1) {
    auto v = xvd((devid >> 8) & kMaxDisk, devid & 0xff);
    if (v) return v->name;
  }
  return std::nullopt;
}

}  // namespace xpv::config
