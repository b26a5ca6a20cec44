// Row reductions (sum, max, min) and arg-reductions over a contiguous [rows, cols] view.
//
// Three shapes of work, one combine rule (the functor's init/combine from tensor/functors.h):
//  - narrow rows (cols < kThreads): one thread per row, combining left to right like the CPU;
//  - wide rows: one block per row; each thread combines a strided slice, then the block combines
//    the threads' partials in a shared-memory tree (log2(256) = 8 steps);
//  - few very wide rows (say a full sum of 10^8 elements): one row would leave all but one SM
//    idle, so pass 1 splits each row into chunks (a block each) and pass 2 reduces the partials.
// Float sums accumulate in the element's compute type (float for float32): the tree keeps the
// error at O(log n) additions deep, where the CPU's serial loop needs its double accumulator.
#pragma nv_diag_suppress 186  // unsigned `x < 0` tests in the generic functors (see elementwise)

#include <type_traits>

#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_loops.cuh"
#include "tensor/functors.h"

namespace ddplab::gpu {

namespace {

constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y; rows beyond it loop

// ---- sum / max / min ---------------------------------------------------------------------------

// One thread per row.
template <class R, class T, class A>
__global__ void reduce_rows_serial(const T* in, int64_t rows, int64_t cols, void* out,
                                   DType out_dtype) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += step) {
    A acc = R::template init<A>();
    for (int64_t j = 0; j < cols; ++j)
      acc = R::combine(acc, static_cast<A>(cast_value<compute_t<T>>(in[r * cols + j])));
    store_as(out, out_dtype, r, acc);
  }
}

// A block per (row, chunk): blockIdx.x is the chunk, blockIdx.y (grid-strided) the row. Writes the
// chunk's result to partial[row * chunks + chunk], or, with one chunk, to the output row.
template <class R, class T, class A>
__global__ void reduce_rows_block(const T* in, int64_t rows, int64_t cols, int64_t chunk_len,
                                  A* partial, void* out, DType out_dtype) {
  __shared__ A buf[kThreads];
  const int64_t chunks = gridDim.x;
  const int64_t begin = blockIdx.x * chunk_len;
  const int64_t end = begin + chunk_len < cols ? begin + chunk_len : cols;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    A acc = R::template init<A>();
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
      acc = R::combine(acc, static_cast<A>(cast_value<compute_t<T>>(in[r * cols + j])));
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (static_cast<int>(threadIdx.x) < s)
        buf[threadIdx.x] = R::combine(buf[threadIdx.x], buf[threadIdx.x + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (partial != nullptr) {
        partial[r * chunks + blockIdx.x] = buf[0];
      } else {
        store_as(out, out_dtype, r, buf[0]);
      }
    }
    __syncthreads();  // buf is reused by the next row
  }
}

unsigned grid_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>(
      std::min<int64_t>((n + per_block - 1) / per_block, int64_t{1} << 16));
}

