// The one kind of failure the toolstack reports to its user: a single line that names what went
// wrong and where ("vm.cfg:3: 'memory': must be a number", "no domain named 'web9'"). `xpv`'s
// main prints it as "xpv COMMAND: MESSAGE" and exits 1.
#pragma once

#include <stdexcept>
#include <string>

namespace xpv::toolstack {

class ToolstackError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace xpv::toolstack
