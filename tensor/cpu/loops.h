// How the CPU executor walks tensors: strided rows, split across the OpenMP pool.
//
// An elementwise op sees N tensors of one shape with their own strides. We first simplify the
// iteration space: size-1 dims are dropped and neighbouring dims that are laid out back to back
// in every operand are merged ("coalesced"), so a contiguous tensor of any shape becomes one long
// row. Then the space is cut into rows (the innermost dim) and, for long rows, chunks of rows,
// and each piece is handed to `fn(ptrs, strides, n)` - a tight loop the compiler can vectorise
// when the strides are those of contiguous data.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "tensor/tensor.h"
#include "tensor/threads.h"

namespace ddplab::cpu {

constexpr int kMaxDims = 16;

template <int N>
struct StridedSpace {
  int ndim = 0;  // dims ordered innermost first
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];  // in bytes
  char* base[N];
  int64_t numel = 1;

  explicit StridedSpace(const std::array<const Tensor*, N>& ts) {
    const Shape& shape0 = ts[0]->shape();
    int nd = static_cast<int>(shape0.size());
    DDP_CHECK(nd <= kMaxDims, "tensors of more than " << kMaxDims << " dims are not supported");
    for (int k = 0; k < N; ++k) base[k] = static_cast<char*>(ts[k]->raw_data());
    // Walk the dims in the memory order of the first operand (the output), innermost first: for
    // row-major tensors that is the last dim first; for a channels-last one it is C, W, H, N, so
    // an NHWC output and NHWC inputs coalesce into one flat row (Note [Channels last]). Any order
    // visits every element once, and each element's value does not depend on the order.
    int order[kMaxDims];
    for (int i = 0; i < nd; ++i) order[i] = nd - 1 - i;
    const Shape& st0 = ts[0]->strides();
    std::stable_sort(order, order + nd, [&st0](int a, int b) { return st0[a] < st0[b]; });
    for (int i = 0; i < nd; ++i) {
      const int d = order[i];
      int64_t size = shape0[d];
      numel *= size;
      if (size == 1) continue;
      bool merge = ndim > 0;
      for (int k = 0; k < N && merge; ++k) {
        int64_t es = static_cast<int64_t>(element_size(ts[k]->dtype()));
        merge = ts[k]->strides()[d] * es == strides[k][ndim - 1] * shape[ndim - 1];
      }
      if (merge) {
        shape[ndim - 1] *= size;
      } else {
        shape[ndim] = size;
        for (int k = 0; k < N; ++k)
          strides[k][ndim] =
              ts[k]->strides()[d] * static_cast<int64_t>(element_size(ts[k]->dtype()));
        ++ndim;
      }
    }
    if (ndim == 0) {  // a scalar or all-ones shape: one row of one element
      shape[0] = 1;
      for (int k = 0; k < N; ++k) strides[k][0] = 0;
      ndim = 1;
    }
  }
};

// Calls fn(char* ptrs[N], const int64_t strides[N], int64_t n) over the whole space.
template <int N, class Fn>
void for_each_row(const std::array<const Tensor*, N>& ts, const Fn& fn) {
  StridedSpace<N> sp(ts);
  if (sp.numel == 0) return;
  const int64_t row = sp.shape[0];
  const int64_t rows = sp.numel / row;
  int64_t inner_strides[N];
  for (int k = 0; k < N; ++k) inner_strides[k] = sp.strides[k][0];
  const int threads = sp.numel >= kParallelGrain ? omp_get_max_threads() : 1;
  // Long rows are cut in chunks so a single contiguous row still uses every thread.
  int64_t chunk = row;
  if (rows < 4 * threads && threads > 1)
    chunk = std::max<int64_t>(4096, (row + 4 * threads - 1) / (4 * threads));
  const int64_t chunks_per_row = (row + chunk - 1) / chunk;
  const int64_t pieces = rows * chunks_per_row;

#pragma omp parallel for schedule(static) if (threads > 1)
  for (int64_t piece = 0; piece < pieces; ++piece) {
    int64_t r = piece / chunks_per_row;
    int64_t start = (piece % chunks_per_row) * chunk;
    int64_t n = std::min(chunk, row - start);
    char* ptrs[N];
    for (int k = 0; k < N; ++k) ptrs[k] = sp.base[k] + start * inner_strides[k];
    for (int d = 1; d < sp.ndim && r > 0; ++d) {  // row index -> offsets over the outer dims
      int64_t idx = r % sp.shape[d];
      r /= sp.shape[d];
      for (int k = 0; k < N; ++k) ptrs[k] += idx * sp.strides[k][d];
    }
    fn(ptrs, inner_strides, n);
  }
}

}  // namespace ddplab::cpu
