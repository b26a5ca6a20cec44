// Allocators: where tensor memory comes from, and why it is cached.
//
// Fresh pages cost ~12 us each to first touch on our machines, and glibc returns large blocks to
// the OS on free, so a training step that frees its activations would pay that again every step.
// Like PyTorch's CUDA caching allocator, ours keep freed blocks in the process and hand them out
// again; `empty_cache()` gives them back. The CUDA allocator (tensor/cuda/) has the same interface.
// Both keep their blocks in a BlockPool (tensor/block_pool.h) and differ only in where raw memory
// comes from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/device.h"

namespace ddplab {

// Memory owned by a Storage. The deleter returns the block to its allocator.
using DataPtr = std::shared_ptr<void>;

struct AllocatorStats {
  int64_t allocated = 0;       // bytes handed out now
  int64_t reserved = 0;        // bytes held from the system (handed out + cached)
  int64_t peak_allocated = 0;  // high-water mark of `allocated`
  int64_t num_allocs = 0;      // requests served
  int64_t cache_hits = 0;      // requests served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DataPtr allocate(size_t nbytes) = 0;
  virtual void empty_cache() = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
};

// The allocator for a device. CPU always exists; CUDA throws a clear error without a GPU.
Allocator& allocator_for(Device d);

// Pinned (page-locked) host memory for asynchronous host<->device copies; on a CPU-only build,
// or without a GPU, it is ordinary cached host memory.
DataPtr allocate_pinned(size_t nbytes);

// The caching host allocator (exposed for its tests and benchmarks).
Allocator& cpu_allocator();

}  // namespace ddplab
