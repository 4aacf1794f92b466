#include "xpv/ring/ring_error.h"

namespace xpv::ring {

const char* to_string(RingError e) noexcept {
  switch (e) {
    case RingError::too_small: return "shared ring memory too small";
    case RingError::misaligned: return "shared ring memory misaligned";
    case RingError::bad_size: return "byte ring size is not a power of two";
    case RingError::bad_producer_index: return "peer's producer index out of range (protocol error)";
    case RingError::bad_consumer_index: return "peer's consumer index out of range (protocol error)";
    case RingError::full: return "ring full";
    case RingError::empty: return "ring empty";
  }
  return "unknown ring error";
}

}  // namespace xpv::ring
