// xpv::kvm::Error — the error value of every noexcept path in the VMM (loaders, builders, the vCPU
// loop): one human-readable line naming what failed and where. Setup code that may throw uses
// std::runtime_error with the same kind of line.
#pragma once

#include <string>
#include <utility>

#include "xpv/expected.h"

namespace xpv::kvm {

struct Error {
  std::string message;
};

template <class T>
using Result = Expected<T, Error>;

// `return err("bzImage: bad magic");`
inline Unexpected<Error> err(std::string message) { return Unexpected<Error>(Error{std::move(message)}); }

}  // namespace xpv::kvm
