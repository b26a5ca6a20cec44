// Storage allocation through the device's caching allocator; the blocked mark (Note [Blocked
// activations] in tensor/blocked.cpp).
#include "tensor/storage.h"

#include "tensor/error.h"

namespace ddplab {

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

void Storage::mark_blocked(const BlockedDims& dims) {
  DDP_CHECK(device_.is_cpu(), "blocked layout: only CPU memory can be marked blocked");
  DDP_CHECK(dims.n * dims.c * dims.h * dims.w * static_cast<int64_t>(dims.element_size) ==
                static_cast<int64_t>(nbytes_),
            "blocked layout: the dims do not cover the storage's " << nbytes_ << " bytes");
  if (!layout_) layout_ = std::make_shared<Layout>();
  std::lock_guard<std::mutex> lock(layout_->mutex);
  layout_->dims = dims;
  layout_->blocked.store(true, std::memory_order_release);
}

const BlockedDims* Storage::blocked() const {
  if (!layout_ || !layout_->blocked.load(std::memory_order_acquire)) return nullptr;
  return &layout_->dims;
}

void Storage::ensure_strided() const {
  if (!layout_ || !layout_->blocked.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(layout_->mutex);
  if (!layout_->blocked.load(std::memory_order_relaxed)) return;  // another thread did it
  blocked_to_nhwc_in_place(layout_->dims, data_.get());
  layout_->blocked.store(false, std::memory_order_release);
}

}  // namespace ddplab
