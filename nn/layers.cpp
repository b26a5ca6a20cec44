// The standard layers (see nn/layers.h).
#include "nn/layers.h"

#include <atomic>
#include <cmath>
#include <sstream>
#include <typeinfo>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "nn/init.h"
#include "tensor/env_switch.h"
#include "tensor/ops.h"

namespace ddplab::nn {

namespace {
std::string pair_str(Pair p) {
  std::ostringstream os;
  os << "(" << p[0] << ", " << p[1] << ")";
  return os.str();
}

// PyTorch's default for Linear and Conv2d (reset_parameters): kaiming_uniform_ with a = sqrt(5)
// gives U(+-1/sqrt(fan_in)) for the weight, and the bias gets the same bound.
void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).fan_in;
    double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

// --- Linear ------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features(in_features), out_features(out_features) {
  DDP_CHECK(in_features > 0 && out_features > 0,
            "Linear: features must be positive, got " << in_features << " -> " << out_features);
  weight = register_parameter("weight", ops::empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", ops::empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() {
  default_init(weight, bias);
}

Tensor Linear::forward(const Tensor& x) {
  return functional::linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features
     << ", bias=" << (bias.defined() ? "True" : "False");
  return os.str();
}

// --- Conv2d ------------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions options)
    : in_channels(in_channels),
      out_channels(out_channels),
      kernel_size(kernel_size),
      options(options) {
  DDP_CHECK(
      options.groups > 0 && in_channels % options.groups == 0 && out_channels % options.groups == 0,
      "Conv2d: channels " << in_channels << " -> " << out_channels
                          << " are not divisible by groups=" << options.groups);
  weight = register_parameter("weight", ops::empty({out_channels, in_channels / options.groups,
                                                    kernel_size[0], kernel_size[1]}));
  if (options.bias) bias = register_parameter("bias", ops::empty({out_channels}));
  reset_parameters();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
               int64_t padding, bool bias)
    : Conv2d(in_channels, out_channels, Pair{kernel_size, kernel_size},
             Conv2dOptions{{stride, stride}, {padding, padding}, {1, 1}, 1, bias}) {}

void Conv2d::reset_parameters() {
  default_init(weight, bias);
}

Tensor Conv2d::forward(const Tensor& x) {
  return functional::conv2d(x, weight, bias, options.stride, options.padding, options.dilation,
                            options.groups);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << in_channels << ", " << out_channels << ", kernel_size=" << pair_str(kernel_size)
     << ", stride=" << pair_str(options.stride);
  if (options.padding != Pair{0, 0}) os << ", padding=" << pair_str(options.padding);
  if (options.dilation != Pair{1, 1}) os << ", dilation=" << pair_str(options.dilation);
  if (options.groups != 1) os << ", groups=" << options.groups;
  if (!bias.defined()) os << ", bias=False";
  return os.str();
}

// --- BatchNorm2d -------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine,
                         bool track_running_stats)
    : num_features(num_features),
      eps(eps),
      momentum(momentum),
      affine(affine),
      track_running_stats(track_running_stats) {
  if (affine) {
    weight = register_parameter("weight", ops::empty({num_features}));
    bias = register_parameter("bias", ops::empty({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", ops::empty({num_features}));
    running_var = register_buffer("running_var", ops::empty({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", ops::zeros({}, kInt64));
  }
  reset_parameters();
}

BatchNorm2d::BatchNorm2d(const BatchNorm2d& other, ShareState)
    : num_features(other.num_features),
      eps(other.eps),
      momentum(other.momentum),
      affine(other.affine),
      track_running_stats(other.track_running_stats) {
  // Same names in the same order, so state_dict keys do not change.
  if (affine) {
    weight = register_parameter("weight", other.weight, other.weight.requires_grad());
    bias = register_parameter("bias", other.bias, other.bias.requires_grad());
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", other.running_mean);
    running_var = register_buffer("running_var", other.running_var);
    num_batches_tracked = register_buffer("num_batches_tracked", other.num_batches_tracked);
  }
  train(other.is_training());
}

void BatchNorm2d::reset_running_stats() {
  if (!track_running_stats) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNorm2d::reset_parameters() {
  reset_running_stats();
  if (affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  return forward_impl(x, /*fuse_relu=*/false);
}

namespace {
std::atomic<bool>& fused_setting() {
  static std::atomic<bool> on(env_switch_on("DDPLAB_FUSED"));
  return on;
}
}  // namespace

void set_fused_batch_norm(bool on) {
  fused_setting().store(on);
}

bool fused_batch_norm() {
  return fused_setting().load();
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  // typeid, not a virtual: whatever a subclass changes in forward, relu after it is still right.
  if (typeid(*this) != typeid(BatchNorm2d) || !fused_batch_norm()) {
    return functional::relu(forward(x));
  }
  return forward_impl(x, /*fuse_relu=*/true);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  if (typeid(*this) != typeid(BatchNorm2d) || !fused_batch_norm()) {
    return functional::add_relu(forward(x), residual);
  }
  return forward_impl(x, /*fuse_relu=*/true, residual);
}

Tensor BatchNorm2d::forward_impl(const Tensor& x, bool fuse_relu, const Tensor& residual) {
  DDP_CHECK(x.dim() == 4 && x.size(1) == num_features,
            "BatchNorm2d(" << num_features << "): expected input [N, " << num_features
                           << ", H, W], got " << shape_str(x.shape()));
  // Without running statistics, even eval mode normalises with the batch statistics (PyTorch).
  bool use_batch_stats = is_training() || !track_running_stats;
  if (is_training() && track_running_stats) {
    autograd::NoGradGuard no_grad;
    ops::add_(num_batches_tracked, 1.0);
  }
  if (residual.defined()) {
    return functional::batch_norm_add_relu(x, residual, running_mean, running_var, weight, bias,
                                           use_batch_stats, momentum, eps);
  }
  const auto op = fuse_relu ? functional::batch_norm_relu : functional::batch_norm;
  return op(x, running_mean, running_var, weight, bias, use_batch_stats, momentum, eps);
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=" << momentum
     << ", affine=" << (affine ? "True" : "False")
     << ", track_running_stats=" << (track_running_stats ? "True" : "False");
  return os.str();
}

// --- pooling, dropout, reshaping ---------------------------------------------------------------

std::string Pool2d::extra_repr() const {
  return "kernel_size=" + pair_str(kernel) +
         ", stride=" + pair_str(stride == Pair{0, 0} ? kernel : stride) +
         ", padding=" + pair_str(padding);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return functional::max_pool2d(x, kernel, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return functional::avg_pool2d(x, kernel, stride, padding);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return functional::adaptive_avg_pool2d(x, output_size);
}
std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + pair_str(output_size);
}

Tensor Dropout::forward(const Tensor& x) {
  return functional::dropout(x, p, is_training());
}
std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p;
  return os.str();
}

Tensor Flatten::forward(const Tensor& x) {
  return ddplab::flatten(x, start_dim, end_dim);
}

// --- Sequential --------------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<ModulePtr> modules) {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<ModulePtr>& modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr m) {
  add_child(std::to_string(size()), std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& [name, m] : named_children()) y = m->forward(y);
  return y;
}

}  // namespace ddplab::nn
