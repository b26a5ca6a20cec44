// The caching CUDA allocator and the pinned host allocator (see cuda_allocator.h).
//
// Both are BlockPools (tensor/block_pool.h): this file only says how raw memory is obtained and
// released. Sizes are rounded to 512 B steps under 1 MiB and 2 MiB steps above.
#include "tensor/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "tensor/block_pool.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ddplab {

namespace {

constexpr size_t kLargeStep = size_t{2} << 20;

// cudaMalloc on `device`; nullptr when the device is out of memory, so that the pool can give its
// cache back to the driver and try again.
void* device_malloc(int device, size_t size) {
  gpu::DeviceGuard g(device);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the error: the next CUDA call must not report it again
    return nullptr;
  }
  DDP_CUDA_CHECK(e);
  return p;
}

void device_free(int device, void* p) {
  gpu::DeviceGuard g(device);
  DDP_CUDA_CHECK(cudaFree(p));  // waits for the device, so no kernel still uses p
}

// For record_stream: an event behind the work queued on `stream` so far. It runs in a tensor's
// deleter, which must not throw: when CUDA is gone (a tensor freed after main returned) there is
// no work left to wait for, and nullptr says so.
void* record_event_on(int device, const void* stream) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(e, static_cast<cudaStream_t>(const_cast<void*>(stream))) != cudaSuccess) {
    if (e != nullptr) cudaEventDestroy(e);
    cudaGetLastError();
    e = nullptr;
  }
  cudaSetDevice(previous);  // a deleter must not change the thread's device
  return e;
}

// True (and the event destroyed) once the work before `event` has finished.
bool event_done(void* event) {
  auto e = static_cast<cudaEvent_t>(event);
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  DDP_CUDA_CHECK(r);
  cudaEventDestroy(e);
  return true;
}

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device)
      : device_(device),
        pool_(cuda(device), kLargeStep,
              {[device](size_t n) { return device_malloc(device, n); },
               [device](void* p) { device_free(device, p); }, nullptr,
               [device](const void* s) { return record_event_on(device, s); }, event_done}) {}

  // Blocks are cached per stream: a block freed while `s` was current goes back only to
  // requests made while `s` is current (see BlockPool::allocate).
  DataPtr allocate(size_t nbytes) override {
    return pool_.allocate(nbytes, gpu::current_stream(device_).handle());
  }
  void empty_cache() override { pool_.empty_cache(); }
  AllocatorStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  void record_stream(const void* p, const gpu::Stream& s) { pool_.record_stream(p, s.handle()); }

 private:
  const int device_;
  BlockPool pool_;
};

// ---- pinned host memory
// --------------------------------------------------------------------------

class PinnedAllocator {
 public:
  DataPtr allocate(size_t nbytes) { return pool_.allocate(nbytes); }

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

  void* host_alloc(size_t size) {
    void* p = nullptr;
    // Portable: page-locked for every device, not only the current one.
    DDP_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocPortable));
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[static_cast<char*>(p)].size = size;
    return p;
  }

  // Only the pool's empty_cache frees a pinned block (nothing calls it today): wait for the
  // copies recorded on the block before its memory goes back.
  void host_free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(static_cast<char*>(p));
    for (cudaEvent_t e : it->second.pending) {
      DDP_CUDA_CHECK(cudaEventSynchronize(e));
      cudaEventDestroy(e);
    }
    blocks_.erase(it);
    DDP_CUDA_CHECK(cudaFreeHost(p));
  }

  // `p` may be a piece of a segment the pool split: the events are kept per segment, so any
  // copy from the segment holds all of its pieces (safe, and copies finish quickly).
  bool ready(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = find(p);
    return b == nullptr || idle(*b);
  }

  std::mutex mu_;                  // guards blocks_ (the pool has its own lock for its lists)
  std::map<char*, Block> blocks_;  // every block ever allocated, by address
  BlockPool pool_{kCPU,
                  kLargeStep,
                  {[this](size_t n) { return host_alloc(n); }, [this](void* p) { host_free(p); },
                   [this](void* p) { return ready(p); }, nullptr, nullptr}};
};

PinnedAllocator& pinned_allocator() {
  static auto* a = new PinnedAllocator();  // never destroyed: see cpu_allocator()
  return *a;
}

CudaCachingAllocator& caching_allocator(int device) {
  gpu::require_device(device);
  static std::mutex mu;
  static std::vector<CudaCachingAllocator*> allocators;  // never destroyed: see cpu_allocator()
  std::lock_guard<std::mutex> lock(mu);
  if (allocators.empty()) allocators.resize(static_cast<size_t>(gpu::device_count()), nullptr);
  auto& a = allocators[static_cast<size_t>(device)];
  if (a == nullptr) a = new CudaCachingAllocator(device);
  return *a;
}

}  // namespace

Allocator& cuda_allocator(int device) {
  return caching_allocator(device);
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

void record_stream(const Tensor& t, const Stream& s) {
  DDP_CHECK(
      t.is_cuda() && t.device().index == s.device(),
      "record_stream: the tensor is on " << t.device() << ", the stream on cuda:" << s.device());
  caching_allocator(s.device()).record_stream(t.raw_data(), s);
}

}  // namespace gpu

}  // namespace ddplab
