// The xl-syntax domain configuration (tools/config: parse_xl, parse_domain_config) and the
// device-spec parsers fed mutated and random text: seeded, bounded fuzzing.
//
// Inputs: the project's own configurations (the unit tests', the README's, the testbed's, one with
// every setting), mutated — bits flipped, bytes replaced, quotes, brackets, '=', '#', ';', ',',
// '\\', newlines and NULs inserted, huge and negative numbers, very long strings, ranges deleted,
// lines duplicated (keys set twice), swapped or spliced in from another sample, settings with
// edge values appended, truncation — and random bytes.
//
// Invariants (each one breaks on a real bug):
//  - parsing returns or throws ConfigError (error.h), nothing else;
//  - a ConfigError's message is one printable line (no control characters: a message with a
//    newline in it reads as two messages, the second one without a position); parse_xl's names
//    the position as "t.cfg:LINE: " with LINE a line of the text; parse_domain_config repeats
//    parse_xl's error word for word, names a setting as "t.cfg:LINE: 'KEY': " with KEY really set
//    on LINE, or is one of the whole-file checks ("t.cfg: ...");
//  - parsing is deterministic (twice → the same result), and parse_xl's entries round-trip:
//    written back in xl syntax they parse to the same entries;
//  - a DomainConfig that parses is valid as domain_config.h documents it (name, memory 1..1 Mi,
//    maxmem ≥ memory, vcpus 1..128, hvm ⇔ kernel, disks' vdevs unique and consistent, MACs
//    unique and unicast, ip/mtu/vifname/rate in range) and round-trips through xl syntax;
//  - every prefix of each valid sample parses or fails with a positioned error, and a prefix that
//    parses yields the sample's own entries (the last one possibly cut short).
// The device-spec helpers get exact oracles: parse_memory_kib and parse_rate against 128-bit
// arithmetic, parse_vdev/xvd_name as a bijection, MAC and IPv4 addresses through their str().
// A failure prints its seed (SCOPED_TRACE); XPV_FUZZ_ITERATIONS=N runs seeds 1..N per test (default
// 20000), XPV_FUZZ_SEED=S seed S alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xpv/test/fuzz_seeds.h"
#include "xpv/config/device_specs.h"
#include "xpv/config/domain_config.h"
#include "xpv/config/error.h"
#include "xpv/config/vdev.h"
#include "xpv/config/xl_parser.h"

