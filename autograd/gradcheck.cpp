// gradcheck: analytic gradients (autograd::grad) against central finite differences.
#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace ddplab::autograd {

namespace {

// Storage position (relative to element 0) of row-major element `i` of t: inputs may be
// non-contiguous views, and perturbing must touch exactly the element the op reads.
int64_t strided_offset(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.shape()[d];
    off += (i % size) * t.strides()[d];
    i /= size;
  }
  return off;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  std::vector<Tensor> diff_inputs;
  std::vector<int> diff_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    DDP_CHECK(t.dtype() == kFloat64 && t.device().is_cpu(),
              "gradcheck: input " << i << " requires grad but is " << dtype_name(t.dtype())
                                  << " on " << t.device().str()
                                  << "; pass float64 CPU tensors (finite differences need the "
                                     "precision)");
    DDP_CHECK(t.is_leaf(), "gradcheck: input " << i << " must be a leaf (use detach())");
    for (int64_t d = 0; d < t.dim(); ++d) {
      DDP_CHECK(t.strides()[d] != 0 || t.shape()[d] == 1,
                "gradcheck: input " << i << " is an expanded view (stride 0 in dim " << d
                                    << "); perturbing one element would change many");
    }
    diff_inputs.push_back(t);
    diff_index.push_back(static_cast<int>(i));
  }
  DDP_CHECK(!diff_inputs.empty(), "gradcheck: no input requires grad");

  // Analytic: gradient of L = sum(y * w) for a fixed random projection w.
  Tensor y = f(inputs);
  DDP_CHECK(y.defined() && is_floating(y.dtype()),
            "gradcheck: f must return a floating-point tensor");
  Generator gen(20240607);
  Tensor w = ops::rand(y.shape(), TensorOptions(kFloat64, y.device()), &gen);
  ops::add_(w, 0.5);  // in [0.5, 1.5): no element of y is weighted (almost) zero
  auto project = [&w](const Tensor& out) { return sum(mul(to(out, kFloat64), w)); };

  std::vector<Tensor> analytic(diff_inputs.size());
  Tensor loss = project(y);
  if (loss.requires_grad()) analytic = grad({loss}, diff_inputs);

  GradcheckResult result;
  for (size_t k = 0; k < diff_inputs.size(); ++k) {
    const Tensor& x = diff_inputs[k];
    Tensor a = analytic[k].defined() ? ops::to(ops::contiguous(analytic[k]), kFloat64)
                                     : ops::zeros(x.shape(), kFloat64);
    DDP_CHECK(a.shape() == x.shape(), "gradcheck: the gradient of input "
                                          << diff_index[k] << " has shape " << shape_str(a.shape())
                                          << ", the input has shape " << shape_str(x.shape()));
    std::vector<double> av = a.to_vector<double>();
    double* base = x.data_ptr<double>();
    for (int64_t e = 0; e < x.numel(); ++e) {
      double* p = base + strided_offset(x, e);
      const double orig = *p;
      double lp, lm;
      {
        NoGradGuard no_grad;
        *p = orig + eps;
        lp = ops::sum_all(project(f(inputs)));
        *p = orig - eps;
        lm = ops::sum_all(project(f(inputs)));
        *p = orig;
      }
      const double numeric = (lp - lm) / (2 * eps);
      const double an = av[e];
      if (!(std::abs(an - numeric) <= atol + rtol * std::abs(numeric))) {
        std::ostringstream msg;
        msg << "gradcheck: input " << diff_index[k] << " (shape " << shape_str(x.shape())
            << "), element " << e << ": analytic " << an << " vs numeric " << numeric << " (|diff| "
            << std::abs(an - numeric) << " > atol " << atol << " + rtol " << rtol
            << " * |numeric|)";
        result.ok = false;
        result.message = msg.str();
        result.input = diff_index[k];
        result.element = e;
        result.analytic = an;
        result.numeric = numeric;
        return result;
      }
    }
  }
  return result;
}

}  // namespace ddplab::autograd
