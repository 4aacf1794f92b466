// xpv::Expected<T, E> — the small result type of every noexcept hot path (vCPU loops, data-plane
// loops, guest-facing parsers). C++23's std::expected is not in g++ 12; this keeps the same
// spelling (has_value, value, error, operator*, operator->) for the subset xpv uses, so the switch
// later is mechanical. Setup/config code may throw instead and is caught at main().
#pragma once

#include <cassert>
#include <type_traits>
#include <utility>
#include <variant>

namespace xpv {

template <class E>
class Unexpected {
 public:
  constexpr explicit Unexpected(E e) : error_(std::move(e)) {}
  constexpr const E& error() const& noexcept { return error_; }
  constexpr E& error() & noexcept { return error_; }

 private:
  E error_;
};

template <class E>
Unexpected(E) -> Unexpected<E>;

// Shorthand: `return xpv::fail(Errc::bad_index);`
template <class E>
constexpr Unexpected<std::decay_t<E>> fail(E&& e) {
  return Unexpected<std::decay_t<E>>(std::forward<E>(e));
}

template <class T, class E>
class [[nodiscard]] Expected {
 public:
  using value_type = T;
  using error_type = E;

  constexpr Expected() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  constexpr Expected(const T& v) : v_(std::in_place_index<0>, v) {}           // NOLINT: implicit
  constexpr Expected(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}     // NOLINT: implicit
  template <class G>
  constexpr Expected(Unexpected<G> u) : v_(std::in_place_index<1>, E(std::move(u.error()))) {}  // NOLINT

  constexpr bool has_value() const noexcept { return v_.index() == 0; }
  constexpr explicit operator bool() const noexcept { return has_value(); }

  constexpr T& value() & { assert(has_value()); return std::get<0>(v_); }
  constexpr const T& value() const& { assert(has_value()); return std::get<0>(v_); }
  constexpr T&& value() && { assert(has_value()); return std::get<0>(std::move(v_)); }
  constexpr T& operator*() & { return value(); }
  constexpr const T& operator*() const& { return value(); }
  constexpr T&& operator*() && { return std::move(*this).value(); }
  constexpr T* operator->() { return &value(); }
  constexpr const T* operator->() const { return &value(); }

  constexpr const E& error() const { assert(!has_value()); return std::get<1>(v_); }

  template <class U>
  constexpr T value_or(U&& fallback) const& {
    return has_value() ? value() : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, E> v_;
};

template <class E>
class [[nodiscard]] Expected<void, E> {
 public:
  using value_type = void;
  using error_type = E;

  constexpr Expected() = default;
  template <class G>
  constexpr Expected(Unexpected<G> u) : err_(E(std::move(u.error()))), ok_(false) {}  // NOLINT

  constexpr bool has_value() const noexcept { return ok_; }
  constexpr explicit operator bool() const noexcept { return ok_; }
  constexpr const E& error() const { assert(!ok_); return err_; }

 private:
  E err_{};
  bool ok_ = true;
};

}  // namespace xpv