namespace xpv::config {
namespace {

__extension__ typedef unsigned __int128 U128;

const std::string kSource = "t.cfg";

using xpv::test::fuzz_seeds;

// Valid domain configurations, as the project writes them.
const std::vector<std::string>& samples() {
  static const std::vector<std::string> s = {
      // tests/unit/config/domain_config_test.cpp
      "name = 'store1'\ntype = 'process'\nmemory = 64\n"
      "disk = [ 'format=raw, vdev=xvda, access=rw, target=/srv/a.img', '/srv/b.img,raw,xvdb,ro' ]\n"
      "vif = [ 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24' ]\n",
      "name = 'g'\nbuilder = 'hvm'\nkernel = '/boot/vmlinuz'\nvcpus = 2\nvnc = 1\nupcall = 'intx'\n"
      "on_reboot = 'destroy'\n",
      "name = 'g'\ntype = 'hvm'\nkernel = '/k'\nmemory = 384\nmaxmem = 1024\n",
      "name = 'g'\ntype = 'hvm'\nkernel = '/k'\nvcpus = 3\ncpus = '0-3,5,^1'\n",
      "name = 'g'\ntype = 'hvm'\nkernel = '/k'\nvcpus = 2\ncpus = ['3-4', '2-6,^4', '1']\ncpus_soft = 'all'\n",
      "name = 'a'\ncpu_weight = 512\ncap = 150\n",
      // README.md
      "name = \"g1\"\ntype = \"hvm\"\nmemory = 512\nvcpus = 2\n"
      "kernel = \"IMAGE/vmlinuz\"            # `xpv image build` prints IMAGE\n"
      "ramdisk = \"IMAGE/initrd.cpio\"\nextra = \"root=/dev/xvda xpv.run=selftest xpv.ip=10.0.0.2/24\"\n"
      "disk = [ 'vdev=xvda, target=/srv/g1-root.ext4' ]   # a copy of IMAGE/root.ext4\n",
      // tests/testbed/hvm/hvm_session.sh (callback mode) and tools/testbed/guests.sh
      "name = \"callback\"\ntype = \"hvm\"\nmemory = 384\nmaxmem = 512\nvcpus = 2\nupcall = \"callback\"\n"
      "kernel = \"/w/img/vmlinuz\"\nramdisk = \"/w/img/initrd.cpio\"\n"
      "extra = \"root=/dev/xvda panic=-1 xpv.run=selftest xpv.ip=10.0.1.2/24 xpv.wait=30 "
      "xpv.shutdown_wait=90 xen-netfront.max_queues=1\"\n"
      "disk = [ 'vdev=xvda, target=/w/callback.ext4' ]\n",
      "name = \"xpv-g\"\ntype = \"hvm\"\nmemory = 512\nvcpus = 2\nupcall = \"callback\"\n"
      "kernel = \"/img/vmlinuz\"\nramdisk = \"/img/initrd.cpio\"\nextra = \"root=/dev/xvda console=ttyS0\"\n"
      "disk = [ 'vdev=xvda, target=/w/root.ext4' ]\nvif = [ 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24' ]\n",
      // tests/integration/toolstack/toolstack_test.cpp
      "name = \"web1\"\nmemory = 32\nvcpus = 2\n"
      "disk = [ 'format=raw, vdev=xvda, access=rw, target=/tmp/a.img' ]\n"
      "vif = [ 'mac=00:16:3e:00:00:01, ip=10.9.0.2/24' ]\n",
      // Every setting, both disk spec forms, every vif key, comments, ';' and escapes.
      "# every setting\nname = 'all_of.them-1' ; type = \"hvm\"\nmemory = 0x100\nmaxmem = 1024 # MiB\n"
      "vcpus = 128\nkernel = '/boot/vmlinuz-6.1'\nramdisk = \"/boot/initrd.img\"\n"
      "cmdline = \"console=hvc0 \\\"quoted\\\" a\\\\b\\tc\\n\"\nupcall = 'vector'\n"
      "on_poweroff = 'preserve'\non_reboot = 'restart'\non_crash = 'destroy'\n"
      "disk = [\n  'format=raw, vdev=xvda, access=rw, devtype=disk, backendtype=phy, target=/srv/a,b.img',\n"
      "  '/srv/b.img,raw,xvdb,ro', \"/dev/sdb,,hdc,r\", 'vdev=d1p3, access=r, target=/srv/c.img',\n"
      "  'vdev=sdd2, target=/srv/d.img',\n]\n"
      "vif = [ 'mac=00:16:3e:0a:bc:ff, ip=192.168.7.9/16, rate=10Mb/s@20ms, vifname=web0, bridge=br0, mtu=9000, queues=2',\n"
      "        'model=vif, type=vif, backend=0, rate=100MB/s', ]\n"
      "vnc = 1; serial = 'pty'\n",
  };
  return s;
}

// Mutation bases: the samples, plus xl syntax that is not a domain configuration.
const std::vector<std::string>& bases() {
  static const std::vector<std::string> b = [] {
    auto v = samples();
    v.push_back("name = \"a\"\nmemory = 512 # MiB\nvcpus=0x2; extra='x y'\n"
                "disk = [ 'one',\n  \"two\", # trailing comment\n]\n");
    v.push_back("a = \"q\\\"uote\\\\\"\nb = []\n;;\n# nothing\n");
    return v;
  }();
  return b;
}

const std::vector<std::string>& disk_specs() {
  static const std::vector<std::string> s = {
      "format=raw, vdev=xvda, access=rw, target=/srv/a.img", "/srv/b.img,raw,xvdb,ro",
      "format=raw, vdev=xvdb, access=ro, target=/srv/a,b.img", "/srv/b.img,,xvdc",
      "vdev=xvda, target=/srv/g1-root.ext4", "/dev/sdb,,hdc,r", "vdev=d1p3, access=r, target=/c",
      "vdev=sdd2, target=/srv/d.img", "vdev=xvdaa15, devtype=disk, backendtype=qdisk, target=/x"};
  return s;
}

const std::vector<std::string>& vif_specs() {
  static const std::vector<std::string> s = {
      "mac=00:16:3e:00:00:01, ip=10.0.0.2/24",
      "mac=00:16:3e:00:00:01, ip=10.0.0.2/24, rate=1Gb/s, vifname=web0, bridge=br0, model=vif",
      "mac=00:16:3e:0a:bc:ff, ip=192.168.7.9/16, rate=10Mb/s@20ms, mtu=9000",
      "model=vif, type=vif, backend=0, rate=100MB/s", "ip=10.1.2.3, rate=5KB/s@100us, backend=Domain-0", ""};
  return s;
}

// ---- mutation ----------------------------------------------------------------------------------

using Rng = std::mt19937_64;

std::size_t below(Rng& rng, std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); }

const std::vector<std::string>& tokens() {
  static const std::vector<std::string> t = {
      "\"", "'", "[", "]", "=", "#", ";", ",", "\\", "\n", std::string(1, '\0'), " ", "\t", "\r",
      "\\n", "\\x", "0x", "-", "--", "@", "/", ":", "99999999999999999999", "-9223372036854775808",
      "9223372036854775807", "0x7fffffffffffffff", "0xffffffffffffffff", "-0x8000000000000000",
      "1048576", "1048577", "0", "-1", "128", "129", "name", "memory", "maxmem", "vcpus", "type",
      "builder", "'hvm'", "'process'", "kernel", "ramdisk", "extra", "disk", "vif", "upcall",
      "on_crash", "vnc", "target=", "vdev=", "xvda", "xvdzzzz", "d1048575p255", "hdd63", ",xvda",
      "access=", "format=", "devtype=", "mac=", "ip=", "rate=", "mtu=", "vifname=", "bridge=", "queues=", "64", "65",
      "cpus", "cpus_soft", "'all'", "^", "'^0'", "nodes:", "1023", "1024", "'0-1023'",
      "cpu_weight", "cap", "65535", "65536", "102400", "102401",
      "00:16:3e:00:00:01", "10.0.0.2/24", "/30", "/31", "10Mb/s", "1099511627776GB/s",
      "@18446744073709552ms", "@10s", "\xff", "\xc3\xa9", "\x1b[31m", "\x7f"};
  return t;
}

std::string edge_number(Rng& rng) {
  static const char* const n[] = {"0", "1", "-1", "128", "129", "1048576", "1048577", "0x100",
                                  "0X1f", "0x", "-0", "007", "9223372036854775807",
                                  "9223372036854775808", "-9223372036854775807",
                                  "-9223372036854775808", "0xffffffffffffffff",
                                  "18446744073709551616", "1e9", "12abc"};
  return n[below(rng, std::size(n))];
}

std::string random_spec(Rng& rng, bool disk) {
  const auto& base = disk ? disk_specs() : vif_specs();
  std::string s = base[below(rng, base.size())];
  for (int i = 0, n = static_cast<int>(below(rng, 3)); i < n; ++i) {
    const std::string& t = tokens()[below(rng, tokens().size())];
    if (rng() % 3 == 0 && !s.empty()) {
      s.erase(below(rng, s.size()), 1 + below(rng, 8));
    } else {
      s.insert(below(rng, s.size() + 1), t);
    }
  }
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t nl = s.find('\n', start);
    if (nl == std::string::npos) {
      out.push_back(s.substr(start));
      break;
    }
    out.push_back(s.substr(start, nl + 1 - start));
    start = nl + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l;
  return s;
}

void mutate(std::string& s, Rng& rng) {
  const std::size_t pos = below(rng, s.size() + 1);
  switch (rng() % 13) {
    case 0:  // flip a bit
      if (!s.empty()) s[below(rng, s.size())] ^= static_cast<char>(1u << below(rng, 8));
      break;
    case 1:  // any byte
      if (!s.empty()) s[below(rng, s.size())] = static_cast<char>(rng());
      break;
    case 2:
    case 3:  // a token
      s.insert(pos, tokens()[below(rng, tokens().size())]);
      break;
    case 4:  // delete a range
      if (!s.empty()) s.erase(below(rng, s.size()), 1 + below(rng, 16));
      break;
    case 5: {  // duplicate a line: a key set twice, or a copy in a list
      auto lines = split_lines(s);
      const std::size_t i = below(rng, lines.size());
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(below(rng, lines.size() + 1)), lines[i]);
      s = join(lines);
      break;
    }
    case 6: {  // swap two lines
      auto lines = split_lines(s);
      std::swap(lines[below(rng, lines.size())], lines[below(rng, lines.size())]);
      s = join(lines);
      break;
    }
    case 7: {  // a line of another sample
      const auto other = split_lines(bases()[below(rng, bases().size())]);
      s.insert(pos, other[below(rng, other.size())]);
      break;
    }
    case 8:  // truncate
      s.resize(pos);
      break;
    case 9: {  // a very long run, inside quotes or not
      static const std::size_t lens[] = {64, 65, 255, 4096, 70000};
      std::string run(lens[below(rng, std::size(lens))], "a9 ,='\"[\\"[below(rng, 9)]);
      if (rng() % 2) run = "'" + run + "'";
      s.insert(pos, run);
      break;
    }
    case 10: {  // a number replaced by an edge value
      std::size_t i = s.find_first_of("0123456789", pos);
      if (i == std::string::npos) i = s.find_first_of("0123456789");
      if (i == std::string::npos) break;
      std::size_t j = i;
      while (j < s.size() && std::isalnum(static_cast<unsigned char>(s[j]))) ++j;
      s.replace(i, j - i, edge_number(rng));
      break;
    }
    case 11: {  // a setting with an edge value
      static const char* const keys[] = {"memory", "maxmem", "vcpus", "name", "type", "kernel",
                                         "upcall", "on_poweroff", "disk", "vif", "vnc", "frob", "cpus"};
      const std::string key = keys[below(rng, std::size(keys))];
      std::string value;
      if (key == "disk" || key == "vif") {
        value = "[ '" + random_spec(rng, key == "disk") + "', '" + random_spec(rng, key == "disk") + "' ]";
      } else if (rng() % 2) {
        value = edge_number(rng);
      } else {
        static const char* const strs[] = {"'hvm'", "'process'", "'pv'", "''", "'-x'", "'Domain-0'",
                                           "'123'", "'vector'", "'intx'", "'restart'", "\"a\\nb\"",
                                           "'/k'", "\"\\\"\"", "'a\tb'"};
        value = strs[below(rng, std::size(strs))];
      }
      s += (rng() % 2 ? "\n" : ";") + key + " = " + value + "\n";
      break;
    }
    default: {  // splice the tail of another sample in
      const std::string& o = bases()[below(rng, bases().size())];
      s = s.substr(0, pos) + o.substr(below(rng, o.size() + 1));
      break;
    }
  }
}

