// The standard layers (PyTorch's torch.nn): Linear, Conv2d, BatchNorm2d, ReLU, MaxPool2d,
// AvgPool2d, AdaptiveAvgPool2d, Dropout, Flatten, Identity, Sequential.
//
// Each layer is a thin Module around a function of nn/functional.h; what it adds is its
// parameters, their PyTorch default initialisation and their PyTorch names (`weight`, `bias`,
// `running_mean`, `running_var`, `num_batches_tracked`).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "nn/module.h"

namespace ddplab::nn {

using Pair = functional::Pair;

// y = x W^T + b. Init: W ~ kaiming_uniform_(a = sqrt(5)) (i.e. U(+-1/sqrt(in))), b ~
// U(+-1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight, bias;  // [out, in], [out] (undefined without bias)
};

struct Conv2dOptions {
  Pair stride{1, 1};
  Pair padding{0, 0};
  Pair dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

// 2-D convolution, weight [out, in/groups, kh, kw]. Init as Linear with fan_in = in/groups*kh*kw.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions options = {});
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t in_channels, out_channels;
  Pair kernel_size;
  Conv2dOptions options;
  Tensor weight, bias;
};

// Whether BatchNorm2d::forward_relu and forward_add_relu run the fused kernels
// (functional::batch_norm_relu, batch_norm_add_relu), the default, or the separate calls they
// equal bit for bit (batch_norm, then relu or add_relu): a switch to compare the two or to
// rule the fused kernels out when a result looks wrong. Starts as DDPLAB_FUSED says (0: off).
void set_fused_batch_norm(bool on);
bool fused_batch_norm();

// Batch normalisation over [N, C, H, W] per channel. weight = 1, bias = 0, running_mean = 0,
// running_var = 1, num_batches_tracked = 0 (int64 scalar), as PyTorch.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  // A layer with `other`'s settings and mode that holds `other`'s parameter and buffer tensors
  // themselves (shared, not copied), so an optimizer or DDP holding them is unaffected. This is
  // how convert_sync_batchnorm / revert_sync_batchnorm (nn/sync_batchnorm.h) change a layer's
  // class without touching its state.
  struct ShareState {};
  BatchNorm2d(const BatchNorm2d& other, ShareState);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)), as one fused op (functional::batch_norm_relu) where this is a plain
  // BatchNorm2d; a subclass with its own forward (SyncBatchNorm) gets the two calls.
  Tensor forward_relu(const Tensor& x);
  // relu(forward(x) + residual), the end of a residual block, likewise fused
  // (functional::batch_norm_add_relu) where this is a plain BatchNorm2d.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return "BatchNorm2d"; }
  std::string extra_repr() const override;
  void reset_running_stats();
  void reset_parameters();

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                    // parameters (affine)
  Tensor running_mean, running_var, num_batches_tracked;  // buffers (track_running_stats)

 private:
  Tensor forward_impl(const Tensor& x, bool fuse_relu, const Tensor& residual = Tensor());
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return functional::relu(x); }
  std::string type_name() const override { return "ReLU"; }
};

// What MaxPool2d and AvgPool2d share: the pooling window and how it prints. stride {0, 0} means
// stride = kernel (PyTorch's default).
class Pool2d : public Module {
 public:
  explicit Pool2d(Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0})
      : kernel(kernel), stride(stride), padding(padding) {}
  explicit Pool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : Pool2d(Pair{kernel, kernel}, Pair{stride, stride}, Pair{padding, padding}) {}
  std::string extra_repr() const override;
  Pair kernel, stride, padding;
};

class MaxPool2d : public Pool2d {
 public:
  using Pool2d::Pool2d;
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }
};

class AvgPool2d : public Pool2d {
 public:
  using Pool2d::Pool2d;
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size) : output_size(output_size) {}
  explicit AdaptiveAvgPool2d(int64_t size) : output_size{size, size} {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;
  Pair output_size;
};

// Zeroes elements with probability p in training and scales the rest by 1/(1-p); identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5) : p(p) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  double p;
};

// Merges dims start_dim..end_dim into one (default: everything but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Flatten"; }
  int64_t start_dim, end_dim;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

// Runs its children in order; they are named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<ModulePtr> modules);
  explicit Sequential(const std::vector<ModulePtr>& modules);
  void push_back(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
  ModulePtr operator[](size_t i) const { return named_children().at(i).second; }
};

}  // namespace ddplab::nn
