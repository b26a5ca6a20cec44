// BlockPool: the bookkeeping of a caching allocator, shared by the host and the CUDA allocators.
//
// A caching allocator keeps freed blocks and hands them out again instead of returning them to
// the system (tensor/allocator.h says why). What it needs for that does not depend on the device:
//   * sizes rounded to a few steps, so that the tensors of one training step fit exactly into the
//     blocks the previous step freed;
//   * a free list ordered by size, searched best fit: the smallest cached block that holds the
//     request, but never one more than twice its size (a small tensor must not pin a huge block);
//   * statistics (bytes handed out, bytes held, the peak, how often the cache served a request);
//   * empty_cache(), which gives every cached block back.
// BlockPool is exactly that. The allocators are thin adapters around it that say how raw memory
// is obtained and released (std::aligned_alloc / std::free, cudaMalloc / cudaFree,
// cudaHostAlloc / cudaFreeHost). Blocks are never split or merged: simpler than PyTorch's
// allocator, at the cost of some memory.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace ddplab {

class BlockPool {
 public:
  // How the pool gets raw memory and gives it back.
  struct RawMemory {
    // Returns `nbytes` of fresh memory, or nullptr when the device is out of memory (the pool
    // then empties its cache and tries once more). It may also throw.
    std::function<void*(size_t nbytes)> alloc;
    std::function<void(void* p)> free;
    // Optional: whether a cached block may be handed out yet. The pinned host allocator says no
    // while an asynchronous copy may still read the block. Called with the pool's lock held.
    std::function<bool(void* p)> ready;
  };

  // `device` names the memory in out-of-memory errors. Requests of 1 MiB and more are rounded up
  // to multiples of `large_step` (smaller ones to multiples of 512 B).
  BlockPool(Device device, size_t large_step, RawMemory raw);
  // Frees the cached blocks. The allocators' pools are never destroyed (a tensor may be freed
  // after main() returns); tests destroy theirs once every block has come back.
  ~BlockPool() { empty_cache(); }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `nbytes`, from the cache when one fits. The DataPtr's deleter puts the
  // block back into the cache under `stream`; only requests made under the same stream get it
  // again. That is what CUDA needs: work queued on one stream runs in order, so the block's next
  // user cannot overtake its previous one, while work on another stream could. Host memory has
  // no streams and passes nullptr. The deleter only takes a lock, so it may run at any time.
  DataPtr allocate(size_t nbytes, const void* stream = nullptr);

  // Frees every cached block (blocks in use are not affected).
  void empty_cache();
  AllocatorStats stats() const;
  // Starts a new peak: peak_allocated = allocated.
  void reset_peak();

  // The size a request of `nbytes` is served with.
  size_t round_size(size_t nbytes) const;

 private:
  // A cached block of at least `size` bytes under `stream` (and sets `size` to its size), or
  // nullptr. Counts the request in the statistics.
  void* take_cached(size_t& size, const void* stream);
  void release(void* p, size_t size, const void* stream);

  const Device device_;
  const size_t large_step_;
  const RawMemory raw_;
  mutable std::mutex mu_;
  // The cached blocks: per stream, size -> address (a multimap: many blocks share a size).
  std::map<const void*, std::multimap<size_t, void*>> free_;
  AllocatorStats stats_;
};

}  // namespace ddplab