// ---- oracles -----------------------------------------------------------------------------------

bool one_printable_line(std::string_view m) {
  for (const char c : m) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

int lines_in(std::string_view text) {
  return 1 + static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// "t.cfg:LINE: rest" → LINE and rest; "t.cfg: rest" → 0 and rest; anything else → -1.
int message_line(std::string_view m, std::string_view* rest) {
  if (!m.starts_with(kSource) || !m.substr(kSource.size()).starts_with(":")) return -1;
  m.remove_prefix(kSource.size() + 1);
  if (m.starts_with(" ")) {
    *rest = m.substr(1);
    return 0;
  }
  int line = 0;
  const auto [p, ec] = std::from_chars(m.data(), m.data() + m.size(), line);
  if (ec != std::errc() || line <= 0 || p == m.data() || m[0] == '+' || m[0] == '-') return -1;
  m.remove_prefix(static_cast<std::size_t>(p - m.data()));
  if (!m.starts_with(": ")) return -1;
  *rest = m.substr(2);
  return line;
}

// A string in xl syntax, with every escape the lexer knows (so the round trip exercises them).
std::string quote(std::string_view s) {
  std::string o = "\"";
  for (const char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '"' || c == '\\') o += std::string("\\") + c;
    else o += c;
  }
  return o + "\"";
}

std::string to_xl(const std::vector<XlEntry>& es) {
  std::string out;
  for (const XlEntry& e : es) {
    out += e.key + " = ";
    if (e.value.is_int()) {
      out += std::to_string(std::get<std::int64_t>(e.value.v));
    } else if (e.value.is_string()) {
      out += quote(std::get<std::string>(e.value.v));
    } else {
      out += "[";
      for (const auto& item : std::get<std::vector<std::string>>(e.value.v)) out += " " + quote(item) + ",";
      out += " ]";
    }
    out += "\n";
  }
  return out;
}

// Whether line `line` (1-based) of `text` sets `key`: the key as a whole word, then blanks, '='.
bool line_sets(std::string_view text, int line, const std::string& key) {
  for (int l = 1; l < line; ++l) {
    const auto nl = text.find('\n');
    if (nl == std::string_view::npos) return false;
    text.remove_prefix(nl + 1);
  }
  text = text.substr(0, text.find('\n'));
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t pos = text.find(key); pos != std::string_view::npos; pos = text.find(key, pos + 1)) {
    if (pos > 0 && word(text[pos - 1])) continue;
    std::size_t i = pos + key.size();
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) ++i;
    if (i < text.size() && text[i] == '=') return true;
  }
  return false;
}

