// Tensor-core benchmark: sgemm through ddplab vs oneDNN and OpenBLAS called directly, oneDNN's
// bfloat16 matmul (the peak a bfloat16 step is measured against), and an elementwise add of 16M
// floats vs memcpy bandwidth. Prints medians of interleaved runs and the ratios (the machine is
// shared: only ratios measured in one run mean anything).
//
//   build/bench/bench_tensor [--threads N] [--reps R]
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/threads.h"

#if defined(DDP_HAVE_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

using namespace ddplab;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(const std::function<void()>& fn) {
  auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs the candidates interleaved (A B C A B C ...) and returns each one's median time.
std::vector<double> interleaved(const std::vector<std::function<void()>>& fns, int reps) {
  for (auto& f : fns) f();  // warm-up: JIT, first touch, caches
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fns.size(); ++i) t[i].push_back(seconds(fns[i]));
  std::vector<double> out;
  out.reserve(t.size());
  for (auto& v : t) out.push_back(median(v));
  return out;
}

void bench_sgemm(int64_t m, int64_t n, int64_t k, int threads, int reps) {
  Tensor a = ops::randn({m, k}), b = ops::randn({k, n}), c = ops::empty({m, n});
  std::vector<float> c2(static_cast<size_t>(m * n));
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  std::vector<std::function<void()>> fns = {
      [&] { ops::gemm_(c, a, b, false, false); },
      [&] { dnnl_sgemm('N', 'N', m, n, k, 1.f, pa, k, pb, n, 0.f, c2.data(), n); },
  };
#if defined(DDP_HAVE_OPENBLAS)
  openblas_set_num_threads(threads);
  fns.push_back([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.f, pa, static_cast<int>(k), pb, static_cast<int>(n), 0.f,
                c2.data(), static_cast<int>(n));
  });
#endif
  auto t = interleaved(fns, reps);
  double flops = 2.0 * static_cast<double>(m * n * k);
  std::printf("sgemm m=%ld n=%ld k=%ld threads=%d: ddplab %.1f GFLOP/s, oneDNN %.1f GFLOP/s",
              static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), threads,
              flops / t[0] * 1e-9, flops / t[1] * 1e-9);
  if (t.size() > 2) std::printf(", OpenBLAS %.1f GFLOP/s", flops / t[2] * 1e-9);
  std::printf("\n  ratio ddplab/oneDNN time %.3f", t[0] / t[1]);
  if (t.size() > 2) std::printf(", ddplab/OpenBLAS time %.3f", t[0] / t[2]);
  std::printf("\n");
}

// bfloat16 operands, float32 products and sums: what autocast's convolutions and linear layers
// compute, and on CPUs with AVX512-BF16 (two products per float32 lane per instruction) or AMX
// the ceiling a bfloat16 step is compared with. Timed beside oneDNN's sgemm of the same shape,
// so the two peaks come from one run. CPUs whose oneDNN has no bfloat16 matmul say so.
void bench_bf16_matmul(int64_t m, int64_t n, int64_t k, int threads, int reps) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::desc a_md({m, k}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc b_md({k, n}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
#if DNNL_VERSION_MAJOR >= 3
    pd = dnnl::matmul::primitive_desc(eng, a_md, b_md, c_md);
#else
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
#endif
  } catch (const dnnl::error& e) {
    std::printf("bf16 matmul m=%ld n=%ld k=%ld threads=%d: none in this oneDNN (%s)\n",
                static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), threads,
                e.what());
    return;
  }
  // 0x3f80 is bfloat16 1.0: the values do not change the time, only the bytes' count does.
  std::vector<uint16_t> a(static_cast<size_t>(m * k), 0x3f80),
      b(static_cast<size_t>(k * n), 0x3f80);
  std::vector<float> c(static_cast<size_t>(m * n)), a32(a.size(), 1.f), b32(b.size(), 1.f);
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  dnnl::matmul mm(pd);
  std::vector<std::function<void()>> fns = {
      [&] {
        mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        strm.wait();
      },
      [&] { dnnl_sgemm('N', 'N', m, n, k, 1.f, a32.data(), k, b32.data(), n, 0.f, c.data(), n); },
  };
  auto t = interleaved(fns, reps);
  const double flops = 2.0 * static_cast<double>(m * n * k);
  std::printf(
      "bf16 matmul m=%ld n=%ld k=%ld threads=%d: oneDNN %.1f GFLOP/s (%s), sgemm %.1f GFLOP/s\n"
      "  ratio bf16 / sgemm rate %.2f\n",
      static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), threads,
      flops / t[0] * 1e-9, pd.impl_info_str(), flops / t[1] * 1e-9, t[1] / t[0]);
}

void bench_add(int threads, int reps) {
  const int64_t n = 16 << 20;
  Tensor a = ops::rand({n}), b = ops::rand({n}), out = ops::empty({n});
  std::vector<float> src(static_cast<size_t>(n), 1.f), dst(static_cast<size_t>(n));
  std::vector<std::function<void()>> fns = {
      [&] { Tensor r = ops::add(a, b); },  // allocates its output (cached)
      [&] {
        ops::copy_(out, a);
        ops::add_(out, b);
      },                           // two passes, no allocation
      [&] { ops::add_(out, b); },  // in place: read 2, write 1
      [&] { std::memcpy(dst.data(), src.data(), static_cast<size_t>(n) * 4); },
  };
  auto t = interleaved(fns, reps);
  double gb = static_cast<double>(n) * 4 / 1e9;
  std::printf(
      "add 16M floats threads=%d: out-of-place %.1f GB/s (3 streams), in-place %.1f GB/s (3 "
      "streams), "
      "memcpy %.1f GB/s (2 streams)\n",
      threads, 3 * gb / t[0], 3 * gb / t[2], 2 * gb / t[3]);
  std::printf(
      "  ratio add time / memcpy time %.3f (a memory-bound add moves 1.5x memcpy's bytes)\n",
      t[0] / t[3]);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::vector<int> thread_counts = {1, 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--reps") reps = std::stoi(argv[i + 1]);
    if (f == "--threads") thread_counts = {std::stoi(argv[i + 1])};
  }
  for (int threads : thread_counts) {
    set_num_threads(threads);
    bench_sgemm(1024, 1024, 1024, threads, reps);
    bench_sgemm(64, 16384, 576, threads, reps);
    bench_bf16_matmul(1024, 1024, 1024, threads, reps);
    bench_add(threads, reps);
  }
  return 0;
}
