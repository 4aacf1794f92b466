// Whether this test binary runs under ASan or UBSan (the CI's second build). Out of fds, the
// sanitizers cannot work (UBSan's vptr check opens a pipe to look at memory, and reports an
// error for what it cannot look at), so tests that exhaust the fd table skip those steps there.
#pragma once

namespace xpv::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace xpv::test