bool same_entries(const std::vector<XlEntry>& a, const std::vector<XlEntry>& b, bool lines) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].key != b[i].key || a[i].value.v != b[i].value.v) return false;
    if (lines && a[i].line != b[i].line) return false;
  }
  return true;
}

void expect_vdev_consistent(const Vdev& v) {
  const auto again = parse_vdev(v.name);
  ASSERT_TRUE(again) << v.name;
  EXPECT_EQ(again->devid, v.devid) << v.name;
  EXPECT_EQ(again->disk, v.disk) << v.name;
  EXPECT_EQ(again->partition, v.partition) << v.name;
  if (v.name.starts_with("xvd")) {
    // xen-vbd-interface(7): the id encodes the disk and the partition, and names them back.
    EXPECT_EQ(xvd_name(v.devid), v.name) << v.devid;
    if ((v.devid >> 8) == 202) {
      EXPECT_LT(v.disk, 16u);
      EXPECT_LT(v.partition, 16u);
      EXPECT_EQ(v.devid, (202u << 8) | (v.disk << 4) | v.partition);
    } else {
      EXPECT_EQ(v.devid, (1u << 28) | (v.disk << 8) | v.partition) << v.name;
      EXPECT_TRUE(v.disk >= 16 || v.partition >= 16) << v.name << ": has a short id";
      EXPECT_LT(v.partition, 256u);
    }
  } else {
    EXPECT_FALSE(xvd_name(v.devid).has_value()) << v.name;  // hd/sd ids are not xvd ids
  }
}

void expect_mac_ok(const Mac& m) {
  EXPECT_EQ(m.bytes[0] & 1, 0) << m.str();
  EXPECT_FALSE(m == Mac{});
  EXPECT_EQ(parse_mac(m.str()), m);
}

void expect_ip_ok(const Ipv4Cidr& ip) {
  EXPECT_GE(ip.prefix, 1u);
  EXPECT_LE(ip.prefix, 30u);
  const std::uint32_t host_mask = ~(~0u << (32 - ip.prefix));
  EXPECT_NE(ip.addr & host_mask, 0u) << ip.str();
  EXPECT_NE(ip.addr & host_mask, host_mask) << ip.str();
  const auto again = parse_ipv4_cidr(ip.str());
  ASSERT_TRUE(again) << ip.str();
  EXPECT_EQ(again->addr, ip.addr);
  EXPECT_EQ(again->prefix, ip.prefix);
}

void expect_rate_ok(const Rate& r) {
  EXPECT_GE(r.interval_us, 1u);
  EXPECT_LE(r.interval_us, 10'000'000u);
  EXPECT_GE(r.bytes_per_interval, 1u);
}

void expect_disk_ok(const DiskSpec& d) {
  EXPECT_FALSE(d.target.empty());
  EXPECT_EQ(d.format, "raw");
  expect_vdev_consistent(d.vdev);
}

void expect_vif_ok(const VifSpec& v) {
  if (v.mac) expect_mac_ok(*v.mac);
  if (v.ip) expect_ip_ok(*v.ip);
  if (v.rate) expect_rate_ok(*v.rate);
  if (v.mtu) {
    EXPECT_GE(*v.mtu, 68u);
    EXPECT_LE(*v.mtu, 65535u);
  }
  EXPECT_LE(v.vifname.size(), 15u);
  if (v.queues) {
    EXPECT_GE(*v.queues, 1u);
    EXPECT_LE(*v.queues, 64u);
  }
}

