// naive_allreduce_grads: per-parameter, after-backward gradient averaging (teaching version).
#include "ddp/naive_allreduce_grads.h"

#include "tensor/ops.h"

namespace ddplab::distributed {

void naive_allreduce_grads(const nn::Module& module, ProcessGroup& pg) {
  // Same order on every rank: registration order (the models match, so the lists match).
  for (const Tensor& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.set_grad(ops::zeros_like(p));
    Tensor g = p.grad();
    // The process group needs a contiguous tensor; a gradient normally is one.
    Tensor buf = g.is_contiguous() ? g : ops::contiguous(g);
    ops::mul_(buf, 1.0 / pg.size());            // divide first, then sum: Note [Averaging]
    pg.all_reduce(buf, ReduceOp::Sum)->wait();  // blocking: nothing overlaps
    if (!buf.is_same(g)) ops::copy_(g, buf);
  }
}

}  // namespace ddplab::distributed
