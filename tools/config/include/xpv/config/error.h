#pragma once

#include <stdexcept>
#include <string>

namespace xpv::config {

// Bad user input: the message names what and where ("vm.cfg:7: disk 1: unknown access 'rx'").
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace xpv::config