// What domain_config.h promises of a configuration that parsed.
void expect_valid(const DomainConfig& c) {
  EXPECT_TRUE(valid_domain_name(c.name)) << c.name;
  EXPECT_GE(c.memory_mib, 1u);
  EXPECT_LE(c.memory_mib, 1u << 20);
  EXPECT_GE(c.maxmem_mib, c.memory_mib);
  EXPECT_LE(c.maxmem_mib, 1u << 20);
  EXPECT_GE(c.vcpus, 1u);
  EXPECT_LE(c.vcpus, 128u);
  EXPECT_LE(c.vcpu_affinity.size(), c.vcpus) << "a CPU list for a vCPU the domain does not have";
  for (const auto& l : c.vcpu_affinity) EXPECT_FALSE(l.empty()) << "a placement on no CPU";
  if (c.type != DomainType::hvm) {
    EXPECT_TRUE(c.vcpu_affinity.empty()) << "a process domain placed";
  }
  if (c.cpu_weight) {
    EXPECT_GE(*c.cpu_weight, 1u);
    EXPECT_LE(*c.cpu_weight, 65535u);
  }
  if (c.cap) {
    EXPECT_LE(*c.cap, 102400u);
  }
  if (c.type == DomainType::hvm) {
    EXPECT_FALSE(c.kernel.empty());
  } else {
    EXPECT_TRUE(c.kernel.empty());
    EXPECT_TRUE(c.ramdisk.empty());
    EXPECT_EQ(c.maxmem_mib, c.memory_mib);
  }
  std::set<std::uint32_t> devids;
  for (const DiskSpec& d : c.disks) {
    expect_disk_ok(d);
    EXPECT_TRUE(devids.insert(d.vdev.devid).second) << d.vdev.name << " twice";
  }
  std::set<std::string> macs;
  for (const VifSpec& v : c.vifs) {
    expect_vif_ok(v);
    if (v.mac) {
      EXPECT_TRUE(macs.insert(v.mac->str()).second) << v.mac->str() << " twice";
    }
  }
  for (const std::string& w : c.warnings) {
    std::string_view rest;
    EXPECT_GT(message_line(w, &rest), 0) << w;
    EXPECT_TRUE(one_printable_line(w)) << w;
  }
}

// Everything a DomainConfig says, as text; `all`: also what xl syntax cannot give back exactly
// (warnings of ignored keys, rates).
std::string describe(const DomainConfig& c, bool all) {
  std::string s = c.name + "|" + std::to_string(static_cast<int>(c.type)) + "|" +
                  std::to_string(c.memory_mib) + "|" + std::to_string(c.maxmem_mib) + "|" +
                  std::to_string(c.vcpus) + "|" + c.kernel + "|" + c.ramdisk + "|" + c.extra + "|" +
                  std::to_string(static_cast<int>(c.upcall)) + to_string(c.on_poweroff) +
                  to_string(c.on_reboot) + to_string(c.on_crash);
  for (const auto& l : c.vcpu_affinity) s += "|cpus " + kvm::format_cpu_list(l);
  if (c.cpu_weight) s += "|cpu_weight " + std::to_string(*c.cpu_weight);
  if (c.cap) s += "|cap " + std::to_string(*c.cap);
  for (const DiskSpec& d : c.disks) {
    s += "|disk " + d.target + "," + d.format + "," + std::to_string(d.vdev.devid) + "," +
         d.vdev.name + "," + std::to_string(d.vdev.disk) + "," + std::to_string(d.vdev.partition) +
         (d.access == Access::rw ? ",rw" : ",ro") + (d.discard ? "" : ",no-discard");
  }
  for (const VifSpec& v : c.vifs) {
    s += "|vif " + (v.mac ? v.mac->str() : "-") + "," + (v.ip ? v.ip->str() : "-") + "," + v.bridge +
         "," + v.vifname + "," + (v.mtu ? std::to_string(*v.mtu) : "-") + "," +
         (v.queues ? std::to_string(*v.queues) : "-");
    if (all && v.rate) s += "," + std::to_string(v.rate->bytes_per_interval) + "/" + std::to_string(v.rate->interval_us);
  }
  if (all) {
    for (const auto& w : c.warnings) s += "|" + w;
  }
  return s;
}

// A parsed configuration written back in xl syntax (rates left out: see describe()).
std::string to_xl(const DomainConfig& c) {
  std::string s = "name = " + quote(c.name) + "\ntype = " + (c.type == DomainType::hvm ? "'hvm'" : "'process'") +
                  "\nmemory = " + std::to_string(c.memory_mib) + "\nvcpus = " + std::to_string(c.vcpus) + "\n";
  if (c.type == DomainType::hvm) s += "maxmem = " + std::to_string(c.maxmem_mib) + "\n";
  if (!c.kernel.empty()) s += "kernel = " + quote(c.kernel) + "\n";
  if (!c.ramdisk.empty()) s += "ramdisk = " + quote(c.ramdisk) + "\n";
  if (c.type == DomainType::hvm) {  // a process domain refuses them
    s += "extra = " + quote(c.extra) + "\n";
    static const char* const upcalls[] = {"vector", "callback", "intx"};
    s += std::string("upcall = '") + upcalls[static_cast<int>(c.upcall)] + "'\n";
    if (!c.vcpu_affinity.empty()) {
      s += "cpus = [";
      for (const auto& l : c.vcpu_affinity) s += " '" + kvm::format_cpu_list(l) + "',";
      s += " ]\n";
    }
  }
  if (c.cpu_weight) s += "cpu_weight = " + std::to_string(*c.cpu_weight) + "\n";
  if (c.cap) s += "cap = " + std::to_string(*c.cap) + "\n";
  s += std::string("on_poweroff = '") + to_string(c.on_poweroff) + "'\non_reboot = '" + to_string(c.on_reboot) +
       "'\non_crash = '" + to_string(c.on_crash) + "'\n";
  s += "disk = [";
  for (const DiskSpec& d : c.disks) {
    s += " " + quote("format=" + d.format + ", vdev=" + d.vdev.name +
                     (d.access == Access::rw ? ", access=rw" : ", access=ro") + (d.discard ? "" : ", no-discard") +
                     ", target=" + d.target) + ",";
  }
  s += " ]\nvif = [";
  for (const VifSpec& v : c.vifs) {
    std::string spec = "model=vif";
    if (v.mac) spec += ", mac=" + v.mac->str();
    if (v.ip) spec += ", ip=" + v.ip->str();
    if (!v.bridge.empty()) spec += ", bridge=" + v.bridge;
    if (!v.vifname.empty()) spec += ", vifname=" + v.vifname;
    if (v.mtu) spec += ", mtu=" + std::to_string(*v.mtu);
    if (v.queues) spec += ", queues=" + std::to_string(*v.queues);
    s += " " + quote(spec) + ",";
  }
  return s + " ]\n";
}

