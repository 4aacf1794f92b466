// The `image` subcommand of the `xpv` CLI: `xpv image build` and `xpv image show`.
// main() registers it with add_command() and calls run() when selected().
#pragma once

#include <memory>

#include "xpv/image/image.h"

namespace CLI {
class App;
}

namespace xpv::image {

class Command {
 public:
  explicit Command(CLI::App& app);
  bool selected() const;
  // Prints the image directory (build) or a JSON description (show) on stdout, progress on
  // stderr. Returns the exit status; throws std::runtime_error on failure (main prints it).
  int run() const;

 private:
  CLI::App* sub_ = nullptr;
  CLI::App* build_ = nullptr;
  CLI::App* show_ = nullptr;
  BuildOptions opts_;
};

std::unique_ptr<Command> add_command(CLI::App& app);

}  // namespace xpv::image
