// The caching host allocator.
//
// Freed blocks go into a size-ordered pool; a request takes the smallest cached block that fits
// and is not wastefully large. Sizes are rounded up (512 B under 1 MiB, else 1 MiB steps) so that
// activations of one training step reuse the blocks of the previous step exactly.
#include "tensor/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "tensor/error.h"

namespace ddplab {

namespace {

constexpr size_t kAlignment = 64;  // a cache line; also what AVX-512 loads like

size_t round_size(size_t n) {
  if (n == 0) return 0;
  if (n < (1u << 20)) return (n + 511) & ~size_t{511};
  return (n + (1u << 20) - 1) & ~((size_t{1} << 20) - 1);
}

class CachingHostAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t size = round_size(nbytes);
    if (size == 0) return DataPtr(nullptr, [](void*) {});
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.num_allocs++;
      auto it = free_.lower_bound(size);
      // A block more than twice as large would waste memory: leave it for a larger request.
      if (it != free_.end() && it->first <= 2 * size) {
        size = it->first;
        p = it->second;
        free_.erase(it);
        stats_.cache_hits++;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kAlignment, size);
      if (p == nullptr) {
        empty_cache();  // give back what we hold, then try once more
        p = std::aligned_alloc(kAlignment, size);
      }
      DDP_CHECK(p != nullptr, "out of host memory allocating " << size << " bytes");
      std::lock_guard<std::mutex> lock(mu_);
      stats_.reserved += static_cast<int64_t>(size);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.allocated += static_cast<int64_t>(size);
      if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
    }
    return DataPtr(p, [this, size](void* q) { release(q, size); });
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) {
      std::free(p);
      stats_.reserved -= static_cast<int64_t>(size);
    }
    free_.clear();
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated -= static_cast<int64_t>(size);
    free_.emplace(size, p);
  }

  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  AllocatorStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors held in static objects may be freed after main() returns.
  static auto* a = new CachingHostAllocator();
  return *a;
}

#if !defined(DDPLAB_CUDA)
DataPtr allocate_pinned(size_t nbytes) {
  return cpu_allocator().allocate(nbytes);
}
#endif

}  // namespace ddplab
