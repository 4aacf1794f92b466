// Parsing ldd(1) output: which shared objects a program needs on the guest's root disk.
#pragma once

#include <string>
#include <vector>

namespace xpv::image {

struct LddResult {
  std::vector<std::string> paths;    // absolute paths, in ldd's order (ld-linux included)
  std::vector<std::string> missing;  // sonames ldd reported as "not found"
};

// Lines "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "\t/lib64/ld-linux-x86-64.so.2
// (0x...)", "\tlinux-vdso.so.1 (0x...)" (no file: skipped), "\tlibx.so => not found".
LddResult parse_ldd(const std::string& text);

}  // namespace xpv::image
