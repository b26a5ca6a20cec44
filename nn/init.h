// Parameter initialisation (PyTorch's torch.nn.init), drawing from ddplab's seeded Generator.
//
// All functions fill a tensor in place, outside autograd, and return it. `gen` null means the
// process-wide default_generator(), so `manual_seed(s)` before building a model makes its
// initial weights reproducible.
#pragma once

#include <string>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace ddplab::nn::init {

enum class FanMode { FanIn, FanOut };

struct Fans {
  int64_t fan_in = 0, fan_out = 0;
};
// For a weight [out, in, k...]: fan_in = in * prod(k), fan_out = out * prod(k).
Fans calculate_fan_in_and_fan_out(const Tensor& t);
// The recommended gain of a nonlinearity: "linear", "conv2d", "sigmoid" 1; "tanh" 5/3;
// "relu" sqrt(2); "leaky_relu" sqrt(2 / (1 + a^2)) with negative slope `param`.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor uniform_(const Tensor& t, double lo = 0, double hi = 1, Generator* gen = nullptr);
Tensor normal_(const Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
// He et al. 2015: U(-b, b), b = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor kaiming_uniform_(const Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// N(0, std^2), std = gain / sqrt(fan).
Tensor kaiming_normal_(const Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                       const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// Glorot & Bengio 2010: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(const Tensor& t, double gain = 1, Generator* gen = nullptr);
Tensor xavier_normal_(const Tensor& t, double gain = 1, Generator* gen = nullptr);

}  // namespace ddplab::nn::init
