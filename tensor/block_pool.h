// BlockPool: the bookkeeping of a caching allocator, shared by the host and the CUDA allocators.
//
// A caching allocator keeps freed blocks and hands them out again instead of returning them to
// the system (tensor/allocator.h says why). What it needs for that does not depend on the device:
//   * sizes rounded to a few steps, so that the tensors of one training step fit exactly into the
//     blocks the previous step freed;
//   * a free list ordered by size, searched best fit: the smallest cached block that holds the
//     request;
//   * splitting: a cached block larger than the request is cut in two, the request gets the
//     front and the rest stays cached, so a large freed block can serve several smaller tensors
//     instead of the pool asking the system for more memory. When a block comes back, it is
//     merged with its free neighbours, so that the piece becomes large again;
//   * statistics (bytes handed out, bytes held, the peak, how often the cache served a request);
//   * empty_cache(), which gives every wholly free segment back;
//   * streams that used a block (record_stream): a block freed while another stream may still
//     read it returns to the free list only once events recorded on those streams completed.
// The allocators are thin adapters around BlockPool that say how raw memory is obtained and
// released (std::aligned_alloc / std::free, cudaMalloc / cudaFree, cudaHostAlloc /
// cudaFreeHost) and, for CUDA, how events are recorded.
//
// Vocabulary (as in PyTorch's CUDACachingAllocator): a *segment* is one piece of raw memory from
// the system; it is cut into *blocks*, neighbours by address. Requests under 1 MiB ("small") are
// served only from small segments and larger ones only from large segments: a small tensor that
// lives long would otherwise keep a large segment from ever being whole again.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

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
    // while an asynchronous copy may still read the segment holding `p`. Called with the pool's
    // lock held.
    std::function<bool(void* p)> ready;
    // Optional, for record_stream: an event recorded now on `stream` (must not throw: it runs in
    // a deleter), and whether an event has completed (it then releases the event). Without
    // them, record_stream is not supported.
    std::function<void*(const void* stream)> record_event;
    std::function<bool(void* event)> event_done;
  };

  // `device` names the memory in out-of-memory errors. Requests of 1 MiB and more are rounded up
  // to multiples of `large_step` (smaller ones to multiples of 512 B).
  BlockPool(Device device, size_t large_step, RawMemory raw);
  // Frees the cached segments. The allocators' pools are never destroyed (a tensor may be freed
  // after main() returns); tests destroy theirs once every block has come back.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `nbytes`, from the cache when one fits. The DataPtr's deleter puts the
  // block back into the cache under `stream`; only requests made under the same stream get it
  // again. That is what CUDA needs: work queued on one stream runs in order, so the block's next
  // user cannot overtake its previous one, while work on another stream could. Host memory has
  // no streams and passes nullptr. The deleter only takes a lock (and records events for
  // record_stream), so it may run at any time.
  DataPtr allocate(size_t nbytes, const void* stream = nullptr);

  // Says that work on `stream` (other than the block's own) uses the block holding `p`, which is
  // in use: when it is freed, the block waits for that work before it can be handed out again.
  // PyTorch's Tensor.record_stream. Pointers the pool does not own are ignored.
  void record_stream(const void* p, const void* stream);

  // Frees every wholly free cached segment (blocks in use are not affected, nor the segments
  // they are cut from).
  void empty_cache();
  AllocatorStats stats() const;
  // Starts a new peak: peak_allocated = allocated.
  void reset_peak();

  // The size a request of `nbytes` is served with.
  size_t round_size(size_t nbytes) const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    const void* stream = nullptr;  // the stream whose free list the block belongs to
    bool allocated = false;
    Block* prev = nullptr;  // neighbours within the same segment (nullptr at its ends)
    Block* next = nullptr;
    std::vector<const void*> used_on;  // other streams that use it (record_stream)
    std::vector<void*> events;         // after a free: events those streams must reach first
  };
  // Free lists are ordered by size (best fit), then by address (a total order).
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeList = std::set<Block*, BySize>;

  // A cached block of exactly `size` bytes under `stream`, split off a larger one if needed, or
  // nullptr. Counts the request in the statistics.
  Block* take_cached(size_t size, const void* stream);
  void release(Block* b);
  // Puts a free block into its free list, merged with its free neighbours.
  void insert_free(Block* b);
  // Moves blocks whose recorded streams have finished from pending_ to the free lists.
  void process_events();

  const Device device_;
  const size_t large_step_;
  const RawMemory raw_;
  mutable std::mutex mu_;
  std::map<const void*, FreeList> free_;  // per stream
  std::map<char*, Block*> in_use_;        // by address, to find the block of a pointer
  std::vector<Block*> pending_;           // freed, waiting for events (record_stream)
  AllocatorStats stats_;
};

}  // namespace ddplab
