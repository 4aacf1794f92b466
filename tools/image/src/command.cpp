// `xpv image build|show`: the CLI side of image.h. Runs on main's thread.
#include "xpv/image/command.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace xpv::image {

Command::Command(CLI::App& app) {
  sub_ = app.add_subcommand("image", "guest images (kernel, initramfs, ext4 root) from Debian packages");
  sub_->require_subcommand(1);
  build_ = sub_->add_subcommand("build", "build the image for the current inputs, or reuse the cached one; "
                                         "prints its directory");
  show_ = sub_->add_subcommand("show", "print the image for the current inputs (key, dir, manifest) as JSON");
  for (auto* s : {build_, show_}) {
    s->add_option("--size", opts_.size_mib, "root.ext4 size in MiB")->capture_default_str();
    s->add_option("--recipes", opts_.recipes, "recipe dir (default $XPV_IMAGE_RECIPES or frontends/guest-image)");
    s->add_option("--cache", opts_.cache, "image cache (default $XPV_IMAGE_CACHE or ~/.cache/xpv/images)");
  }
  build_->add_option("--out", opts_.out_dir, "also copy vmlinuz, initrd.cpio, root.ext4, manifest.json here");
  build_->add_flag("--force", opts_.force, "rebuild even if the cache has this image");
}

bool Command::selected() const { return sub_->parsed(); }

int Command::run() const {
  if (build_->parsed()) {
    const Image im = build(opts_);
    fmt::print("{}\n", opts_.out_dir.empty() ? im.dir : opts_.out_dir);
    return 0;
  }
  const Image im = locate(opts_);
  nlohmann::ordered_json j;
  j["key"] = im.key;
  j["dir"] = im.dir;
  j["built"] = im.built;
  j["vmlinuz"] = im.vmlinuz;
  j["initrd"] = im.initrd;
  j["root"] = im.root;
  if (im.built) {
    std::ifstream in(im.manifest);
    j["manifest"] = nlohmann::ordered_json::parse(in, nullptr, false);
  } else {
    j["manifest"] = nullptr;
  }
  fmt::print("{}\n", j.dump(2));
  return im.built ? 0 : 1;
}

std::unique_ptr<Command> add_command(CLI::App& app) { return std::make_unique<Command>(app); }

}  // namespace xpv::image
