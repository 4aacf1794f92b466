#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "xpv/config/device_specs.h"
#include "xpv/toolstack/disk_checks.h"
#include "xpv/toolstack/error.h"

namespace xpv::toolstack {
namespace {

struct Images {
  std::string dir;
  Images() {
    std::string t = (std::filesystem::temp_directory_path() / "xpv-disks-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp");
    dir = t;
    for (const char* n : {"a.img", "b.img"}) {
      std::ofstream(dir + "/" + n) << std::string(512, 'x');
    }
  }
  ~Images() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::string refusal(const std::string& spec, const std::vector<ExistingDisk>& disks) {
  try {
    check_new_disk("vm.cfg", config::parse_disk_spec(spec), disks);
  } catch (const ToolstackError& e) {
    return e.what();
  }
  return "";
}

TEST(DiskChecks, AnImageWrittenElsewhereIsRefusedByAnyName) {
  Images t;
  const std::string a = t.dir + "/a.img", link = t.dir + "/hard.img";
  ASSERT_EQ(::link(a.c_str(), link.c_str()), 0);
  std::filesystem::create_symlink(a, t.dir + "/sym.img");
  const std::vector<ExistingDisk> disks = {{"web1 (id 1) xvda", a, true}};
  auto want = [&](const std::string& p) { return "vm.cfg: disk xvdb: '" + p + "' is written by web1 (id 1) xvda ('" + a + "')"; };
  for (const std::string& p : {a, link, t.dir + "/sym.img", t.dir + "/./a.img"}) {
    EXPECT_EQ(refusal("vdev=xvdb, target=" + p, disks), want(p)) << p;
    EXPECT_EQ(refusal("vdev=xvdb, access=ro, target=" + p, disks), want(p))
        << p << ": a reader under another domain's writer sees a file system change beneath it";
  }
  EXPECT_EQ(refusal("vdev=xvdb, target=" + t.dir + "/b.img", disks), "") << "another file";
}

TEST(DiskChecks, AnImageReadElsewhereMayBeReadNotWritten) {
  Images t;
  const std::string a = t.dir + "/a.img";
  const std::vector<ExistingDisk> disks = {{"web1 (id 1) xvda", a, false}, {"web2 (id 2) xvdc", a, false}};
  EXPECT_EQ(refusal("vdev=xvdb, access=ro, target=" + a, disks), "");
  EXPECT_EQ(refusal("vdev=xvdb, target=" + a, disks),
            "vm.cfg: disk xvdb: '" + a + "' is read by web1 (id 1) xvda ('" + a + "'): it cannot be given writable");
}

TEST(DiskChecks, ATargetThatIsGoneMatchesNothing) {
  Images t;
  const std::string a = t.dir + "/a.img";
  // A disk whose image was removed since it was attached: no longer this file.
  EXPECT_EQ(refusal("vdev=xvdb, target=" + a, {{"web1 (id 1) xvda", t.dir + "/gone.img", true}}), "");
  EXPECT_EQ(refusal("vdev=xvdb, target=" + t.dir + "/gone.img", {{"web1 (id 1) xvda", a, true}}), "");
}

}  // namespace
}  // namespace xpv::toolstack
