// Device parsing and printing.
#include "tensor/device.h"

#include "tensor/error.h"

namespace ddplab {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    type = DeviceType::CPU;
    index = 0;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (spec.size() > 4) {
      DDP_CHECK(spec[4] == ':' && spec.size() > 5,
                "bad device '" << spec << "' (use cpu, cuda or cuda:N)");
      try {
        index = std::stoi(spec.substr(5));
      } catch (const std::exception&) {
        DDP_FAIL("bad device index in '" << spec << "'");
      }
    }
    return;
  }
  DDP_FAIL("bad device '" << spec << "' (use cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace ddplab
