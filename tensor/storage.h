// Storage: one block of memory on one device, shared by every view of it.
#pragma once

#include <cstddef>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace ddplab {

class Storage {
 public:
  Storage() = default;
  Storage(size_t nbytes, Device device);               // fresh memory from the device's allocator
  Storage(DataPtr data, size_t nbytes, Device device)  // adopt memory (pinned, external)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}

  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || nbytes_ == 0; }
  // How many Storage objects (tensors and their views) share this memory.
  long use_count() const { return data_.use_count(); }

 private:
  DataPtr data_;
  size_t nbytes_ = 0;
  Device device_;
};

}  // namespace ddplab
