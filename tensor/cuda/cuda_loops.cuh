// How a functor becomes a CUDA kernel: the strided-offset calculator, dtype conversion helpers and
// the grid-stride launcher shared by the elementwise, index and random kernels.
//
// A "loop" is a small struct with `__device__ void operator()(int64_t i) const` that processes
// element i (row-major over the common shape). It holds the data pointers, the op parameters and
// an indexer that turns i into one element offset per tensor. `launch(n, loop)` runs it over
// 0..n-1 with a grid-stride loop on the current stream. The math itself is never here: loops call
// the DDP_HD functors of tensor/functors.h, the same ones the CPU loops call.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ddplab::gpu {

// Dims left after merging; more than this and the op fails with a clear error (no real tensor
// layout needs it: contiguous runs of dims merge into one).
constexpr int kMaxDims = 8;

// Element offsets of N tensors that share a shape but not strides. Passed to kernels by value.
template <int N>
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int t = 0; t < N; ++t) off[t] = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= ndim) continue;
      const int64_t idx = i % sizes[d];
      i /= sizes[d];
#pragma unroll
      for (int t = 0; t < N; ++t) off[t] += idx * strides[t][d];
    }
  }
};

// The fast path: every tensor contiguous, element i is at offset i in each.
template <int N>
struct ContiguousIndexer {
  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int t = 0; t < N; ++t) off[t] = i;
  }
};

inline bool all_contiguous(const std::vector<const Tensor*>& ts) {
  for (const Tensor* t : ts)
    if (!t->is_contiguous()) return false;
  return true;
}

// Builds the indexer for tensors of one shape: drops size-1 dims and merges dims that are
// contiguous with their inner neighbour in every tensor, so [64, 3, 32, 32] contiguous becomes one
// dim, and a broadcast [N, C] + [C] stays two.
template <int N>
StridedIndexer<N> make_strided_indexer(const std::vector<const Tensor*>& ts) {
  const Shape& shape = ts[0]->shape();
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides(N);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (int t = 0; t < N && merge; ++t)
      merge = strides[t].back() == ts[t]->strides()[d] * shape[d];
    if (merge) {
      sizes.back() *= shape[d];
      for (int t = 0; t < N; ++t) strides[t].back() = ts[t]->strides()[d];
    } else {
      sizes.push_back(shape[d]);
      for (int t = 0; t < N; ++t) strides[t].push_back(ts[t]->strides()[d]);
    }
  }
  DDP_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims),
            "CUDA kernels support up to " << kMaxDims << " non-mergeable dims, got shape "
                                          << shape_str(shape));
  StridedIndexer<N> ix;
  ix.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = sizes[static_cast<size_t>(d)];
    for (int t = 0; t < N; ++t) ix.strides[t][d] = strides[t][static_cast<size_t>(d)];
  }
  return ix;
}

// ---- dtype conversion (the same rule as the CPU: through the compute type)
// -----------------------

template <class D, class S>
__device__ __forceinline__ D cast_value(S v) {
  return static_cast<D>(static_cast<compute_t<S>>(v));
}

// Writes v, cast to the C++ type of `dt` (scalar_t in each case), into element i of an array of
// runtime dtype `dt`. The switch is uniform across a warp, so it costs little, and it spares an
// instantiation per (input, output) dtype pair.
template <class S>
__device__ __forceinline__ void store_as(void* base, DType dt, int64_t i, S v) {
  switch (dt) { DDP_ALL_CASES(static_cast<scalar_t*>(base)[i] = cast_value<scalar_t>(v)) }
}

// Reads an index tensor element (int64 or int32).
__device__ __forceinline__ int64_t load_index(const void* base, bool is_int32, int64_t i) {
  return is_int32 ? static_cast<const int32_t*>(base)[i] : static_cast<const int64_t*>(base)[i];
}

// ---- launching
// -------------------------------------------------------------------------------------

template <class Loop>
__global__ void run_loop(int64_t n, Loop loop) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    loop(i);
}

constexpr int kThreads = 256;

// Runs loop(i) for i in [0, n) on the current stream of `device`. The grid is capped (a grid-
// stride loop covers the rest): past a few blocks per SM more blocks only add scheduling work.
template <class Loop>
void launch(int device, int64_t n, const Loop& loop) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16);
  cudaStream_t stream = current_stream(device).handle();
  run_loop<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, loop);
  DDP_CUDA_CHECK(cudaGetLastError());
}

// Launches `Loop<Indexer>` with the contiguous fast path when every tensor allows it.
// `make` builds the loop from an indexer.
template <int N, class Make>
void launch_strided(int device, const std::vector<const Tensor*>& ts, int64_t n, Make make) {
  if (all_contiguous(ts)) {
    launch(device, n, make(ContiguousIndexer<N>{}));
  } else {
    launch(device, n, make(make_strided_indexer<N>(ts)));
  }
}

}  // namespace ddplab::gpu
