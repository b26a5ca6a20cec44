// BlockPool, the free lists and statistics under the host and CUDA caching allocators: size
// rounding, best fit, splitting and merging, reuse, per-stream lists, record_stream's events,
// statistics, empty_cache and running out of memory.
//
// The pool here gets its memory from a counting fake, so the tests can see every trip to the
// "system". (test_copy.cpp checks the real host allocator through tensors.)
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

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

TEST_CASE("BlockPool picks the smallest cached block that fits and splits off the rest") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  char *p4 = nullptr, *p8 = nullptr, *p16 = nullptr;
  {
    DataPtr a = pool.allocate(4 * kKiB), b = pool.allocate(8 * kKiB), c = pool.allocate(16 * kKiB);
    p4 = static_cast<char*>(a.get()), p8 = static_cast<char*>(b.get());
    p16 = static_cast<char*>(c.get());
  }
  {
    DataPtr d = pool.allocate(5 * kKiB);  // 4 KiB is too small; 8 KiB fits best
    CHECK(d.get() == p8);
    CHECK(pool.stats().allocated == static_cast<int64_t>(5 * kKiB));  // only the front is used
    DataPtr e = pool.allocate(3 * kKiB);  // the 3 KiB split off the 8 KiB block
    CHECK(e.get() == p8 + 5 * kKiB);
  }
  {
    DataPtr f = pool.allocate(8 * kKiB);  // the two pieces were merged back when freed
    CHECK(f.get() == p8);
    DataPtr g = pool.allocate(4 * kKiB);
    CHECK(g.get() == p4);
    DataPtr h = pool.allocate(4 * kKiB), i = pool.allocate(4 * kKiB);  // two pieces of 16 KiB
    CHECK(h.get() == p16);
    CHECK(i.get() == p16 + 4 * kKiB);
    CHECK(mem.allocs == 3);  // no fresh memory: every request was cut from the cache
    CHECK(pool.stats().cache_hits == 6);
  }
}

TEST_CASE("BlockPool merges a freed block with free neighbours on both sides") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  char* base = nullptr;
  { base = static_cast<char*>(pool.allocate(12 * kKiB).get()); }
  DataPtr a = pool.allocate(4 * kKiB), b = pool.allocate(4 * kKiB), c = pool.allocate(4 * kKiB);
  CHECK(a.get() == base);
  CHECK(b.get() == base + 4 * kKiB);
  CHECK(c.get() == base + 8 * kKiB);
  a.reset();
  c.reset();
  pool.empty_cache();  // the segment is not wholly free: nothing goes back
  CHECK(mem.frees == 0);
  b.reset();  // joins both neighbours: one block of 12 KiB again
  DataPtr whole = pool.allocate(12 * kKiB);
  CHECK(whole.get() == base);
  whole.reset();
  pool.empty_cache();
  CHECK(mem.frees == 1);
  CHECK(pool.stats().reserved == 0);
}

TEST_CASE("BlockPool keeps small requests out of large segments") {
  FakeMemory mem;
  BlockPool pool(kCPU, kMiB, mem.raw());
  char* big = nullptr;
  { big = static_cast<char*>(pool.allocate(4 * kMiB).get()); }
  DataPtr small = pool.allocate(4 * kKiB);  // fresh memory, though 4 MiB are cached
  CHECK(small.get() != big);
  CHECK(mem.allocs == 2);
  DataPtr large = pool.allocate(kMiB);  // large requests do split large blocks
  CHECK(large.get() == big);
  DataPtr rest = pool.allocate(3 * kMiB);
  CHECK(rest.get() == big + kMiB);
  CHECK(mem.allocs == 2);
}

TEST_CASE("BlockPool record_stream: a block used on another stream waits for its event") {
  FakeMemory mem;
  BlockPool::RawMemory raw = mem.raw();
  std::set<const void*> recorded;  // events: the stream they were recorded on, done when erased
  int events = 0;
  raw.record_event = [&](const void* s) -> void* {
    ++events;
    recorded.insert(s);
    return const_cast<void*>(s);
  };
  raw.event_done = [&](void* e) { return recorded.count(e) == 0; };
  BlockPool pool(cuda(0), 2 * kMiB, raw);
  int main_stream = 0, side = 0;
  DataPtr a = pool.allocate(4096, &main_stream);
  void* p = a.get();
  pool.record_stream(static_cast<char*>(p) + 100, &side);  // any address inside the block
  pool.record_stream(p, &main_stream);                     // its own stream: nothing to wait for
  a.reset();
  CHECK(events == 1);
  CHECK(pool.stats().allocated == 0);
  DataPtr b = pool.allocate(4096, &main_stream);  // the side stream has not finished
  CHECK(b.get() != p);
  recorded.clear();  // the side stream reached the event
  DataPtr c = pool.allocate(4096, &main_stream);
  CHECK(c.get() == p);
  c.reset();
  pool.record_stream(p, &side);  // freed: the pool no longer knows it as in use, ignored
  { DataPtr d = pool.allocate(4096, &main_stream); }
  CHECK(events == 1);

  BlockPool host(kCPU, kMiB, mem.raw());  // no events: host memory has no streams
  DataPtr h = host.allocate(64);
  check_error_mentions([&] { host.record_stream(h.get(), &side); }, {"record_stream", "cpu"});
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

// The DataLoader's workers allocate and free batches concurrently. A piece cut from a cached
// segment must be marked in use before the pool's lock is released: otherwise a neighbour freed
// by another thread at that moment sees it free and absorbs (deletes) it (a use-after-free that
// AddressSanitizer caught once in the DataLoader tests). A stress test: it cannot force the
// interleaving, but under the sanitizer build it is the likeliest place to see it again.
TEST_CASE("BlockPool: threads taking and freeing neighbouring pieces of one segment") {
  BlockPool::RawMemory raw;
  raw.alloc = [](size_t n) { return std::malloc(n); };
  raw.free = [](void* p) { std::free(p); };
  BlockPool pool(kCPU, kMiB, raw);
  pool.allocate(512 * kKiB, nullptr);  // freed at once: one cached segment to cut pieces from
  std::atomic<int> clobbered{0};
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, &clobbered, t] {
      for (int i = 0; i < 20000; ++i) {
        const size_t n = 512 * static_cast<size_t>(1 + (i + t) % 8);
        DataPtr a = pool.allocate(n, nullptr);
        std::memset(a.get(), t + 1, n);
        const auto* bytes = static_cast<const unsigned char*>(a.get());
        if (bytes[0] != t + 1 || bytes[n - 1] != t + 1) ++clobbered;  // shared with another thread
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(clobbered.load() == 0);
  CHECK(pool.stats().allocated == 0);
}
