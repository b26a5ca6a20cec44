// BlockPool, the free lists and statistics under the host and CUDA caching allocators: size
// rounding, best fit, reuse, per-stream lists, statistics, empty_cache and running out of memory.
//
// The pool here gets its memory from a counting fake, so the tests can see every trip to the
// "system". (test_copy.cpp checks the real host allocator through tensors.)
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>

#include "tensor/block_pool.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

// Raw memory from malloc that remembers what it handed out, and can be told to fail.
struct FakeMemory {
  std::set<void*> live;  // blocks the pool holds (in use or cached)
  int allocs = 0, frees = 0;
  int fail_next = 0;     // how many of the next allocs return nullptr
  std::set<void*> busy;  // blocks `ready` says may not be handed out yet
  BlockPool::RawMemory raw(bool with_ready = false) {
    BlockPool::RawMemory m;
    m.alloc = [this](size_t n) -> void* {
      if (fail_next > 0) {
        --fail_next;
        return nullptr;
      }
      ++allocs;
      void* p = std::malloc(n);
      live.insert(p);
      return p;
    };
    m.free = [this](void* p) {
      ++frees;
      live.erase(p);
      std::free(p);
    };
    if (with_ready) m.ready = [this](void* p) { return busy.count(p) == 0; };
    return m;
  }
};

}  // namespace

TEST_CASE("BlockPool rounds to 512 B under 1 MiB and to its large step above") {
  FakeMemory mem;
  BlockPool host(kCPU, kMiB, mem.raw());
  CHECK(host.round_size(0) == 0);
  CHECK(host.round_size(1) == 512);
  CHECK(host.round_size(1000) == 1024);
  CHECK(host.round_size(kMiB - 1) == kMiB);
  CHECK(host.round_size(kMiB) == kMiB);
  CHECK(host.round_size(kMiB + 1) == 2 * kMiB);
  BlockPool device(cuda(0), 2 * kMiB, mem.raw());
  CHECK(device.round_size(kMiB) == 2 * kMiB);
  CHECK(device.round_size(3 * kMiB) == 4 * kMiB);
}

TEST_CASE("BlockPool reuses a freed block and counts it as a cache hit") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  void* first = nullptr;
  {
    DataPtr a = pool.allocate(1000);
    first = a.get();
    CHECK(pool.stats().allocated == 1024);
  }
  CHECK(pool.stats().allocated == 0);
  CHECK(pool.stats().reserved == 1024);  // cached, not freed
  DataPtr b = pool.allocate(600);        // rounds to 1024 too
  CHECK(b.get() == first);
  CHECK(mem.allocs == 1);
  const AllocatorStats s = pool.stats();
  CHECK(s.num_allocs == 2);
  CHECK(s.cache_hits == 1);
  CHECK(pool.allocate(0) == nullptr);  // nothing to allocate, nothing counted
  CHECK(pool.stats().num_allocs == 2);
}

TEST_CASE("BlockPool picks the smallest cached block that fits, but not one over twice the size") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  void *p4 = nullptr, *p8 = nullptr, *p16 = nullptr;
  {
    DataPtr a = pool.allocate(4 * kKiB), b = pool.allocate(8 * kKiB), c = pool.allocate(16 * kKiB);
    p4 = a.get(), p8 = b.get(), p16 = c.get();
  }
  {
    DataPtr d = pool.allocate(5 * kKiB);  // 4 KiB is too small; 8 KiB fits best
    CHECK(d.get() == p8);
    CHECK(pool.stats().allocated == static_cast<int64_t>(8 * kKiB));  // the block's size counts
  }
  {
    DataPtr e = pool.allocate(4 * kKiB);
    CHECK(e.get() == p4);
    DataPtr f = pool.allocate(4 * kKiB);  // 8 KiB is twice: still fine
    CHECK(f.get() == p8);
    DataPtr g = pool.allocate(4 * kKiB);  // 16 KiB is four times: a fresh block instead
    CHECK(g.get() != p16);
    CHECK(mem.allocs == 4);
  }
}

TEST_CASE("BlockPool hands a block freed under one stream only to the same stream") {
  FakeMemory mem;
  BlockPool pool(cuda(0), 2 * kMiB, mem.raw());
  int stream_a = 0, stream_b = 0;  // stand-ins: the pool only compares the addresses
  void* p = pool.allocate(4096, &stream_a).get();
  DataPtr on_b = pool.allocate(4096, &stream_b);
  CHECK(on_b.get() != p);
  CHECK(pool.stats().cache_hits == 0);
  DataPtr on_a = pool.allocate(4096, &stream_a);
  CHECK(on_a.get() == p);
  CHECK(pool.stats().cache_hits == 1);
}

TEST_CASE("BlockPool skips cached blocks that are not ready") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw(/*with_ready=*/true));
  void *p1 = nullptr, *p2 = nullptr;
  {
    DataPtr a = pool.allocate(1024), b = pool.allocate(1024);
    p1 = a.get(), p2 = b.get();
  }
  mem.busy = {p1, p2};
  DataPtr c = pool.allocate(1024);
  CHECK(c.get() != p1);
  CHECK(c.get() != p2);
  mem.busy = {p1};
  DataPtr d = pool.allocate(1024);
  CHECK(d.get() == p2);
}

TEST_CASE("BlockPool statistics: allocated, reserved, peak and reset_peak") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  {
    DataPtr a = pool.allocate(kMiB), b = pool.allocate(2 * kMiB);
    CHECK(pool.stats().allocated == static_cast<int64_t>(3 * kMiB));
    CHECK(pool.stats().peak_allocated == static_cast<int64_t>(3 * kMiB));
  }
  AllocatorStats s = pool.stats();
  CHECK(s.allocated == 0);
  CHECK(s.reserved == static_cast<int64_t>(3 * kMiB));
  CHECK(s.peak_allocated == static_cast<int64_t>(3 * kMiB));  // a high-water mark stays
  DataPtr c = pool.allocate(kMiB);
  pool.reset_peak();
  CHECK(pool.stats().peak_allocated == static_cast<int64_t>(kMiB));
}

TEST_CASE("BlockPool empty_cache frees the cached blocks and leaves the ones in use") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  DataPtr kept = pool.allocate(kMiB);
  { DataPtr dropped = pool.allocate(2 * kMiB); }
  pool.empty_cache();
  CHECK(mem.frees == 1);
  CHECK(mem.live.count(kept.get()) == 1);
  CHECK(pool.stats().reserved == static_cast<int64_t>(kMiB));
  CHECK(pool.stats().allocated == static_cast<int64_t>(kMiB));
  kept.reset();  // back into the cache, to be freed by the next empty_cache
  CHECK(mem.live.size() == 1);
  pool.empty_cache();
  CHECK(mem.live.empty());
  CHECK(pool.stats().reserved == 0);
}

TEST_CASE("BlockPool empties its cache and retries when out of memory, then names the device") {
  FakeMemory mem;
  BlockPool pool(cuda(1), 2 * kMiB, mem.raw());
  { DataPtr cached = pool.allocate(kMiB); }
  mem.fail_next = 1;  // the first try fails; the retry after empty_cache succeeds
  DataPtr p = pool.allocate(4 * kMiB);
  CHECK(p != nullptr);
  CHECK(mem.frees == 1);
  CHECK(pool.stats().reserved == static_cast<int64_t>(4 * kMiB));
  mem.fail_next = 2;
  check_error_mentions([&] { pool.allocate(8 * kMiB); }, {"out of memory", "cuda:1", "8388608"});
}
