// libFuzzer target (clang only, not in CI): arbitrary bytes through the framer and, for each
// complete message, the argument splitter and a Store with a dom0 and a dom5 connection.
#include <cstddef>
#include <cstdint>

#include "xpv/xenbus/store.h"
#include "xpv/xenbus/wire.h"

namespace {
struct NullSink : xpv::xenbus::Sink {
  void deliver(const xpv::xenbus::wire::Header&, std::string_view) override {}
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace xpv::xenbus;
  NullSink sink;
  Store store;
  ConnId ids[2] = {store.connect(0, sink), store.connect(5, sink)};
  wire::Framer f;
  std::size_t pos = 0;
  int which = 0;
  while (pos < size) {
    std::size_t used = f.feed(std::span<const std::uint8_t>(data + pos, size - pos));
    pos += used;
    if (f.violated()) break;
    if (f.ready()) {
      store.handle(ids[which++ & 1], f.header(), f.payload());
      f.consume();
    } else if (used == 0) {
      break;
    }
  }
  return 0;
}
