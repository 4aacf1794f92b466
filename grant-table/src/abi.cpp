#include "xpv/gnttab/abi.h"

namespace xpv::gnttab {

const char* to_string(Status s) noexcept {
  switch (s) {
    case Status::okay: return "okay";
    case Status::general_error: return "general error (bad flags, domid or unstable entry)";
    case Status::bad_domain: return "unknown domain";
    case Status::bad_gntref: return "bad or out-of-range grant reference";
    case Status::bad_handle: return "unknown or already released grant handle";
    case Status::bad_virt_addr: return "bad virtual address";
    case Status::bad_dev_addr: return "bad device address";
    case Status::no_device_space: return "out of mapping handles";
    case Status::permission_denied: return "permission denied";
    case Status::bad_page: return "granted frame is not in the granter's memory";
    case Status::bad_copy_arg: return "copy crosses the page boundary";
    case Status::address_too_big: return "frame number too large";
    case Status::eagain: return "operation not done, try again";
    case Status::no_space: return "out of space (grant references, frames or handles)";
  }
  return "unknown grant status";
}

}  // namespace xpv::gnttab
