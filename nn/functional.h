// Differentiable neural-network functions (PyTorch's torch.nn.functional), used by the layers in
// nn/ and usable directly. Each records its own autograd node with a hand-written backward.
//
// On the CPU, convolution runs through oneDNN primitives (created once per shape and cached);
// a plain im2col + GEMM version (conv2d_reference) is kept beside it as the readable reference
// the tests compare against. On CUDA, cuDNN.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace ddplab::nn::functional {

using Pair = std::array<int64_t, 2>;

// y = x @ w^T + b, x: [..., in], w: [out, in], b: [out] (optional: undefined Tensor).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// x: [N, C, H, W], w: [O, C/groups, kH, kW], b: [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);
// Same maths through im2col + matmul of the differentiable ops: slow, obviously right.
Tensor conv2d_reference(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(),
                        Pair stride = {1, 1}, Pair padding = {0, 0}, Pair dilation = {1, 1},
                        int64_t groups = 1);

// Training: normalizes with batch statistics and updates running_mean/running_var in place
// (unbiased variance, momentum as in PyTorch); eval: uses the running statistics.
// weight/bias/running stats may be undefined (affine=false, track_running_stats=false).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);

// relu(batch_norm(...)) in one pass over memory forward and one backward (relu's mask folded into
// batch norm's backward): the same numbers as the two calls, bit for bit. The pair that follows
// nearly every convolution in a ResNet.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training,
                       double momentum = 0.1, double eps = 1e-5);

// relu(batch_norm(x, ...) + residual), the end of a residual block, bit for bit the separate
// calls. A channels-last x (with a residual of its shape and dtype) runs one pass over memory
// forward instead of two; the backward is the two calls' backward. Anything else takes the calls.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum = 0.1, double eps = 1e-5);

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

Tensor relu(const Tensor& x);
// relu(a + b) in one pass (a residual connection's end), bit for bit the two calls. a and b of
// one shape; other cases (broadcasting, mixed dtypes) take the two calls.
Tensor add_relu(const Tensor& a, const Tensor& b);
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

enum class Reduction { Mean, Sum, None };
// logits: [N, C], target: [N] int64 class indices. Fused log-softmax + NLL.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean, double label_smoothing = 0.0);
// Fraction of rows whose argmax equals the target (no gradient).
double accuracy(const Tensor& logits, const Tensor& target);

}  // namespace ddplab::nn::functional

namespace ddplab {
namespace F = nn::functional;
}
