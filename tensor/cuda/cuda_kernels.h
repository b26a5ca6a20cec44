// The host-side entry points of the CUDA kernels, one per Backend operation (see backend.h for
// what each computes). CudaBackend (cuda_backend.cpp) selects the device and forwards here; the
// kernels live in cuda_elementwise.cu, cuda_index.cu, cuda_reduce.cu, and GEMM in cuda_blas.cpp.
// Every function queues work on the current stream of the tensors' device and returns at once.
#pragma once

#include <cstdint>

#include "tensor/backend.h"

namespace ddplab::gpu {

void unary(int device, UnaryOp op, const Tensor& out, const Tensor& in, double a, double b);
void binary(int device, BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y,
            double alpha, double beta);
void where(int device, const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void copy(int device, const Tensor& dst, const Tensor& src);
void fill(int device, const Tensor& t, double value);

void reduce(int device, RowReduceOp op, const Tensor& out, const Tensor& in, int64_t rows,
            int64_t cols);
void arg_reduce(int device, bool is_max, const Tensor& out, const Tensor& in, int64_t rows,
                int64_t cols);

void gemm(int device, const GemmArgs& args);

void random(int device, RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
            uint64_t offset);
void index_select(int device, const Tensor& out, const Tensor& in, const Tensor& index,
                  int64_t outer, int64_t in_n, int64_t inner);
void gather(int device, const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
            int64_t in_n, int64_t idx_n, int64_t inner);
void scatter_add(int device, const Tensor& dst, const Tensor& src, const Tensor& index,
                 int64_t outer, int64_t dst_n, int64_t idx_n, int64_t inner);

}  // namespace ddplab::gpu