struct Outcome {
  bool xl_ok = false;
  bool domain_ok = false;
};

// Every invariant on one text. Returns what happened (for the coverage checks).
Outcome check_text(const std::string& text) {
  Outcome out;
  std::vector<XlEntry> entries;
  std::string xl_error;
  try {
    entries = parse_xl(text, kSource);
    out.xl_ok = true;
  } catch (const ConfigError& e) {
    xl_error = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "parse_xl threw something other than ConfigError: " << e.what();
    return out;
  }

  if (out.xl_ok) {
    int prev = 0;
    std::set<std::string> keys;
    for (const XlEntry& e : entries) {
      EXPECT_GE(e.line, std::max(prev, 1)) << e.key;
      EXPECT_LE(e.line, lines_in(text)) << e.key;
      EXPECT_TRUE(line_sets(text, e.line, e.key)) << "'" << e.key << "' is not set on line " << e.line;
      prev = e.line;
      EXPECT_TRUE(keys.insert(e.key).second) << "'" << e.key << "' returned twice";
      EXPECT_FALSE(e.key.empty());
      EXPECT_FALSE(std::isdigit(static_cast<unsigned char>(e.key[0]))) << e.key;
      for (const char c : e.key) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_') << e.key;
    }
    EXPECT_TRUE(same_entries(parse_xl(text, kSource), entries, true)) << "parse_xl is not deterministic";
    const std::string back = to_xl(entries);
    try {
      EXPECT_TRUE(same_entries(parse_xl(back, kSource), entries, false)) << "round trip through:\n" << back;
    } catch (const ConfigError& e) {
      ADD_FAILURE() << "entries written back do not parse: " << e.what() << "\n" << back;
    }
  } else {
    EXPECT_TRUE(one_printable_line(xl_error)) << "not one printable line: " << testing::PrintToString(xl_error);
    std::string_view rest;
    const int line = message_line(xl_error, &rest);
    EXPECT_GE(line, 1) << "parse_xl's error does not name the line: " << xl_error;
    EXPECT_LE(line, lines_in(text)) << xl_error;
  }

  DomainConfig c;
  std::string domain_error;
  try {
    c = parse_domain_config(text, kSource, false);
    out.domain_ok = true;
  } catch (const ConfigError& e) {
    domain_error = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "parse_domain_config threw something other than ConfigError: " << e.what();
    return out;
  }
  if (!out.xl_ok) {
    EXPECT_FALSE(out.domain_ok) << "parse_domain_config accepted what parse_xl refuses: " << xl_error;
    EXPECT_EQ(domain_error, xl_error);
    return out;
  }
  if (!out.domain_ok) {
    EXPECT_TRUE(one_printable_line(domain_error)) << "not one printable line: "
                                                  << testing::PrintToString(domain_error);
    std::string_view rest;
    const int line = message_line(domain_error, &rest);
    EXPECT_GE(line, 0) << "the error does not name the file: " << domain_error;
    if (line > 0) {
      // "t.cfg:LINE: 'KEY': why": KEY was set on LINE.
      bool found = false;
      for (const XlEntry& e : entries) found |= e.line == line && rest.starts_with("'" + e.key + "': ");
      EXPECT_TRUE(found) << "the error names no setting of that line: " << domain_error;
    }
    return out;
  }
  expect_valid(c);
  try {
    EXPECT_EQ(describe(parse_domain_config(text, kSource, false), true), describe(c, true))
        << "parse_domain_config is not deterministic";
    const std::string back = to_xl(c);
    try {
      EXPECT_EQ(describe(parse_domain_config(back, kSource, false), false), describe(c, false)) << back;
    } catch (const ConfigError& e) {
      ADD_FAILURE() << "the configuration written back does not parse: " << e.what() << "\n" << back;
    }
  } catch (const ConfigError& e) {
    ADD_FAILURE() << "the second parse failed: " << e.what();
  }
  return out;
}

std::string show(const std::string& text) {
  return text.size() <= 2000 ? testing::PrintToString(text)
                             : testing::PrintToString(text.substr(0, 2000)) + "... (" + std::to_string(text.size()) + " bytes)";
}

// ---- the tests ---------------------------------------------------------------------------------

TEST(ConfigFuzz, TheSamplesAreValidConfigurations) {
  for (const std::string& s : samples()) {
    SCOPED_TRACE(s);
    const Outcome o = check_text(s);
    EXPECT_TRUE(o.domain_ok);
  }
}

TEST(ConfigFuzz, MutatedConfigurationsParseValidOrFailWithAPositionedError) {
  const auto [first, last] = fuzz_seeds(20000);
  const std::uint64_t n = last - first + 1;
  std::uint64_t ok = 0, failed = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed);
    std::string text = bases()[below(rng, bases().size())];
    for (int i = 0, m = 1 + static_cast<int>(below(rng, 3)); i < m; ++i) mutate(text, rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", text " + show(text));
    const Outcome o = check_text(text);
    (o.domain_ok ? ok : failed)++;
    if (HasFailure()) break;
  }
  // Not a check of the parser: that the mutations reach both sides of it.
  if (HasFailure() || n < 1000) return;
  EXPECT_GT(ok, n / 20) << "few mutated configurations parsed: the checks of valid ones ran rarely";
  EXPECT_GT(failed, n / 2);
}

