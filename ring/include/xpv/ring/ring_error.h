// RingError — what a shared-ring or byte-ring operation can report.
//
// Two kinds, told apart by is_protocol_error():
//  - flow control (`full`, `empty`): normal, the caller waits for the peer;
//  - setup refusals (`too_small`, `misaligned`, `bad_size`): the host handed the ring a bad span;
//  - protocol violations (`bad_producer_index`, `bad_consumer_index`): the PEER wrote an index that
//    no well-behaved peer can write. DESIGN.md §5: that device is disabled (sticky). The shared-ring
//    objects make this sticky themselves: once seen, every later call returns the same error.
#pragma once

#include <cstdint>

namespace xpv::ring {

enum class RingError : std::uint8_t {
  too_small,           // span shorter than the ring needs (header + one entry, or the struct)
  misaligned,          // span start not aligned for the header / entries / indexes
  bad_size,            // byte-ring data area is not a power of two (or above 2^31)
  bad_producer_index,  // peer's producer index: prod - cons > what can be outstanding
  bad_consumer_index,  // peer's consumer index: prod - cons > ring size (byte rings, producer side)
  full,                // no free slot to produce into (flow control)
  empty,               // nothing to consume (flow control)
};

const char* to_string(RingError e) noexcept;

constexpr bool is_protocol_error(RingError e) noexcept {
  return e == RingError::bad_producer_index || e == RingError::bad_consumer_index;
}

}  // namespace xpv::ring