template <class R, class T>
void reduce_typed(int device, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  using A = typename functors::reduce_acc<R, compute_t<T>, true>::type;
  cudaStream_t s = current_stream(device).handle();
  const auto* x = static_cast<const T*>(in.raw_data());
  void* o = out.raw_data();
  const DType odt = out.dtype();
  if (cols < kThreads) {
    reduce_rows_serial<R, T, A>
        <<<grid_for(rows, kThreads), kThreads, 0, s>>>(x, rows, cols, o, odt);
    DDP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto grid_y = static_cast<unsigned>(std::min(rows, kMaxGridY));
  // Enough chunks to give each SM a few blocks when rows alone cannot (132 SMs on an H100).
  constexpr int64_t kMinChunk = 16384, kWantBlocks = 512;
  int64_t chunks = 1;
  if (rows < kWantBlocks && cols >= 2 * kMinChunk)
    chunks = std::min(cols / kMinChunk, (kWantBlocks + rows - 1) / rows);
  if (chunks == 1) {
    reduce_rows_block<R, T, A>
        <<<dim3(1, grid_y), kThreads, 0, s>>>(x, rows, cols, cols, nullptr, o, odt);
    DDP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t chunk_len = (cols + chunks - 1) / chunks;
  // The partials live on the same stream, so the allocator may hand the block out again as soon as
  // it is freed below: later work on this stream runs after pass 2.
  DataPtr tmp = cuda_allocator(device).allocate(static_cast<size_t>(rows * chunks) * sizeof(A));
  auto* partial = static_cast<A*>(tmp.get());
  reduce_rows_block<R, T, A><<<dim3(static_cast<unsigned>(chunks), grid_y), kThreads, 0, s>>>(
      x, rows, cols, chunk_len, partial, nullptr, odt);
  DDP_CUDA_CHECK(cudaGetLastError());
  reduce_rows_block<R, A, A>
      <<<dim3(1, grid_y), kThreads, 0, s>>>(partial, rows, chunks, chunks, nullptr, o, odt);
  DDP_CUDA_CHECK(cudaGetLastError());
}

template <class R>
void reduce_op(int device, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  DDP_DISPATCH_ALL(in.dtype(), "reduce", reduce_typed<R, scalar_t>(device, out, in, rows, cols));
}

// ---- argmax / argmin
// -----------------------------------------------------------------------------

// Is candidate (v, i) better than the best so far (bv, bi)? bi < 0 means "none yet". NaN beats
// every number (as in PyTorch), and among equals the first index wins, so the answer does not
// depend on how the row was split between threads.
template <bool kMax, class C>
__device__ __forceinline__ bool arg_better(C v, int64_t i, C bv, int64_t bi) {
  if (bi < 0) return i >= 0;
  if (i < 0) return false;
  const bool vn = functors::m::isnan(v), bn = functors::m::isnan(bv);
  if (vn || bn) return vn && bn ? i < bi : vn;
  if (v == bv) return i < bi;
  return kMax ? v > bv : v < bv;
}

template <bool kMax, class T>
__global__ void arg_reduce_serial(const T* in, int64_t rows, int64_t cols, int64_t* out) {
  using C = compute_t<T>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += step) {
    C best = C(0);
    int64_t bi = -1;
    for (int64_t j = 0; j < cols; ++j) {
      const auto v = static_cast<C>(in[r * cols + j]);
      if (arg_better<kMax>(v, j, best, bi)) {
        best = v;
        bi = j;
      }
    }
    out[r] = bi < 0 ? 0 : bi;
  }
}

template <bool kMax, class T>
__global__ void arg_reduce_block(const T* in, int64_t rows, int64_t cols, int64_t* out) {
  using C = compute_t<T>;
  __shared__ C vals[kThreads];
  __shared__ int64_t idxs[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    C best = C(0);
    int64_t bi = -1;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const auto v = static_cast<C>(in[r * cols + j]);
      if (arg_better<kMax>(v, j, best, bi)) {
        best = v;
        bi = j;
      }
    }
    vals[threadIdx.x] = best;
    idxs[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      const int t = static_cast<int>(threadIdx.x);
      if (t < s && arg_better<kMax>(vals[t + s], idxs[t + s], vals[t], idxs[t])) {
        vals[t] = vals[t + s];
        idxs[t] = idxs[t + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = idxs[0] < 0 ? 0 : idxs[0];
    __syncthreads();
  }
}

template <bool kMax, class T>
void arg_reduce_typed(int device, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  cudaStream_t s = current_stream(device).handle();
  const auto* x = static_cast<const T*>(in.raw_data());
  auto* o = static_cast<int64_t*>(out.raw_data());
  if (cols < kThreads) {
    arg_reduce_serial<kMax, T><<<grid_for(rows, kThreads), kThreads, 0, s>>>(x, rows, cols, o);
  } else {
    arg_reduce_block<kMax, T><<<grid_for(rows, 1), kThreads, 0, s>>>(x, rows, cols, o);
  }
  DDP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void reduce(int device, RowReduceOp op, const Tensor& out, const Tensor& in, int64_t rows,
            int64_t cols) {
  DDP_CHECK(in.is_contiguous() && out.is_contiguous(), "reduce: expects contiguous tensors");
  if (rows == 0) return;
  switch (op) {
#define DDP_REDUCE_CASE(name, functor)                         \
  case RowReduceOp::name:                                      \
    reduce_op<functors::functor>(device, out, in, rows, cols); \
    return;
    DDP_REDUCE_OPS(DDP_REDUCE_CASE)
#undef DDP_REDUCE_CASE
  }
  DDP_FAIL("reduce: unknown op " << static_cast<int>(op));
}

void arg_reduce(int device, bool is_max, const Tensor& out, const Tensor& in, int64_t rows,
                int64_t cols) {
  DDP_CHECK(in.is_contiguous() && out.is_contiguous(), "arg_reduce: expects contiguous tensors");
  DDP_CHECK(out.dtype() == kInt64, "arg_reduce: output must be int64");
  if (rows == 0) return;
  if (is_max) {
    DDP_DISPATCH_NUMERIC(in.dtype(), "argmax",
                         arg_reduce_typed<true, scalar_t>(device, out, in, rows, cols));
  } else {
    DDP_DISPATCH_NUMERIC(in.dtype(), "argmin",
                         arg_reduce_typed<false, scalar_t>(device, out, in, rows, cols));
  }
}

}  // namespace ddplab::gpu
