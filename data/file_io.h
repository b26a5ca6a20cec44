// Reading dataset files: whole files into memory, gzip or not, with errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddplab::data {

// All bytes of `path`. A gzip file (by its magic bytes, whatever its name) is decompressed.
// Throws ddplab::Error naming the path when it is missing, unreadable, or a corrupt/truncated
// gzip stream.
std::vector<uint8_t> read_file(const std::string& path);

bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);
// `dir` + "/" + `name` (no doubled slash).
std::string join_path(const std::string& dir, const std::string& name);

// The first of `dir`/`names` that exists, or "" when none does.
std::string first_existing(const std::string& dir, const std::vector<std::string>& names);

// Big-endian 32-bit integer at `p` (IDX headers are big-endian).
inline uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace ddplab::data
