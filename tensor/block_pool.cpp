// BlockPool (see block_pool.h).
#include "tensor/block_pool.h"

#include <algorithm>
#include <utility>

#include "tensor/error.h"

namespace ddplab {

namespace {
constexpr size_t kSmallStep = 512, kLargeRequest = size_t{1} << 20;
}  // namespace

BlockPool::BlockPool(Device device, size_t large_step, RawMemory raw)
    : device_(device), large_step_(large_step), raw_(std::move(raw)) {}

BlockPool::~BlockPool() {
  empty_cache();
  // What is left are pieces of segments still in use or waiting for events: tests destroy their
  // pools only when nothing is, so this only forgets the bookkeeping.
  for (auto& [stream, blocks] : free_)
    for (Block* b : blocks) delete b;
}

size_t BlockPool::round_size(size_t nbytes) const {
  const size_t step = nbytes < kLargeRequest ? kSmallStep : large_step_;
  return (nbytes + step - 1) / step * step;
}

DataPtr BlockPool::allocate(size_t nbytes, const void* stream) {
  const size_t size = round_size(nbytes);
  if (size == 0) return DataPtr(nullptr, [](void*) {});
  Block* b = take_cached(size, stream);
  if (b == nullptr) {
    // Outside the lock: asking the system for memory is slow, and other threads may go on
    // taking and returning cached blocks meanwhile.
    void* p = raw_.alloc(size);
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
    b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = size;
    b->stream = stream;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reserved += static_cast<int64_t>(size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  b->allocated = true;
  in_use_[b->ptr] = b;
  stats_.allocated += static_cast<int64_t>(size);
  if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
  return DataPtr(b->ptr, [this, b](void*) { release(b); });
}

BlockPool::Block* BlockPool::take_cached(size_t size, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_allocs++;
  process_events();
  auto pool = free_.find(stream);
  if (pool == free_.end()) return nullptr;
  FreeList& blocks = pool->second;
  const bool small = size < kLargeRequest;
  Block probe;
  probe.size = size;  // and ptr nullptr: lower_bound finds the smallest block that holds `size`
  for (auto it = blocks.lower_bound(&probe); it != blocks.end(); ++it) {
    Block* b = *it;
    if (small && b->size >= kLargeRequest) break;  // small requests stay out of large segments
    if (raw_.ready && !raw_.ready(b->ptr)) continue;
    blocks.erase(it);
    if (b->size > size) {
      // Split: the request gets the front, the rest stays cached as a block of its own. Sizes
      // in one class are multiples of that class's step, so the rest is too.
      auto* rest = new Block;
      rest->ptr = b->ptr + size;
      rest->size = b->size - size;
      rest->stream = b->stream;
      rest->prev = b;
      rest->next = b->next;
      if (b->next != nullptr) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      blocks.insert(rest);
    }
    // Taken while still under the lock: a neighbour freed by another thread between here and
    // allocate() marking it in use would otherwise see it free and absorb (delete) it.
    b->allocated = true;
    stats_.cache_hits++;
    return b;
  }
  return nullptr;
}

void BlockPool::release(Block* b) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated -= static_cast<int64_t>(b->size);
  in_use_.erase(b->ptr);
  b->allocated = false;
  // Work already queued on the other streams may still use the block: it waits for events
  // recorded on them now, i.e. behind that work.
  for (const void* s : b->used_on) {
    if (void* e = raw_.record_event(s)) b->events.push_back(e);
  }
  b->used_on.clear();
  if (b->events.empty()) {
    insert_free(b);
  } else {
    pending_.push_back(b);
  }
}

namespace {
// `a` absorbs its right neighbour in the segment.
template <class Block>
void absorb_next(Block* a) {
  Block* n = a->next;
  a->size += n->size;
  a->next = n->next;
  if (n->next != nullptr) n->next->prev = a;
  delete n;
}
}  // namespace

void BlockPool::insert_free(Block* b) {
  FreeList& blocks = free_[b->stream];
  // A neighbour can join when it is free too (not handed out, not waiting for events).
  auto is_free = [](const Block* n) { return n != nullptr && !n->allocated && n->events.empty(); };
  if (is_free(b->prev)) {  // b joins the block before it
    b = b->prev;
    blocks.erase(b);
    absorb_next(b);
  }
  if (is_free(b->next)) {  // the block after b joins b
    blocks.erase(b->next);
    absorb_next(b);
  }
  blocks.insert(b);
}

void BlockPool::process_events() {
  auto done = [this](Block* b) {
    auto& ev = b->events;
    ev.erase(std::remove_if(ev.begin(), ev.end(), [this](void* e) { return raw_.event_done(e); }),
             ev.end());
    return ev.empty();
  };
  std::vector<Block*> still_pending;
  for (Block* b : pending_) {
    if (done(b)) {
      insert_free(b);
    } else {
      still_pending.push_back(b);
    }
  }
  pending_.swap(still_pending);
}

void BlockPool::record_stream(const void* p, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DDP_CHECK(raw_.record_event != nullptr,
            "record_stream: the memory of " << device_ << " has no streams");
  auto* c = static_cast<const char*>(p);
  auto it = in_use_.upper_bound(const_cast<char*>(c));
  if (it == in_use_.begin()) return;
  Block* b = std::prev(it)->second;
  if (c >= b->ptr + b->size || stream == b->stream) return;
  if (std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end())
    b->used_on.push_back(stream);
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  for (auto& [stream, blocks] : free_) {
    for (auto it = blocks.begin(); it != blocks.end();) {
      Block* b = *it;
      // Only a whole segment can go back: the system frees what it handed out, not pieces.
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      raw_.free(b->ptr);
      stats_.reserved -= static_cast<int64_t>(b->size);
      delete b;
      it = blocks.erase(it);
    }
  }
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
