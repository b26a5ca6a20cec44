// Helper for check_safetensors_interop.py: `write PATH` writes a fixed set of tensors (values
// 0..n-1 in every dtype); `roundtrip IN OUT` loads IN with ddplab and writes it back to OUT.
#include <cstdio>
#include <exception>
#include <string>

#include "nn/safetensors.h"
#include "tensor/ops.h"

using namespace ddplab;

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 3) {
      std::vector<std::pair<std::string, Tensor>> ts;
      for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8}) {
        ts.emplace_back(std::string("t_") + dtype_name(t),
                        ops::reshape(ops::to(ops::arange(0, 12), t), {3, 4}));
      }
      ts.emplace_back("t_bool", ops::gt(ops::arange(0, 5), 1.5));
      ts.emplace_back("scalar", ops::scalar_tensor(2.5));
      nn::save_safetensors(argv[2], ts, {{"writer", "ddplab"}});
      return 0;
    }
    if (mode == "roundtrip" && argc == 4) {
      auto m = nn::load_safetensors(argv[2]);
      std::vector<std::pair<std::string, Tensor>> ts(m.begin(), m.end());
      nn::save_safetensors(argv[3], ts);
      return 0;
    }
    std::fprintf(stderr, "usage: st_interop write PATH | roundtrip IN OUT\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
