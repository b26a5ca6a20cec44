// SGD (see optim/sgd.h for the update rule).
#include "optim/sgd.h"

#include "autograd/node.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

namespace ddplab::optim {

namespace {

struct SGDScalars {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// A later step with a momentum buffer, in one pass over p, its gradient and the buffer: the
// op-by-op path in SGD::step takes three passes and a temporary. Each line is one of its ops, in
// T as the ops compute float32 and float64, so both paths give the same bits.
template <class T>
void momentum_step(T* p, const T* grad, T* buf, int64_t n, const SGDScalars& o) {
  const T lr = static_cast<T>(-o.lr), wd = static_cast<T>(o.weight_decay);
  const T m = static_cast<T>(o.momentum), keep = static_cast<T>(1 - o.dampening);
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T d = o.weight_decay != 0 ? grad[i] + wd * p[i] : grad[i];  // ops::add(grad, p, wd)
    const T b = buf[i] * m + d * keep;                          // ops::axpby_(buf, m, d, keep)
    buf[i] = b;
    d = o.nesterov ? d + m * b : b;  // ops::add(d, buf, m)
    p[i] = p[i] + lr * d;            // ops::add_(p, d, -lr)
  }
}

// Whether momentum_step can run on these tensors (else the op-by-op path does).
bool fusable(const Tensor& p, const Tensor& grad, const Tensor& buf) {
  const bool same = grad.dtype() == p.dtype() && buf.dtype() == p.dtype() &&
                    grad.shape() == p.shape() && buf.shape() == p.shape();
  return same && !p.is_cuda() && !grad.is_cuda() && !buf.is_cuda() &&
         (p.dtype() == kFloat32 || p.dtype() == kFloat64) && p.is_contiguous() &&
         grad.is_contiguous() && buf.is_contiguous();
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(std::move(groups), {{"lr", o.lr},
                                    {"momentum", o.momentum},
                                    {"dampening", o.dampening},
                                    {"weight_decay", o.weight_decay},
                                    {"nesterov", o.nesterov ? 1.0 : 0.0}}) {
  for (const auto& g : groups_) {
    DDP_CHECK(g.get("momentum") >= 0, "SGD: invalid momentum " << g.get("momentum"));
    DDP_CHECK(g.get("weight_decay") >= 0, "SGD: invalid weight_decay " << g.get("weight_decay"));
    DDP_CHECK(g.get("nesterov") == 0 || (g.get("momentum") > 0 && g.get("dampening") == 0),
              "SGD: Nesterov momentum requires a momentum and zero dampening");
  }
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, size_t idx) {
    const double lr = g.get("lr"), momentum = g.get("momentum"), wd = g.get("weight_decay");
    const double dampening = g.get("dampening");
    const bool nesterov = g.get("nesterov") != 0;
    Tensor d_p = p.grad();
    auto& st = state_[idx];
    auto it = st.find("momentum_buffer");
    if (momentum != 0 && it != st.end() && fusable(p, d_p, it->second)) {
      const SGDScalars o{lr, momentum, dampening, wd, nesterov};
      if (p.dtype() == kFloat32) {
        momentum_step(p.data_ptr<float>(), d_p.data_ptr<float>(), it->second.data_ptr<float>(),
                      p.numel(), o);
      } else {
        momentum_step(p.data_ptr<double>(), d_p.data_ptr<double>(), it->second.data_ptr<double>(),
                      p.numel(), o);
      }
      ++steps_[idx];
      return;
    }
    if (wd != 0) d_p = ops::add(d_p, p, wd);  // a new tensor: .grad itself is left untouched
    if (momentum != 0) {
      Tensor buf;
      if (it == st.end()) {
        buf = ops::clone(d_p);
        st["momentum_buffer"] = buf;
      } else {
        buf = it->second;
        ops::axpby_(buf, momentum, d_p, 1 - dampening);
      }
      d_p = nesterov ? ops::add(d_p, buf, momentum) : buf;
    }
    ops::add_(p, d_p, -lr);
    ++steps_[idx];
  });
}

}  // namespace ddplab::optim
