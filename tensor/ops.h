// The raw array operations of ddplab (no autograd): factories, views, copies, elementwise math,
// reductions, matmul, random numbers. Each validates its arguments, works out the output shape,
// and hands the loop to the tensor's device backend (tensor/backend.h).
//
// Naming follows PyTorch (`add`, `sum`, `narrow`, `uniform_`); a trailing underscore means
// in place. The differentiable versions used by nn/ live in autograd/functions.h.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace ddplab::ops {

// --- factories ---------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor arange(double start, double end, double step = 1, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// A CPU tensor holding `values` (row-major), converted to opts.dtype, then moved to opts.device.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = {});
// Wraps existing memory without copying (the caller keeps it alive).
Tensor from_blob(void* data, const Shape& shape, TensorOptions opts = {});

// --- memory formats (Note [Channels last] in tensor/ops_create.cpp) ---------------------------
// How a 4-D [N, C, H, W] tensor's elements lie in memory: Contiguous is row-major NCHW; ChannelsLast
// is NHWC (strides [H*W*C, 1, W*C, C]): the C values of one pixel side by side. Both are dense;
// the shape (and so every index) is the same, only the strides differ. Names as PyTorch's.
enum class MemoryFormat { Contiguous, ChannelsLast };
bool is_contiguous(const Tensor& t, MemoryFormat format);
Tensor empty(const Shape& shape, TensorOptions opts, MemoryFormat format);
// t itself when already in `format`, else a copy in it.
Tensor contiguous(const Tensor& t, MemoryFormat format);
// The format a result computed elementwise from t should take: ChannelsLast for a 4-D tensor laid
// out channels-last (and not also row-major, as when C == 1), else Contiguous.
MemoryFormat suggest_memory_format(const Tensor& t);

// --- views (share storage) ----------------------------------------------------------------------
Tensor view(const Tensor& t, const Shape& shape);     // needs compatible strides; -1 infers a dim
Tensor reshape(const Tensor& t, const Shape& shape);  // a view when possible, else a copy
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);  // broadcast: size-1 dims get stride 0
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);

// --- copies
// ---------------------------------------------------------------------------------------
Tensor contiguous(const Tensor& t);  // t itself when already contiguous
Tensor clone(const Tensor& t);
// Copies src into dst (broadcasting src), converting dtype and moving across devices. With
// non_blocking, a host<->CUDA copy from pinned memory is queued on the current stream.
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);
Tensor to(const Tensor& t, DType dtype);
Tensor to(const Tensor& t, Device device, bool non_blocking = false);
Tensor pin_memory(const Tensor& t);
void fill_(const Tensor& t, double value);
void zero_(const Tensor& t);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// out[i] = t[index[i]] along dim (index: int64 1-D).
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
// out[i][j] = t[i][index[i][j]] along dim (as torch.gather).
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
// dst[i][index[i][j]] += src[i][j] along dim, in place (as torch.scatter_add_).
void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src);

// --- elementwise: one functor per op in tensor/functors.h, run by every backend
// ---------------------
Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor relu(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor sign(const Tensor& t);
Tensor reciprocal(const Tensor& t);
Tensor square(const Tensor& t);
Tensor clamp(const Tensor& t, std::optional<double> lo, std::optional<double> hi);
Tensor pow(const Tensor& t, double exponent);
Tensor add(const Tensor& t, double s);
Tensor sub(const Tensor& t, double s);
Tensor mul(const Tensor& t, double s);
Tensor div(const Tensor& t, double s);
Tensor rsub(const Tensor& t, double s);  // s - t
// isfinite as a bool tensor (used by loss scaling to find inf/NaN).
Tensor isfinite(const Tensor& t);

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Fused gradient helpers (one pass instead of three; also run by both executors).
Tensor relu_backward(const Tensor& grad, const Tensor& input);      // grad * (input > 0)
Tensor sigmoid_backward(const Tensor& grad, const Tensor& output);  // grad * y * (1 - y)
Tensor tanh_backward(const Tensor& grad, const Tensor& output);     // grad * (1 - y^2)

// In place: the result is written into `t` (its shape must be the broadcast shape).
void neg_(const Tensor& t);
void exp_(const Tensor& t);
void log_(const Tensor& t);
void sqrt_(const Tensor& t);
void relu_(const Tensor& t);
void sigmoid_(const Tensor& t);
void tanh_(const Tensor& t);
void clamp_(const Tensor& t, std::optional<double> lo, std::optional<double> hi);
void add_(const Tensor& t, double s);
void mul_(const Tensor& t, double s);
void add_(const Tensor& t, const Tensor& other, double alpha = 1);
void sub_(const Tensor& t, const Tensor& other, double alpha = 1);
void mul_(const Tensor& t, const Tensor& other);
void div_(const Tensor& t, const Tensor& other);
// t = t * beta + other * alpha in one pass (optimizers' workhorse).
void axpby_(const Tensor& t, double beta, const Tensor& other, double alpha);
// out = t * s written into an existing tensor of t's shape in one pass, never reading out (DDP
// copies each gradient into its bucket slot already divided by the world size).
void mul_out(const Tensor& out, const Tensor& t, double s);

// --- reductions: dims empty means all dims
// --------------------------------------------------------
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// var with Bessel's correction by default (correction=1), as torch.var.
Tensor var(const Tensor& t, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor norm(const Tensor& t, double p = 2, const std::vector<int64_t>& dims = {},
            bool keepdim = false);
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // int64
};
ValuesIndices max(const Tensor& t, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& t, int64_t dim, bool keepdim = false);
// Sum of a tensor as a double on the host (tests, metrics).
double sum_all(const Tensor& t);
// True if every element is finite.
bool all_finite(const Tensor& t);

// --- linear algebra
// ------------------------------------------------------------------------------- matmul with
// PyTorch's rules: 1-D x 1-D dot, 2-D mm, batched with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// out = beta * out + alpha * op(a) @ op(b) for 2-D tensors, op = transpose when the flag is set.
void gemm_(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
           double alpha = 1, double beta = 0);

// --- random: counter-based (Philox 4x32-10), so a seed gives the same numbers on CPU and GPU
// ------
void uniform_(const Tensor& t, double lo = 0, double hi = 1, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
// Each element 1 with probability p, else 0 (in t's dtype).
void bernoulli_(const Tensor& t, double p, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randperm(int64_t n, Generator* gen = nullptr, TensorOptions opts = kInt64);
// Uniform integers in [lo, hi) (int64).
Tensor randint(int64_t lo, int64_t hi, const Shape& shape, Generator* gen = nullptr,
               TensorOptions opts = kInt64);

// --- comparison helpers for tests
// --------------------------------------------------------------------
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// max |a - b| / max(|b|, tiny) over all elements, computed in float64.
double max_rel_error(const Tensor& a, const Tensor& b);
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace ddplab::ops
