// parity_layers: runs each layer of nn/functional.h forward and backward in float32 on seeded
// inputs and writes everything (inputs, parameters, upstream gradient, outputs, gradients) to a
// safetensors file. tests/parity/check_layers.py recomputes the same in PyTorch and compares.
//
//   parity_layers OUT.safetensors
//
// Tensor names are "<case>/<tensor>"; the metadata entry "<case>" holds the case's settings as
// JSON (op, stride, padding, ...), so the checker needs no copy of this list.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "nn/functional.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

using namespace ddplab;
using F::Pair;

namespace {

std::vector<std::pair<std::string, Tensor>> tensors;
std::map<std::string, std::string> metadata;
Generator gen(20240601);

Tensor randn(const Shape& s, bool grad = true) {
  Tensor t = ops::randn(s, kFloat32, &gen);
  if (grad) t.set_requires_grad(true);
  return t;
}

void put(const std::string& c, const std::string& name, const Tensor& t) {
  // A copy: running statistics are updated in place after their "before" value is stored.
  tensors.emplace_back(c + "/" + name, ops::clone(t.detach()));
}

std::string pair_json(Pair p) {
  return "[" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + "]";
}

// Runs y = f(), backpropagates a random gy (or 1 for a scalar), and stores y, gy and the
// gradients of the named inputs.
void run_case(const std::string& c, const std::string& meta,
              const std::vector<std::pair<std::string, Tensor>>& inputs,
              const std::function<Tensor()>& f) {
  metadata[c] = meta;
  for (const auto& [name, t] : inputs) put(c, name, t);
  Tensor y = f();
  Tensor gy = y.dim() == 0 ? ops::ones({}, kFloat32) : randn(y.shape(), false);
  y.backward(gy);
  put(c, "y", y);
  put(c, "gy", gy);
  for (const auto& [name, t] : inputs) {
    if (t.requires_grad()) put(c, "grad_" + name, t.grad());
  }
}

void conv_case(const std::string& c, Shape xs, int64_t o, Pair k, Pair stride, Pair pad, Pair dil,
               int64_t groups, bool bias) {
  Tensor x = randn(xs);
  Tensor w = ops::mul(randn({o, xs[1] / groups, k[0], k[1]}, false), 0.3);
  w.set_requires_grad(true);
  Tensor b = bias ? randn({o}) : Tensor();
  std::vector<std::pair<std::string, Tensor>> in{{"x", x}, {"w", w}};
  if (bias) in.emplace_back("b", b);
  std::string meta = "{\"op\": \"conv2d\", \"stride\": " + pair_json(stride) +
                     ", \"padding\": " + pair_json(pad) + ", \"dilation\": " + pair_json(dil) +
                     ", \"groups\": " + std::to_string(groups) + "}";
  run_case(c, meta, in, [&] { return F::conv2d(x, w, b, stride, pad, dil, groups); });
}

void batchnorm_case(const std::string& c, Shape xs) {
  Tensor x = ops::add(ops::mul(randn(xs, false), 2.0), 0.5);
  x.set_requires_grad(true);
  Tensor w = randn({xs[1]});
  Tensor b = randn({xs[1]});
  Tensor rm = randn({xs[1]}, false);
  Tensor rv = ops::add(ops::abs(randn({xs[1]}, false)), 0.5);
  put(c, "running_mean_before", rm);
  put(c, "running_var_before", rv);
  run_case(c, "{\"op\": \"batch_norm\", \"momentum\": 0.1, \"eps\": 1e-05}",
           {{"x", x}, {"w", w}, {"b", b}},
           [&] { return F::batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5); });
  put(c, "running_mean", rm);
  put(c, "running_var", rv);
}

void pool_case(const std::string& c, const std::string& op, Shape xs, Pair k, Pair stride,
               Pair pad) {
  Tensor x = randn(xs);
  std::string meta = "{\"op\": \"" + op + "\", \"kernel\": " + pair_json(k) +
                     ", \"stride\": " + pair_json(stride) + ", \"padding\": " + pair_json(pad) +
                     "}";
  run_case(c, meta, {{"x", x}}, [&] {
    return op == "max_pool2d" ? F::max_pool2d(x, k, stride, pad) : F::avg_pool2d(x, k, stride, pad);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
    return 2;
  }
  conv_case("conv_3x3_bias", {4, 3, 10, 10}, 8, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true);
  conv_case("conv_stride2", {4, 8, 9, 9}, 16, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, false);
  conv_case("conv_groups4", {2, 8, 8, 8}, 8, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, true);
  conv_case("conv_dilation2", {2, 4, 11, 9}, 6, {3, 2}, {1, 2}, {2, 0}, {2, 1}, 1, true);
  conv_case("conv_resnet20", {8, 16, 16, 16}, 16, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false);
  conv_case("conv_1x1_stride2", {8, 16, 16, 16}, 32, {1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false);

  batchnorm_case("batchnorm2d_train", {8, 6, 5, 5});
  batchnorm_case("batchnorm1d_train", {16, 10});

  {
    Tensor x = randn({7, 12});
    Tensor w = randn({5, 12});
    Tensor b = randn({5});
    run_case("linear", "{\"op\": \"linear\"}", {{"x", x}, {"w", w}, {"b", b}},
             [&] { return F::linear(x, w, b); });
  }

  pool_case("maxpool_3x3_s2_p1", "max_pool2d", {2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1});
  pool_case("maxpool_2x2", "max_pool2d", {2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0});
  pool_case("avgpool_3x3_s2_p1", "avg_pool2d", {2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1});
  pool_case("avgpool_2x2", "avg_pool2d", {2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0});
  {
    Tensor x = randn({2, 3, 7, 9});
    run_case("adaptive_avgpool_3x4", "{\"op\": \"adaptive_avg_pool2d\", \"output_size\": [3, 4]}",
             {{"x", x}}, [&] {
               return F::adaptive_avg_pool2d(x, {3, 4});
             });
    Tensor x1 = randn({4, 16, 8, 8});
    run_case("adaptive_avgpool_1x1", "{\"op\": \"adaptive_avg_pool2d\", \"output_size\": [1, 1]}",
             {{"x", x1}}, [&] {
               return F::adaptive_avg_pool2d(x1, {1, 1});
             });
  }

  const std::pair<const char*, F::Reduction> reductions[] = {
      {"mean", F::Reduction::Mean}, {"sum", F::Reduction::Sum}, {"none", F::Reduction::None}};
  for (double eps : {0.0, 0.1}) {
    for (const auto& [rname, r] : reductions) {
      std::string c = std::string("cross_entropy_") + rname + (eps > 0 ? "_smooth0.1" : "");
      Tensor logits = ops::mul(randn({16, 10}, false), 3.0);
      logits.set_requires_grad(true);
      Tensor target = ops::randint(0, 10, {16}, &gen);
      put(c, "target", target);
      std::string meta = std::string("{\"op\": \"cross_entropy\", \"reduction\": \"") + rname +
                         "\", \"label_smoothing\": " + std::to_string(eps) + "}";
      run_case(c, meta, {{"logits", logits}},
               [&, r = r, eps] { return F::cross_entropy(logits, target, r, eps); });
    }
  }

  nn::save_safetensors(argv[1], tensors, metadata);
  std::printf("parity_layers: wrote %zu tensors of %zu cases to %s\n", tensors.size(),
              metadata.size(), argv[1]);
  return 0;
}
