// The backend interface: what a device must provide for ddplab to run on it.
//
// The op front-end (tensor/ops_*.cpp) checks arguments, computes output shapes, broadcasts inputs
// (stride-0 views) and allocates outputs; a backend only runs loops. It receives tensors of
// identical shape with arbitrary strides, and runs the functor named by the op enum (the functors
// are shared by all backends: tensor/functors.h). The CPU backend is always present; the CUDA
// backend registers itself when ddplab is built with CUDA.
#pragma once

#include <cstdint>

#include "tensor/op_list.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace ddplab {

#define DDP_ENUM_ENTRY(name, functor) name,
enum class UnaryOp { DDP_UNARY_OPS(DDP_ENUM_ENTRY) };
enum class BinaryOp { DDP_BINARY_OPS(DDP_ENUM_ENTRY) };
// Each row of a [rows, cols] view reduced to one value. (Not "ReduceOp": that name belongs to
// the collectives, distributed::ReduceOp, as in PyTorch.)
enum class RowReduceOp { DDP_REDUCE_OPS(DDP_ENUM_ENTRY) };
#undef DDP_ENUM_ENTRY

// Row-major GEMM on raw pointers: C = alpha * op(A) @ op(B) + beta * C, `batch` times.
// op(A) is m x k: A is stored m x k (lda >= k), or k x m when trans_a (lda >= m).
struct GemmArgs {
  DType dtype = kFloat32;  // of A, B and C
  // Mixed precision: A and B are 16-bit (dtype), C is float32 and the products accumulate in
  // float32 (autocast's linear layers): bfloat16 on the CPU, bfloat16 or float16 on CUDA.
  bool float32_c = false;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1, beta = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements, between batch entries
};

class Backend {
 public:
  virtual ~Backend() = default;

  // out = f(in; a, b). out and in have the same shape; in may be a broadcast (stride-0) view.
  virtual void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) = 0;
  // out = f(x, y; alpha, beta); x and y have out's dtype (or out is bool for predicates).
  virtual void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y,
                      double alpha, double beta) = 0;
  // out = cond ? a : b (cond bool).
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  // dst = src (same device, same shape, dtypes may differ).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  virtual void fill(const Tensor& t, double value) = 0;
  // in: contiguous [rows, cols]; out: contiguous [rows]. Reduces each row.
  virtual void reduce(RowReduceOp op, const Tensor& out, const Tensor& in, int64_t rows,
                      int64_t cols) = 0;
  // Like reduce with Max/Min, but writes the column index (int64) of the first extreme value.
  virtual void arg_reduce(bool is_max, const Tensor& out, const Tensor& in, int64_t rows,
                          int64_t cols) = 0;
  virtual void gemm(const GemmArgs& args) = 0;
  // Fills contiguous t with element i = random_element(kind, seed, offset, i, a, b) of
  // tensor/random.h; the front-end is fill_random in tensor/ops_create.cpp.
  virtual void random(RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
                      uint64_t offset) = 0;
  // Views as [outer, n, inner] (contiguous). out[o, i, j] = in[o, index[i], j].
  virtual void index_select(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                            int64_t in_n, int64_t inner) = 0;
  // Views as [outer, n, inner] (contiguous): gather reads in[o, index[o, i, j], j];
  // scatter_add adds src[o, i, j] into dst[o, index[o, i, j], j].
  virtual void gather(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                      int64_t in_n, int64_t idx_n, int64_t inner) = 0;
  virtual void scatter_add(const Tensor& dst, const Tensor& src, const Tensor& index, int64_t outer,
                           int64_t dst_n, int64_t idx_n, int64_t inner) = 0;
  // Copies between this device and the host (either side may be the host). Only device backends.
  virtual void copy_across_devices(const Tensor& dst, const Tensor& src, bool non_blocking);
  // Waits for all queued work on the device.
  virtual void synchronize() {}
};

// The backend that runs tensors on `d`: the CPU backend, or the CUDA backend (an Error naming the
// device when ddplab was built without CUDA or no GPU is present).
Backend& backend_for(Device d);

// CUDA availability, answered without crashing on machines without a GPU.
bool cuda_is_available();
int cuda_device_count();

}  // namespace ddplab
