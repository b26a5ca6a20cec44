// Parameter initialisation (see nn/init.h). The formulas are PyTorch's, so a model initialised
// here has the same distribution per tensor as its PyTorch twin (not the same numbers: the
// generators differ).
#include "nn/init.h"

#include <cmath>

#include "autograd/node.h"
#include "tensor/ops.h"

namespace ddplab::nn::init {

Fans calculate_fan_in_and_fan_out(const Tensor& t) {
  DDP_CHECK(t.dim() >= 2, "init: fan in and fan out need a tensor with at least 2 dims, got shape "
                              << shape_str(t.shape()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "sigmoid" || nonlinearity == "identity") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  DDP_FAIL("calculate_gain: unknown nonlinearity '" << nonlinearity << "'");
}

Tensor uniform_(const Tensor& t, double lo, double hi, Generator* gen) {
  autograd::NoGradGuard no_grad;
  ops::uniform_(t, lo, hi, gen);
  return t;
}

Tensor normal_(const Tensor& t, double mean, double std, Generator* gen) {
  autograd::NoGradGuard no_grad;
  ops::normal_(t, mean, std, gen);
  return t;
}

Tensor constant_(const Tensor& t, double value) {
  autograd::NoGradGuard no_grad;
  ops::fill_(t, value);
  return t;
}

Tensor zeros_(const Tensor& t) {
  return constant_(t, 0);
}
Tensor ones_(const Tensor& t) {
  return constant_(t, 1);
}

namespace {
double kaiming_std(const Tensor& t, double a, FanMode mode, const std::string& nonlinearity) {
  Fans f = calculate_fan_in_and_fan_out(t);
  int64_t fan = mode == FanMode::FanIn ? f.fan_in : f.fan_out;
  DDP_CHECK(fan > 0, "kaiming init: zero fan for shape " << shape_str(t.shape()));
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

Tensor kaiming_uniform_(const Tensor& t, double a, FanMode mode, const std::string& nonlinearity,
                        Generator* gen) {
  // U(-b, b) has standard deviation b / sqrt(3).
  double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity);
  return uniform_(t, -bound, bound, gen);
}

Tensor kaiming_normal_(const Tensor& t, double a, FanMode mode, const std::string& nonlinearity,
                       Generator* gen) {
  return normal_(t, 0, kaiming_std(t, a, mode, nonlinearity), gen);
}

Tensor xavier_uniform_(const Tensor& t, double gain, Generator* gen) {
  Fans f = calculate_fan_in_and_fan_out(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor xavier_normal_(const Tensor& t, double gain, Generator* gen) {
  Fans f = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)), gen);
}

}  // namespace ddplab::nn::init
