// Where a tensor's memory lives: the CPU, or one CUDA device.
#pragma once

#include <ostream>
#include <string>

namespace ddplab {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}  // NOLINT
  // Parses "cpu", "cuda", "cuda:1".
  explicit Device(const std::string& spec);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline const Device kCPU{DeviceType::CPU, 0};
inline Device cuda(int index = 0) {
  return Device(DeviceType::CUDA, index);
}

inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

}  // namespace ddplab
