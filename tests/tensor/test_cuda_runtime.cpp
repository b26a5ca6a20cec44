// Tests of the CUDA runtime pieces: availability, the "no GPU" error, and, on a machine with a GPU,
// the caching allocator, stream/event ordering and pinned asynchronous copies.
//
// Without a GPU (and in CPU-only builds) only the first three run; the GPU cases are skipped
// (DDP_SKIP_IF), and so is the "without a GPU" case on a machine that has one. The op tests of
// tests/tensor/ run every case on the GPU too when one is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tensor/backend.h"
#include "tensor/ops.h"
#include "tests/skip.h"
#include "tests/test_util.h"

#if defined(DDP_CUDA)
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#endif

using namespace ddplab;

TEST_CASE("cuda_is_available answers without crashing, and the same every time") {
  const bool a = cuda_is_available();
  CHECK(a == cuda_is_available());
  CHECK((cuda_device_count() > 0) == a);
}

TEST_CASE("a CUDA tensor without a GPU throws an Error naming the device") {
  DDP_SKIP_IF(cuda_is_available(), "a GPU is present: nothing to check here");
  std::string what;
  try {
    ops::zeros({2}, cuda(0));
  } catch (const Error& e) {
    what = e.what();
  }
  CHECK(what.find("cuda:0") != std::string::npos);
  // Asking twice must not crash either (the CUDA error is sticky; ddplab must not ask again).
  CHECK_THROWS_AS(ops::zeros({2}, cuda(0)), Error);
  CHECK_FALSE(cuda_is_available());
}

TEST_CASE("a CUDA device index past the last one throws") {
  CHECK_THROWS_AS(ops::zeros({2}, cuda(cuda_device_count() + 3)), Error);
}

#if defined(DDP_CUDA)

TEST_CASE("the caching allocator reuses freed blocks and empty_cache returns them") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU");
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  const AllocatorStats before = a.stats();
  {
    DataPtr p = a.allocate(1000);
    CHECK(a.stats().allocated == before.allocated + 1024);  // rounded to 512-byte steps
  }
  CHECK(a.stats().allocated == before.allocated);
  CHECK(a.stats().reserved == before.reserved + 1024);  // cached, not freed
  const int64_t hits = a.stats().cache_hits;
  { DataPtr p = a.allocate(900); }
  CHECK(a.stats().cache_hits == hits + 1);
  CHECK(a.stats().peak_allocated >= before.allocated + 1024);
  a.empty_cache();
  CHECK(a.stats().reserved == before.reserved);

  // A block freed on one stream is not handed to another.
  gpu::Stream side = gpu::Stream::create(0);
  { DataPtr p = a.allocate(4096); }
  const int64_t hits2 = a.stats().cache_hits;
  {
    gpu::StreamGuard guard(side);
    DataPtr q = a.allocate(4096);
  }
  CHECK(a.stats().cache_hits == hits2);
}

TEST_CASE("events order work between streams and time it") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU");
  gpu::Stream s1 = gpu::Stream::create(0), s2 = gpu::Stream::create(0);
  Tensor x;
  gpu::Event start(true), done(true);
  {
    gpu::StreamGuard g(s1);
    start.record(s1);
    x = ops::full({1 << 20}, 1.0, cuda(0));
    for (int i = 0; i < 20; ++i) ops::add_(x, 1.0);
    done.record(s1);
  }
  done.wait(s2);
  double total = 0;
  {
    gpu::StreamGuard g(s2);
    total = ops::sum_all(x);  // must see all 20 additions
  }
  CHECK(total == doctest::Approx(21.0 * (1 << 20)));
  done.synchronize();
  CHECK(done.query());
  CHECK(start.elapsed_time(done) >= 0.0f);
}

TEST_CASE("pinned memory round trip with non_blocking copies") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU");
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  Tensor host = ops::pin_memory(ops::from_vector(values, {1000}));
  CHECK(gpu::is_pinned(host.raw_data()));
  Tensor dev = ops::to(host, cuda(0), /*non_blocking=*/true);
  Tensor back = ops::pin_memory(ops::zeros({1000}));
  ops::copy_(back, dev, /*non_blocking=*/true);
  gpu::current_stream(0).synchronize();
  CHECK(back.to_vector<float>() == values);
}

TEST_CASE("a pinned block freed while its async copy runs is not handed out before it finishes") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU");
  // 64 MiB: the copy takes milliseconds, long enough for the host to race it.
  const int64_t n = int64_t{16} << 20;
  Tensor dev;
  {
    Tensor host = ops::pin_memory(ops::full({n}, 3.0));
    dev = ops::to(host, cuda(0), /*non_blocking=*/true);
  }  // the host tensor is gone, its block back in the cache, the copy maybe still running
  Tensor other = ops::pin_memory(ops::zeros({n}));  // must not get the block the copy reads
  ops::fill_(other, -1.0);
  gpu::current_stream(0).synchronize();
  const std::vector<float> got = ops::to(dev, kCPU).to_vector<float>();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 3.0f; }));
}

TEST_CASE("the caching allocator splits cached blocks and record_stream delays reuse") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU");
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  const AllocatorStats before = a.stats();
  void* big = nullptr;
  { big = a.allocate(size_t{8} << 20).get(); }
  {
    DataPtr p = a.allocate(size_t{2} << 20), q = a.allocate(size_t{6} << 20);  // both cut from it
    CHECK(p.get() == big);
    CHECK(static_cast<char*>(q.get()) == static_cast<char*>(big) + (size_t{2} << 20));
    CHECK(a.stats().reserved == before.reserved + (int64_t{8} << 20));
  }
  a.empty_cache();  // merged back into one segment, so it can go
  CHECK(a.stats().reserved == before.reserved);

  gpu::Stream side = gpu::Stream::create(0);
  a.empty_cache();  // no other cached block of this size may serve `u` below
  Tensor t = ops::zeros({1024}, {kFloat32, cuda(0)});
  void* block = t.raw_data();
  gpu::record_stream(t, side);
  {
    gpu::StreamGuard guard(side);
    ops::fill_(t, 1.0);  // queued on the side stream
  }
  t = Tensor();
  side.synchronize();  // the side stream's work is done: the block may come back
  Tensor u = ops::zeros({1024}, {kFloat32, cuda(0)});
  CHECK(u.raw_data() == block);
  testing::check_error_mentions([&] { gpu::record_stream(ops::zeros({1}), side); },
                                {"record_stream"});
}

#endif  // DDP_CUDA
