// The caching CUDA allocator and the pinned host allocator (see cuda_allocator.h).
//
// Sizes are rounded (512 B steps under 1 MiB, 2 MiB steps above) so that the tensors of one
// training step reuse the blocks of the previous one exactly. A cached block is handed out for a
// request at most half its size, so a small tensor cannot pin a huge block. Unlike PyTorch's
// allocator, blocks are never split: simpler, at the cost of some memory.
#include "tensor/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/error.h"

namespace ddplab {

namespace {

size_t round_size(size_t n) {
  if (n == 0) return 0;
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20;
  if (n < (size_t{1} << 20)) return (n + kSmall - 1) / kSmall * kSmall;
  return (n + kLarge - 1) / kLarge * kLarge;
}

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  DataPtr allocate(size_t nbytes) override {
    size_t size = round_size(nbytes);
    if (size == 0) return DataPtr(nullptr, [](void*) {});
    cudaStream_t stream = gpu::current_stream(device_).handle();
    void* p = take_cached(size, stream);
    if (p == nullptr) p = malloc_device(size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.allocated += static_cast<int64_t>(size);
      if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
    }
    // The deleter makes no CUDA call, so tensors may die at any time, even after main().
    return DataPtr(p, [this, size, stream](void* q) { release(q, size, stream); });
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    gpu::DeviceGuard g(device_);
    for (auto& [stream, pool] : free_) {
      for (auto& [size, p] : pool) {
        DDP_CUDA_CHECK(cudaFree(p));  // waits for the device, so no kernel still uses p
        stats_.reserved -= static_cast<int64_t>(size);
      }
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
  void* take_cached(size_t& size, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_allocs++;
    auto pool = free_.find(stream);
    if (pool == free_.end()) return nullptr;
    auto it = pool->second.lower_bound(size);
    if (it == pool->second.end() || it->first > 2 * size) return nullptr;
    size = it->first;
    void* p = it->second;
    pool->second.erase(it);
    stats_.cache_hits++;
    return p;
  }

  void* malloc_device(size_t size) {
    gpu::DeviceGuard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, give the cache back to the driver, try once more
      empty_cache();
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      AllocatorStats s = stats();
      DDP_FAIL("CUDA out of memory on cuda:" << device_ << " allocating " << size << " bytes ("
                                             << s.allocated << " bytes in use by tensors, "
                                             << s.reserved << " reserved by ddplab)");
    }
    DDP_CUDA_CHECK(e);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reserved += static_cast<int64_t>(size);
    return p;
  }

  void release(void* p, size_t size, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated -= static_cast<int64_t>(size);
    free_[stream].emplace(size, p);
  }

  const int device_;
  mutable std::mutex mu_;
  std::map<cudaStream_t, std::multimap<size_t, void*>> free_;  // per stream: size -> block
  AllocatorStats stats_;
};

// ---- pinned host memory
// --------------------------------------------------------------------------

class PinnedAllocator {
 public:
  DataPtr allocate(size_t nbytes) {
    size_t size = round_size(nbytes);
    if (size == 0) return DataPtr(nullptr, [](void*) {});
    char* p = take_cached(size);
    if (p == nullptr) {
      void* q = nullptr;
      // Portable: page-locked for every device, not only the current one.
      DDP_CUDA_CHECK(cudaHostAlloc(&q, size, cudaHostAllocPortable));
      p = static_cast<char*>(q);
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[p].size = size;
    }
    return DataPtr(p, [this, size](void* q) { release(static_cast<char*>(q), size); });
  }

  void record_use(const void* ptr, const gpu::Stream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = find(ptr);
    if (b == nullptr) return;  // page-locked by someone else: its owner keeps it alive
    gpu::DeviceGuard g(s.device());
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaEventRecord(e, s.handle()));
    b->pending.push_back(e);
  }

  bool owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    return find(ptr) != nullptr;
  }

 private:
  struct Block {
    size_t size = 0;
    std::vector<cudaEvent_t> pending;  // copies that may still use the block
  };

  Block* find(const void* ptr) {
    auto* c = static_cast<const char*>(ptr);
    auto it = blocks_.upper_bound(const_cast<char*>(c));
    if (it == blocks_.begin()) return nullptr;
    --it;
    return c < it->first + it->second.size ? &it->second : nullptr;
  }

  // True once every copy recorded on the block has finished (and forgets those copies).
  static bool idle(Block& b) {
    while (!b.pending.empty()) {
      cudaError_t e = cudaEventQuery(b.pending.back());
      if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
      }
      DDP_CUDA_CHECK(e);
      cudaEventDestroy(b.pending.back());
      b.pending.pop_back();
    }
    return true;
  }

  char* take_cached(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size; ++it) {
      if (idle(blocks_[it->second])) {
        char* p = it->second;
        free_.erase(it);
        return p;
      }
    }
    return nullptr;
  }

  void release(char* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(size, p);
  }

  std::mutex mu_;
  std::map<char*, Block> blocks_;      // every block ever allocated, by address
  std::multimap<size_t, char*> free_;  // cached blocks: size -> address
};

PinnedAllocator& pinned_allocator() {
  static auto* a = new PinnedAllocator();  // never destroyed: see cpu_allocator()
  return *a;
}

}  // namespace

Allocator& cuda_allocator(int device) {
  gpu::require_device(device);
  static std::mutex mu;
  static std::vector<CudaCachingAllocator*> allocators;  // never destroyed: see cpu_allocator()
  std::lock_guard<std::mutex> lock(mu);
  if (allocators.empty()) allocators.resize(static_cast<size_t>(gpu::device_count()), nullptr);
  auto& a = allocators[static_cast<size_t>(device)];
  if (a == nullptr) a = new CudaCachingAllocator(device);
  return *a;
}

// Declared in tensor/allocator.h; the CPU-only build defines it in tensor/allocator.cpp.
DataPtr allocate_pinned(size_t nbytes) {
  // Without a GPU, page-locking is pointless (and would be a CUDA call): plain cached memory.
  if (!gpu::is_available()) return cpu_allocator().allocate(nbytes);
  return pinned_allocator().allocate(nbytes);
}

namespace gpu {

bool is_pinned(const void* p) {
  if (p == nullptr || !is_available()) return false;
  if (pinned_allocator().owns(p)) return true;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void record_pinned_use(const void* p, const Stream& s) {
  pinned_allocator().record_use(p, s);
}

}  // namespace gpu

}  // namespace ddplab
