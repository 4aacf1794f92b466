// Page-aligned scratch memory standing in for shared ring pages in the ring tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>

namespace xpv::ring::test {

inline constexpr std::size_t kPage = 4096;

struct PageDeleter {
  void operator()(std::uint8_t* p) const { ::operator delete[](p, std::align_val_t{kPage}); }
};

// n pages, page-aligned, filled with `fill` so that tests can see which bytes were written.
class Pages {
 public:
  explicit Pages(std::size_t n, std::uint8_t fill = 0xa5)
      : bytes_(n * kPage),
        p_(static_cast<std::uint8_t*>(::operator new[](bytes_, std::align_val_t{kPage}))) {
    std::memset(p_.get(), fill, bytes_);
  }
  std::span<std::uint8_t> span() const { return {p_.get(), bytes_}; }
  std::uint8_t* data() const { return p_.get(); }
  std::size_t size() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::unique_ptr<std::uint8_t[], PageDeleter> p_;
};

}  // namespace xpv::ring::test
