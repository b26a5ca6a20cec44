// Storage: one block of memory on one device, shared by every view of it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace ddplab {

// The bytes of a 4-D [N, C, H, W] tensor in oneDNN's blocked layout nChw<B>c (Note [Blocked
// activations] in tensor/blocked.cpp): [N][C/B][H][W][B], B channels of one pixel side by side
// within each group of B channels.
struct BlockedDims {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t block = 0;        // B
  size_t element_size = 0;  // bytes per value
};

// Rearranges the bytes at `data`, laid out as `dims` says, into NHWC, in place. Declared here,
// with the layout it undoes, so that Storage (below tensors and their ops) can call it; defined
// in tensor/blocked.cpp beside the other direction.
void blocked_to_nhwc_in_place(const BlockedDims& dims, void* data);

class Storage {
 public:
  Storage() = default;
  Storage(size_t nbytes, Device device);               // fresh memory from the device's allocator
  Storage(DataPtr data, size_t nbytes, Device device)  // adopt memory (pinned, external)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}

  // The memory as it lies. Tensor::raw_data() first brings blocked bytes back to the layout the
  // tensor's strides describe (ensure_strided); only layout-aware kernels read them as they are.
  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || nbytes_ == 0; }
  // How many Storage objects (tensors and their views) share this memory.
  long use_count() const { return data_.use_count(); }

  // --- Note [Blocked activations] ---
  // Marks the bytes as a blocked tensor (every Storage sharing this memory sees the mark).
  void mark_blocked(const BlockedDims& dims);
  // The blocked layout of the bytes, or nullptr when they are laid out as the strides say.
  const BlockedDims* blocked() const;
  // Rearranges blocked bytes, in place, into the channels-last order of the tensor's strides.
  void ensure_strided() const;
  // The same memory without the mark: the bytes as they lie, for the kernels that read blocked.
  Storage as_stored() const { return {data_, nbytes_, device_}; }

 private:
  struct Layout {
    std::mutex mutex;
    std::atomic<bool> blocked{false};
    BlockedDims dims;
  };
  DataPtr data_;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<Layout> layout_;  // null unless the memory was ever marked blocked
};

}  // namespace ddplab
