#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/record.h"

namespace xpv::toolstack {
namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "xpv-ts-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

DomainRecord sample() {
  DomainRecord r;
  r.domid = 3;
  r.name = "web1";
  r.type = "process";
  r.memory_mib = 256;
  r.vcpus = 2;
  r.config = "/etc/xpv/web1.cfg";
  r.pid = 1234;
  r.uuid = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
  r.program = "xpv-front";
  return r;
}

TEST(Record, JsonRoundTrip) {
  EXPECT_EQ(record_from_json(record_to_json(sample())), sample());
}

TEST(Record, ACgroupAndItsSettingsRoundTripAndAreAbsentWithoutOne) {
  DomainRecord r = sample();
  EXPECT_EQ(record_to_json(r).find("cgroup"), std::string::npos) << "no cgroup, no keys";
  r.cgroup = "/sys/fs/cgroup/xpv/" + r.uuid;
  r.cpu_weight = 512;
  r.cap = 150;
  EXPECT_EQ(record_from_json(record_to_json(r)), r);
  // A record written before the keys existed reads as none, with xl's defaults.
  const auto old = record_from_json(record_to_json(sample()));
  ASSERT_TRUE(old);
  EXPECT_EQ(old->cgroup, "");
  EXPECT_EQ(old->cpu_weight, 256u);
  EXPECT_EQ(old->cap, 0u);
}

TEST(Record, BadJson) {
  EXPECT_EQ(record_from_json(""), std::nullopt);
  EXPECT_EQ(record_from_json("{\"domid\": 3}"), std::nullopt);
  EXPECT_EQ(record_from_json("{\"domid\": \"x\", \"name\": 1}"), std::nullopt);
  EXPECT_EQ(record_from_json("[1,2"), std::nullopt);
}

TEST(Record, FilesInTheDomainDir) {
  TempDir t;
  write_record(t.path, sample());
  EXPECT_EQ(read_record(t.path), sample());
  EXPECT_EQ(read_file(t.path + "/pid"), "1234\n");
  EXPECT_FALSE(std::filesystem::exists(t.path + "/domain.json.tmp"));
  EXPECT_EQ(read_record(t.path + "/nope"), std::nullopt);
}

TEST(Fs, ReadFileReadsWholeFilesUpToItsLimit) {
  TempDir t;
  EXPECT_EQ(read_file(t.path + "/absent"), std::nullopt);
  write_file_atomic(t.path + "/empty", "");
  EXPECT_EQ(read_file(t.path + "/empty"), "");
  // Longer than one read step, and a file past the 1 MiB limit gives its first MiB.
  std::string big(3 * 8192 + 17, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
  write_file_atomic(t.path + "/big", big);
  EXPECT_EQ(read_file(t.path + "/big"), big);
  std::string huge((1u << 20) + 4096, 'y');
  huge[(1u << 20) - 1] = 'z';
  write_file_atomic(t.path + "/huge", huge);
  const auto h = read_file(t.path + "/huge");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->size(), std::size_t{1} << 20);
  EXPECT_EQ(h->back(), 'z');
  // /proc files report size 0 and are read to their end all the same.
  const auto cmdline = read_file("/proc/self/cmdline");
  ASSERT_TRUE(cmdline.has_value());
  EXPECT_NE(cmdline->find("toolstack_test"), std::string::npos) << *cmdline;
}

TEST(Fs, LastLineAndMakeDirs) {
  TempDir t;
  write_file_atomic(t.path + "/log", "one\ntwo\n\n");
  EXPECT_EQ(last_line(t.path + "/log"), "two");
  EXPECT_EQ(last_line(t.path + "/absent"), "");
  make_dirs(t.path + "/a/b/c", 0700);
  EXPECT_TRUE(std::filesystem::is_directory(t.path + "/a/b/c"));
  write_file_atomic(t.path + "/file", "x");
  EXPECT_THROW(make_dirs(t.path + "/file/sub", 0700), ToolstackError);
  EXPECT_EQ(read_from(t.path + "/log", 4, 3), "two");
}

}  // namespace
}  // namespace xpv::toolstack
