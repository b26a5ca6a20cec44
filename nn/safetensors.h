// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors):
// 8 bytes little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then
// the raw little-endian bytes. PyTorch's `safetensors.torch.load_file` opens what we write.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::nn {

// Writes tensors (any device; copied to the host) in the order given. Atomic: writes a
// temporary file and renames it over `path`, so a crash never leaves a half-written file.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Loads every tensor onto the CPU. Errors name the file and what is wrong (short header, bad
// JSON, offsets out of range, unknown dtype).
std::map<std::string, Tensor> load_safetensors(const std::string& path);

}  // namespace ddplab::nn
