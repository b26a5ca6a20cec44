// Differentiable matrix products: matmul (PyTorch's 1-D / 2-D / batched-with-broadcast rules),
// mm and bmm.
//
// For C = A @ B the gradients are dA = dC @ B^T and dB = A^T @ dC. They are computed with
// ops::gemm_ and its transpose flags, so no transposed copy of A, B or dC is ever made; an operand
// that is itself a transposed view (as in x @ w^T) is handed to gemm_ as its contiguous parent
// with the flag flipped.
#include "autograd/function_node.h"
#include "autograd/functions.h"

namespace ddplab {

using autograd::Grads;
using autograd::Needs;
using autograd::record;
using autograd::Saved;
using autograd::sum_to;

namespace {

// Brings a 2-D operand into a layout gemm_ reads directly: contiguous as is, or contiguous once
// transposed (then the transpose flag flips). Anything else (a strided slice) is copied.
void gemm_operand(Tensor& t, bool& trans) {
  if (t.is_contiguous()) return;
  Tensor tt = ops::transpose(t, 0, 1);
  if (tt.is_contiguous()) {
    t = tt;
    trans = !trans;
    return;
  }
  t = ops::contiguous(t);
}

// out = op(a) @ op(b) for 2-D operands.
void gemm_into(const Tensor& out, Tensor a, bool trans_a, Tensor b, bool trans_b) {
  gemm_operand(a, trans_a);
  gemm_operand(b, trans_b);
  ops::gemm_(out, a, b, trans_a, trans_b);
}

Shape with_last2(Shape batch, int64_t r, int64_t c) {
  batch.push_back(r);
  batch.push_back(c);
  return batch;
}

// Gradients of matmul(a, b) given the output gradient g. Promotes 1-D operands to matrices
// (as the forward does), computes in matrix form, then reduces broadcast batch dims (sum_to) and
// drops the promoted dims again (reshape).
Grads matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, const Needs& needs) {
  Grads r(2);
  if (a.dim() == 1 && b.dim() == 1) {  // dot product: g is a scalar
    if (needs[0]) r[0] = ops::mul(b, g);
    if (needs[1]) r[1] = ops::mul(a, g);
    return r;
  }
  Tensor A = a.dim() == 1 ? ops::unsqueeze(a, 0) : a;  // [k] -> [1, k]
  Tensor B = b.dim() == 1 ? ops::unsqueeze(b, 1) : b;  // [k] -> [k, 1]
  const int64_t m = A.size(-2), k = A.size(-1), n = B.size(-1);

  if (B.dim() == 2) {
    // B has no batch dims: fold A's batch dims into its rows, one GEMM per gradient. This is
    // the Linear-layer case and also performs the batch reduction of dB inside the GEMM.
    Tensor A2 = ops::reshape(A, {-1, k});
    Tensor G2 = ops::reshape(g, {A2.size(0), n});
    if (needs[0]) {
      Tensor ga = ops::empty({A2.size(0), k}, g.options());
      gemm_into(ga, G2, false, B, true);
      r[0] = ops::reshape(ga, a.shape());
    }
    if (needs[1]) {
      Tensor gb = ops::empty({k, n}, g.options());
      gemm_into(gb, A2, true, G2, false);
      r[1] = ops::reshape(gb, b.shape());
    }
    return r;
  }

  // General batched case: broadcast both operands to the common batch shape and run one GEMM
  // per batch entry; sum_to then folds the batch dims an operand was broadcast along.
  // g's dims are batch + [m] (unless a was 1-D) + [n] (unless b was 1-D).
  const int64_t matrix_dims = (a.dim() == 1 ? 0 : 1) + (b.dim() == 1 ? 0 : 1);
  Shape batch(g.shape().begin(), g.shape().end() - matrix_dims);
  const int64_t nb = shape_numel(batch);
  Tensor A3 = ops::reshape(ops::expand(A, with_last2(batch, m, k)), {nb, m, k});
  Tensor B3 = ops::reshape(ops::expand(B, with_last2(batch, k, n)), {nb, k, n});
  Tensor G3 = ops::reshape(g, {nb, m, n});
  if (needs[0]) {
    Tensor ga = ops::empty({nb, m, k}, g.options());
    for (int64_t i = 0; i < nb; ++i) {
      gemm_into(ops::select(ga, 0, i), ops::select(G3, 0, i), false, ops::select(B3, 0, i), true);
    }
    r[0] = ops::reshape(sum_to(ops::reshape(ga, with_last2(batch, m, k)), A.shape()), a.shape());
  }
  if (needs[1]) {
    Tensor gb = ops::empty({nb, k, n}, g.options());
    for (int64_t i = 0; i < nb; ++i) {
      gemm_into(ops::select(gb, 0, i), ops::select(A3, 0, i), true, ops::select(G3, 0, i), false);
    }
    r[1] = ops::reshape(sum_to(ops::reshape(gb, with_last2(batch, k, n)), B.shape()), b.shape());
  }
  return r;
}

Tensor record_matmul(const char* name, Tensor out, const Tensor& a, const Tensor& b) {
  return record(name, std::move(out), {a, b}, {a, b},
                [](const Tensor& g, const Saved& s, const Needs& n) {
                  return matmul_backward(g, s[0], s[1], n);
                });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  return record_matmul("MatmulBackward", ops::matmul(a, b), a, b);
}
Tensor mm(const Tensor& a, const Tensor& b) {
  return record_matmul("MmBackward", ops::mm(a, b), a, b);
}
Tensor bmm(const Tensor& a, const Tensor& b) {
  return record_matmul("BmmBackward", ops::bmm(a, b), a, b);
}

}  // namespace ddplab
