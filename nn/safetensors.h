// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors):
// 8 bytes little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then
// the raw little-endian bytes. PyTorch's `safetensors.torch.load_file` opens what we write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::nn {

// Writes tensors (any device; copied to the host) in the order given, atomically (see
// write_file_atomic): a crash leaves the old file or the new one, never a half-written one.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Loads every tensor onto the CPU, and the `__metadata__` strings into `metadata` if given.
// Errors name the file and what is wrong (short header, bad JSON and its offset, offsets out of
// range, unknown dtype); no input, however crafted, reads out of bounds.
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes the concatenated byte ranges `pieces` to `path` so that a crash or a full disk never
// leaves a partial file there: `path.tmp` is written and fsynced, renamed over `path`, and the
// folder fsynced. On failure the temporary file is removed, `path` is untouched, and the error
// names the path and the system's reason (errno text).
void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& pieces);
// fsyncs the folder holding `path`, so a rename or unlink in it is durable.
void fsync_parent_dir(const std::string& path);

// zlib's CRC32 of n bytes, and of a tensor's bytes as a file holds them (host, contiguous). The
// checkpoints and the state_dict files record one per tensor: a flipped bit inside tensor data
// leaves every offset of the file valid, and only a checksum tells.
uint32_t bytes_crc32(const void* data, size_t n);
uint32_t tensor_crc32(const Tensor& t);
// Checks tensor `name`, as read from a file, against `crcs`, the JSON object {name: CRC32} the
// file recorded; a missing record or another checksum fails, naming `where` (the file) and the
// tensor.
void check_tensor_crc32(const nlohmann::json& crcs, const std::string& name, const Tensor& t,
                        const std::string& where);

}  // namespace ddplab::nn
