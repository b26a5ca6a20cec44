// Kernels that are not one functor per element: random fills, index_select, gather and
// scatter_add.
//
// Random: element i is random_element(...) of tensor/random.h, the same DDP_HD function the CPU
// loop calls, converted the same way, so a seed gives the same tensor on either device.
//
// Indexing: a kernel cannot throw, so an out-of-range index sets a flag on the device, which the
// host reads back after the kernel and turns into an Error. That costs one stream synchronization
// per indexing op, the price of a clear message instead of silently wrong values (PyTorch instead
// stops the whole CUDA context with a device-side assert).
#include <cstring>
#include <mutex>
#include <vector>

#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_loops.cuh"
#include "tensor/random.h"

namespace ddplab::gpu {

namespace {

// ---- random -------------------------------------------------------------------------------------

template <class T>
struct RandomLoop {
  T* out;
  RandomKind kind;
  uint64_t seed, offset;
  double a, b;
  __device__ void operator()(int64_t i) const {
    out[i] = static_cast<T>(static_cast<compute_t<T>>(
        random_element(kind, seed, offset, static_cast<uint64_t>(i), a, b)));
  }
};

// ---- index error flag
// ----------------------------------------------------------------------------

// One int per device, set by a kernel that met an index out of range.
int* index_error_flag(int device) {
  static std::mutex mu;
  static std::vector<DataPtr> flags;  // kept for the life of the process
  std::lock_guard<std::mutex> lock(mu);
  if (flags.empty()) flags.resize(static_cast<size_t>(device_count()));
  DataPtr& f = flags[static_cast<size_t>(device)];
  if (f == nullptr) {
    f = cuda_allocator(device).allocate(sizeof(int));
    DDP_CUDA_CHECK(cudaMemsetAsync(f.get(), 0, sizeof(int), current_stream(device).handle()));
  }
  return static_cast<int*>(f.get());
}

// Waits for the kernel and throws if it met a bad index (resetting the flag for the next op).
void check_index_flag(int device, int* flag, const char* what, int64_t n) {
  cudaStream_t s = current_stream(device).handle();
  int bad = 0;
  DDP_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad != 0) {
    DDP_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
    DDP_FAIL(what << ": index out of range [0, " << n << ") on cuda:" << device);
  }
}

// ---- indexing loops (all tensors contiguous, viewed as [outer, n, inner])
// ------------------------

struct IndexArgs {
  const void* index;
  bool index_int32;
  int64_t in_n, idx_n, inner;
  int* flag;
};

template <class T>
struct IndexSelectLoop {  // out[o, k, j] = in[o, index[k], j]
  T* out;
  const T* in;
  IndexArgs g;
  __device__ void operator()(int64_t i) const {
    const int64_t j = i % g.inner, r = i / g.inner, k = r % g.idx_n, o = r / g.idx_n;
    const int64_t idx = load_index(g.index, g.index_int32, k);
    if (idx < 0 || idx >= g.in_n) {
      *g.flag = 1;
      return;
    }
    out[i] = in[(o * g.in_n + idx) * g.inner + j];
  }
};

template <class T>
struct GatherLoop {  // out[o, k, j] = in[o, index[o, k, j], j]
  T* out;
  const T* in;
  IndexArgs g;
  __device__ void operator()(int64_t i) const {
    const int64_t j = i % g.inner, o = i / g.inner / g.idx_n;
    const int64_t idx = load_index(g.index, g.index_int32, i);
    if (idx < 0 || idx >= g.in_n) {
      *g.flag = 1;
      return;
    }
    out[i] = in[(o * g.in_n + idx) * g.inner + j];
  }
};

// Atomic add for every dtype: native atomics where CUDA has them, otherwise a compare-and-swap
// loop on the aligned 32-bit word that holds the 8- or 16-bit element.
template <class T>
__device__ void atomic_add(T* addr, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, int32_t>) {
    atomicAdd(addr, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: adding as unsigned gives the signed sum.
    atomicAdd(reinterpret_cast<unsigned long long*>(addr), static_cast<unsigned long long>(v));
  } else {
    static_assert(sizeof(T) <= 2, "atomic_add: unexpected element size");
    const auto a = reinterpret_cast<uintptr_t>(addr);
    auto* word = reinterpret_cast<unsigned int*>(a & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(a & 3) * 8;
    const unsigned mask = (sizeof(T) == 2 ? 0xffffu : 0xffu) << shift;
    unsigned old = *word, assumed = 0;
    do {
      assumed = old;
      const unsigned cur_bits = (assumed & mask) >> shift;
      T cur;
      memcpy(&cur, &cur_bits, sizeof(T));  // little-endian: the low bytes
      const T sum = static_cast<T>(static_cast<compute_t<T>>(cur) + static_cast<compute_t<T>>(v));
      unsigned sum_bits = 0;
      memcpy(&sum_bits, &sum, sizeof(T));
      old = atomicCAS(word, assumed, (assumed & ~mask) | ((sum_bits << shift) & mask));
    } while (assumed != old);
  }
}

template <class T>
struct ScatterAddLoop {  // dst[o, index[o, k, j], j] += src[o, k, j]
  T* dst;
  const T* src;
  IndexArgs g;  // in_n: dst_n
  __device__ void operator()(int64_t i) const {
    const int64_t j = i % g.inner, o = i / g.inner / g.idx_n;
    const int64_t idx = load_index(g.index, g.index_int32, i);
    if (idx < 0 || idx >= g.in_n) {
      *g.flag = 1;
      return;
    }
    atomic_add(&dst[(o * g.in_n + idx) * g.inner + j], src[i]);
  }
};

void check_contiguous(const char* what, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    DDP_CHECK(t->is_contiguous(), what << ": the CUDA backend expects contiguous tensors");
}

IndexArgs index_args(int device, const Tensor& index, int64_t n, int64_t idx_n, int64_t inner) {
  DDP_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32,
            "index tensors must be int64 or int32, got " << dtype_name(index.dtype()));
  return IndexArgs{index.raw_data(),        index.dtype() == kInt32, n, idx_n, inner,
                   index_error_flag(device)};
}

}  // namespace