TEST(ConfigFuzz, RandomBytes) {
  const auto [first, last] = fuzz_seeds(20000);
  static const std::string alphabet = "abcdemnrstxvy_019 \t\r\n\"'[],;=#\\-@/:.";
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed * 7919);
    std::string text(below(rng, 300), '\0');
    const bool any = rng() % 2 == 0;
    for (char& c : text) c = any ? static_cast<char>(rng()) : alphabet[below(rng, alphabet.size())];
    SCOPED_TRACE("seed " + std::to_string(seed) + ", text " + show(text));
    check_text(text);
    if (HasFailure()) break;
  }
}

TEST(ConfigFuzz, EveryPrefixOfAValidConfigurationParsesOrFailsWithAPositionedError) {
  for (const std::string& s : samples()) {
    const auto full = parse_xl(s, kSource);
    for (std::size_t n = 0; n <= s.size(); ++n) {
      const std::string prefix = s.substr(0, n);
      SCOPED_TRACE("prefix " + show(prefix));
      const Outcome o = check_text(prefix);
      if (o.xl_ok) {
        // The entries it gives are the sample's own; only the last one may be cut short (an
        // integer's digits) — its key and line are the sample's.
        const auto es = parse_xl(prefix, kSource);
        ASSERT_LE(es.size(), full.size());
        for (std::size_t i = 0; i < es.size(); ++i) {
          EXPECT_EQ(es[i].key, full[i].key);
          EXPECT_EQ(es[i].line, full[i].line);
          if (i + 1 < es.size() || !es[i].value.is_int()) {
            EXPECT_TRUE(es[i].value.v == full[i].value.v) << es[i].key;
          }
        }
      }
      if (HasFailure()) return;
    }
  }
}

// ---- the device-spec helpers ---------------------------------------------------------------------

// parse_memory_kib as documented: digits (≤ 19 of them) and one optional unit b/k/m/g/t (MiB
// without), in KiB; nullopt when the value does not fit in 64 bits.
std::optional<std::uint64_t> ref_memory_kib(std::string_view t) {
  std::size_t d = 0;
  while (d < t.size() && t[d] >= '0' && t[d] <= '9') ++d;
  if (d == 0 || d > 19 || t.size() - d > 1) return std::nullopt;
  U128 v = 0;
  for (std::size_t i = 0; i < d; ++i) v = v * 10 + static_cast<unsigned>(t[i] - '0');
  const char u = d < t.size() ? static_cast<char>(t[d] | 0x20) : 'm';
  U128 kib;
  switch (u) {
    case 'b': kib = v / 1024; break;
    case 'k': kib = v; break;
    case 'm': kib = v << 10; break;
    case 'g': kib = v << 20; break;
    case 't': kib = v << 30; break;
    default: return std::nullopt;
  }
  if (kib > UINT64_MAX) return std::nullopt;
  return static_cast<std::uint64_t>(kib);
}

