// BlockPool (see block_pool.h).
#include "tensor/block_pool.h"

#include <utility>

#include "tensor/error.h"

namespace ddplab {

BlockPool::BlockPool(Device device, size_t large_step, RawMemory raw)
    : device_(device), large_step_(large_step), raw_(std::move(raw)) {}

size_t BlockPool::round_size(size_t nbytes) const {
  constexpr size_t kSmallStep = 512, kLargeRequest = size_t{1} << 20;
  const size_t step = nbytes < kLargeRequest ? kSmallStep : large_step_;
  return (nbytes + step - 1) / step * step;
}

DataPtr BlockPool::allocate(size_t nbytes, const void* stream) {
  size_t size = round_size(nbytes);
  if (size == 0) return DataPtr(nullptr, [](void*) {});
  void* p = take_cached(size, stream);  // may raise `size` to the cached block's
  if (p == nullptr) {
    // Outside the lock: asking the system for memory is slow, and other threads may go on
    // taking and returning cached blocks meanwhile.
    p = raw_.alloc(size);
    if (p == nullptr) {
      empty_cache();  // give back what we hold, then try once more
      p = raw_.alloc(size);
    }
    if (p == nullptr) {
      const AllocatorStats s = stats();
      DDP_FAIL("out of memory on " << device_ << " allocating " << size << " bytes (" << s.allocated
                                   << " bytes in use by tensors, " << s.reserved
                                   << " reserved by ddplab)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reserved += static_cast<int64_t>(size);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated += static_cast<int64_t>(size);
    if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
  }
  return DataPtr(p, [this, size, stream](void* q) { release(q, size, stream); });
}

void* BlockPool::take_cached(size_t& size, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_allocs++;
  auto pool = free_.find(stream);
  if (pool == free_.end()) return nullptr;
  std::multimap<size_t, void*>& blocks = pool->second;
  // Best fit: lower_bound finds the smallest block that holds `size`; larger ones follow.
  for (auto it = blocks.lower_bound(size); it != blocks.end() && it->first <= 2 * size; ++it) {
    if (raw_.ready && !raw_.ready(it->second)) continue;
    void* p = it->second;
    size = it->first;
    blocks.erase(it);
    stats_.cache_hits++;
    return p;
  }
  return nullptr;
}

void BlockPool::release(void* p, size_t size, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated -= static_cast<int64_t>(size);
  free_[stream].emplace(size, p);
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [stream, blocks] : free_) {
    for (auto& [size, p] : blocks) {
      raw_.free(p);
      stats_.reserved -= static_cast<int64_t>(size);
    }
  }
  free_.clear();
}

AllocatorStats BlockPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BlockPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
}

}  // namespace ddplab