void random(int device, RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
            uint64_t offset) {
  check_contiguous("random", {&t});
  DDP_DISPATCH_NUMERIC(t.dtype(), "random", {
    launch(device, t.numel(),
           RandomLoop<scalar_t>{static_cast<scalar_t*>(t.raw_data()), kind, seed, offset, a, b});
  });
}

void index_select(int device, const Tensor& out, const Tensor& in, const Tensor& index,
                  int64_t outer, int64_t in_n, int64_t inner) {
  check_contiguous("index_select", {&out, &in, &index});
  const int64_t idx_n = index.numel();
  if (out.numel() == 0) return;
  IndexArgs g = index_args(device, index, in_n, idx_n, inner);
  DDP_DISPATCH_ALL(in.dtype(), "index_select", {
    launch(device, outer * idx_n * inner,
           IndexSelectLoop<scalar_t>{static_cast<scalar_t*>(out.raw_data()),
                                     static_cast<const scalar_t*>(in.raw_data()), g});
  });
  check_index_flag(device, g.flag, "index_select", in_n);
}

void gather(int device, const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
            int64_t in_n, int64_t idx_n, int64_t inner) {
  check_contiguous("gather", {&out, &in, &index});
  if (out.numel() == 0) return;
  IndexArgs g = index_args(device, index, in_n, idx_n, inner);
  DDP_DISPATCH_ALL(in.dtype(), "gather", {
    launch(device, outer * idx_n * inner,
           GatherLoop<scalar_t>{static_cast<scalar_t*>(out.raw_data()),
                                static_cast<const scalar_t*>(in.raw_data()), g});
  });
  check_index_flag(device, g.flag, "gather", in_n);
}

void scatter_add(int device, const Tensor& dst, const Tensor& src, const Tensor& index,
                 int64_t outer, int64_t dst_n, int64_t idx_n, int64_t inner) {
  check_contiguous("scatter_add", {&dst, &src, &index});
  if (src.numel() == 0) return;
  DDP_CHECK(src.dtype() == dst.dtype(), "scatter_add: src and dst dtypes differ");
  IndexArgs g = index_args(device, index, dst_n, idx_n, inner);
  DDP_DISPATCH_NUMERIC(dst.dtype(), "scatter_add", {
    launch(device, outer * idx_n * inner,
           ScatterAddLoop<scalar_t>{static_cast<scalar_t*>(dst.raw_data()),
                                    static_cast<const scalar_t*>(src.raw_data()), g});
  });
  check_index_flag(device, g.flag, "scatter_add", dst_n);
}

}  // namespace ddplab::gpu