template <class T>
std::optional<T> digits_only(std::string_view s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  T v{};
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// parse_rate as xl's syntax means it: NUM{,K,M,G}{b,B}/s[@NUM{s,ms,us}], 1 ≤ NUM ≤ 2^40, an
// interval of 1 µs..10 s, at least one byte per interval — computed exactly, and nullopt where
// bytes per second or bytes per interval do not fit in 64 bits (rather than a wrapped value).
std::optional<Rate> ref_rate(std::string_view s) {
  const auto at = s.find('@');
  std::string_view amount = s.substr(0, at);
  if (!amount.ends_with("/s")) return std::nullopt;
  amount.remove_suffix(2);
  if (amount.empty()) return std::nullopt;
  const char unit = amount.back();
  if (unit != 'b' && unit != 'B') return std::nullopt;
  amount.remove_suffix(1);
  U128 mult = 1;
  if (!amount.empty() && (amount.back() == 'K' || amount.back() == 'M' || amount.back() == 'G')) {
    mult = amount.back() == 'K' ? 1000 : amount.back() == 'M' ? 1000000 : 1000000000;
    amount.remove_suffix(1);
  }
  const auto n = digits_only<std::uint64_t>(amount);
  if (!n || *n == 0 || *n > (std::uint64_t{1} << 40)) return std::nullopt;
  const U128 per_s_raw = *n * mult;
  if (per_s_raw > UINT64_MAX) return std::nullopt;
  const U128 per_s = unit == 'b' ? per_s_raw / 8 : per_s_raw;
  Rate r;
  if (at != std::string_view::npos) {
    std::string_view iv = s.substr(at + 1);
    U128 scale = 0;
    if (iv.ends_with("us")) { scale = 1; iv.remove_suffix(2); }
    else if (iv.ends_with("ms")) { scale = 1000; iv.remove_suffix(2); }
    else if (iv.ends_with("s")) { scale = 1000000; iv.remove_suffix(1); }
    const auto v = digits_only<std::uint64_t>(iv);
    if (scale == 0 || !v || *v == 0 || *v * scale > 10'000'000) return std::nullopt;
    r.interval_us = static_cast<std::uint64_t>(*v * scale);
  }
  const U128 bpi = per_s * r.interval_us / 1000000;
  if (bpi == 0 || bpi > UINT64_MAX) return std::nullopt;
  r.bytes_per_interval = static_cast<std::uint64_t>(bpi);
  return r;
}

std::string random_rate(Rng& rng) {
  static const char* const nums[] = {"1", "10", "100", "7", "1000000", "1099511627776", "0", "07",
                                     "1099511627777", "18446744073709551615", "18446744073709551616",
                                     "999999999999", "", "-1", "+1"};
  static const char* const mults[] = {"", "K", "M", "G", "", "K", "M", "G", "T", "k"};
  static const char* const units[] = {"b", "B", "b", "B", "b", "B", "", "x"};
  static const char* const ivs[] = {"", "@20ms", "@1us", "@10s", "", "@20ms", "@100us", "@11s", "@0ms", "@10000000us",
                                    "@10000001us", "@18446744073709552ms", "@18446744073709551616us",
                                    "@9223372036854776s", "@1", "@ms", "@5m", "@1s@1s"};
  std::string s = std::string(nums[below(rng, std::size(nums))]) + mults[below(rng, std::size(mults))] +
                  units[below(rng, std::size(units))] + (rng() % 8 ? "/s" : "/m") + ivs[below(rng, std::size(ivs))];
  if (rng() % 4 == 0) mutate(s, rng);
  return s;
}

std::string random_vdev_name(Rng& rng) {
  static const char* const prefixes[] = {"xvd", "hd", "sd", "d", "x", "", "xvdd", "vd"};
  std::string s = prefixes[below(rng, std::size(prefixes))];
  if (s == "d") {
    s += std::to_string(rng() % 3 == 0 ? rng() % 2000000 : rng() % 40);
    if (rng() % 2) s += "p" + std::to_string(rng() % 300);
  } else {
    for (std::size_t i = 0, n = below(rng, 6); i < n; ++i) s += static_cast<char>('a' + below(rng, 26));
    if (rng() % 4 == 0) s += "zzzz";
    if (rng() % 2) s += std::to_string(rng() % 4 == 0 ? rng() : rng() % 300);
  }
  if (rng() % 8 == 0) mutate(s, rng);
  return s;
}

TEST(DeviceSpecFuzz, MutatedDiskAndVifSpecs) {
  const auto [first, last] = fuzz_seeds(20000);
  const std::uint64_t n = last - first + 1;
  std::uint64_t disks_ok = 0, vifs_ok = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed * 104729);
    const bool disk = seed % 2 == 0;
    const std::string spec = random_spec(rng, disk);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", spec " + show(spec));
    try {
      if (disk) {
        expect_disk_ok(parse_disk_spec(spec));
        ++disks_ok;
      } else {
        expect_vif_ok(parse_vif_spec(spec));
        ++vifs_ok;
      }
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(one_printable_line(m)) << "not one printable line: " << testing::PrintToString(m);
      EXPECT_TRUE(m.starts_with(disk ? "disk spec '" : "vif spec '")) << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw something other than ConfigError: " << e.what();
    }
    if (HasFailure()) return;
  }
  if (n < 1000) return;  // too few seeds to say
  EXPECT_GT(disks_ok, n / 40);
  EXPECT_GT(vifs_ok, n / 40);
}

TEST(DeviceSpecFuzz, VdevNamesAndIdsAreABijection) {
  const auto [first, last] = fuzz_seeds(20000);
  const std::uint64_t n = last - first + 1;
  std::uint64_t ok = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed * 15485863);
    const std::string name = random_vdev_name(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", name " + show(name));
    if (const auto v = parse_vdev(name)) {
      ++ok;
      expect_vdev_consistent(*v);
    }
    // Any id: a name it gives back parses to that id.
    const auto id = static_cast<std::uint32_t>(rng() % 3 == 0 ? rng() : (rng() % 2 ? (202u << 8) | below(rng, 256)
                                                                                  : (1u << 28) | below(rng, 1u << 28)));
    if (const auto nm = xvd_name(id)) {
      const auto back = parse_vdev(*nm);
      ASSERT_TRUE(back) << *nm;
      EXPECT_EQ(back->devid, id) << *nm;
    }
    if (HasFailure()) return;
  }
  if (n < 1000) return;  // too few seeds to say
  EXPECT_GT(ok, n / 10);
}

TEST(DeviceSpecFuzz, MemorySizesAndRatesAgreeWithExactArithmetic) {
  const auto [first, last] = fuzz_seeds(20000);
  const std::uint64_t n = last - first + 1;
  std::uint64_t rates_ok = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed * 32452843);
    std::string mem = std::to_string(rng() >> below(rng, 64));
    if (rng() % 2) mem += "bkmgtBKMGTxs"[below(rng, 12)];
    if (rng() % 8 == 0) mutate(mem, rng);
    const std::string rate = random_rate(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", memory " + show(mem) + ", rate " + show(rate));
    EXPECT_EQ(parse_memory_kib(mem), ref_memory_kib(mem));
    const auto got = parse_rate(rate);
    const auto want = ref_rate(rate);
    EXPECT_EQ(got.has_value(), want.has_value());
    if (got && want) {
      ++rates_ok;
      EXPECT_EQ(got->bytes_per_interval, want->bytes_per_interval);
      EXPECT_EQ(got->interval_us, want->interval_us);
    }
    if (HasFailure()) return;
  }
  if (n < 1000) return;  // too few seeds to say
  EXPECT_GT(rates_ok, n / 50);
}

}  // namespace
}  // namespace xpv::config
