// Small file helpers for run directories, pid files and logs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace xpv::toolstack {

// The whole file (at most 1 MiB), nullopt if it cannot be read.
std::optional<std::string> read_file(const std::string& path);
// Writes PATH.tmp then renames it over PATH: readers see the old or the new content, never half.
// Throws ToolstackError naming the path.
void write_file_atomic(const std::string& path, const std::string& content, unsigned mode = 0644);
// mkdir -p with `mode` for the directories it creates; throws ToolstackError naming the path.
void make_dirs(const std::string& path, unsigned mode);
// The last non-empty line of a (log) file, at most 300 characters; empty if none.
std::string last_line(const std::string& path);
// Up to `max` bytes of a file from `offset`; empty if it cannot be read.
std::string read_from(const std::string& path, std::uint64_t offset, std::size_t max);
// Size of a file, 0 if it does not exist.
std::uint64_t file_size(const std::string& path);

}  // namespace xpv::toolstack
