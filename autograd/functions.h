// The differentiable tensor operations (namespace ddplab): what models and nn/ are written in.
//
// Each function computes its result with the raw op of the same name in tensor/ops.h and, when
// grad mode is on and an input requires grad, records a node whose backward is written next to
// it (autograd/functions_*.cpp). Shapes, broadcasting and dtype promotion follow ops:: (and
// PyTorch). Inputs that are integer or bool tensors (indices, masks) never receive gradients.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ddplab {

// --- elementwise (broadcasting binary ops; gradients are summed back to each input's shape) ---
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor rdiv(const Tensor& a, double s);  // s / a
Tensor neg(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor pow(const Tensor& t, double exponent);
Tensor pow(const Tensor& a, const Tensor& b);  // d/db = a^b * log(a), taken as 0 where a == 0
Tensor square(const Tensor& t);
Tensor abs(const Tensor& t);   // gradient sign(x): 0 at x == 0
Tensor relu(const Tensor& t);  // gradient 0 at x == 0
Tensor sigmoid(const Tensor& t);
Tensor tanh(const Tensor& t);
// Gradient flows where lo <= x <= hi.
Tensor clamp(const Tensor& t, std::optional<double> lo, std::optional<double> hi);
// Ties (a == b) split the gradient evenly, as PyTorch does.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// cond: bool tensor (no gradient); a and b broadcast with it.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator-(const Tensor& a);

// --- reductions: dims empty means all dims ---------------------------------------------------
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& t, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
// Gradient split evenly between tied maxima (as torch.amax).
Tensor amax(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Values and int64 indices along dim; the gradient goes to the returned index only.
ops::ValuesIndices max(const Tensor& t, int64_t dim, bool keepdim = false);
ops::ValuesIndices min(const Tensor& t, int64_t dim, bool keepdim = false);

// --- linear algebra ----------------------------------------------------------------------------
// PyTorch's matmul rules (1-D dot, 2-D mm, batched with broadcast batch dims). Backward runs
// ops::gemm_ with transpose flags: no transposed copy of an operand is made.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);

// --- shape and views ---------------------------------------------------------------------------
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor view(const Tensor& t, const Shape& shape);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim = std::nullopt);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor contiguous(const Tensor& t);  // t itself when already contiguous (as PyTorch)
Tensor clone(const Tensor& t);
// index: int64 1-D. Backward adds rows back (repeated indices accumulate).
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
Tensor to(const Tensor& t, DType dtype);  // t itself when the dtype already matches
Tensor to(const Tensor& t, Device device, bool non_blocking = false);

// Same storage, outside the graph (a free-function spelling of Tensor::detach).
Tensor detach(const Tensor& t);

}  // namespace ddplab
