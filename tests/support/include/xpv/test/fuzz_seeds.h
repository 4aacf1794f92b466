// The seeds a fuzz test (tests/fuzz/) runs: 1..XPV_FUZZ_ITERATIONS (default: the test's own), or
// XPV_FUZZ_SEED=S alone, to replay the seed a failure printed without the ones before it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <utility>

namespace xpv::test {

// A decimal number from the environment, `fallback` when unset or empty.
inline std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

// [first, last] of the seeds to run.
inline std::pair<std::uint64_t, std::uint64_t> fuzz_seeds(std::uint64_t fallback) {
  if (const std::uint64_t s = env_number("XPV_FUZZ_SEED", 0); s != 0) return {s, s};
  return {1, env_number("XPV_FUZZ_ITERATIONS", fallback)};
}

}  // namespace xpv::test
