// Matrix products. The front-end describes each operand to the backend's GEMM as
// (pointer, leading dimension, transposed?) so that transposed views need no copy.
#include "tensor/backend.h"
#include "tensor/ops.h"

namespace ddplab::ops {

namespace {

// A matrix operand: its data as row-major with leading dim `ld`, or transposed.
struct MatrixRef {
  Tensor t;  // keeps the data alive (maybe a contiguous copy)
  bool trans = false;
  int64_t ld = 0;
};

// For a 2-D tensor (or the last two dims of a batch), use the strides as they are when one of
// them is 1; otherwise copy.
MatrixRef as_matrix(const Tensor& m) {
  int64_t rows = m.size(-2), cols = m.size(-1);
  int64_t rs = m.stride(-2), cs = m.stride(-1);
  if (cs == 1 && (rs >= std::max<int64_t>(cols, 1) || rows == 1))
    return {m, false, std::max<int64_t>(rs, std::max<int64_t>(cols, 1))};
  if (rs == 1 && (cs >= std::max<int64_t>(rows, 1) || cols == 1))
    return {m, true, std::max<int64_t>(cs, std::max<int64_t>(rows, 1))};
  Tensor c = contiguous(m);
  return {c, false, std::max<int64_t>(cols, 1)};
}

DType gemm_dtype(DType t) {
  return t == kFloat64 ? kFloat64 : kFloat32;
}

// The backend's description of C[m, n] = op(A) @ op(B) for one (or the first) batch entry.
GemmArgs gemm_args(DType dt, const MatrixRef& A, const MatrixRef& B, int64_t m, int64_t n,
                   int64_t k, void* c, int64_t ldc) {
  GemmArgs g;
  g.dtype = dt;
  g.trans_a = A.trans;
  g.trans_b = B.trans;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = A.t.raw_data();
  g.lda = A.ld;
  g.b = B.t.raw_data();
  g.ldb = B.ld;
  g.c = c;
  g.ldc = ldc;
  return g;
}

}  // namespace

void gemm_(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
           double alpha, double beta) {
  DDP_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, "gemm_: expected 2-D tensors, got "
                                                                << shape_str(a.shape()) << ", "
                                                                << shape_str(b.shape()) << " -> "
                                                                << shape_str(out.shape()));
  DDP_CHECK(a.device() == b.device() && a.device() == out.device(),
            "gemm_: tensors on different devices: " << a.device() << ", " << b.device() << ", "
                                                    << out.device());
  Tensor at = trans_a ? transpose(a, 0, 1) : a, bt = trans_b ? transpose(b, 0, 1) : b;
  int64_t m = at.size(0), k = at.size(1), n = bt.size(1);
  DDP_CHECK(bt.size(0) == k && out.size(0) == m && out.size(1) == n,
            "gemm_: shapes " << shape_str(at.shape()) << " @ " << shape_str(bt.shape())
                             << " do not give " << shape_str(out.shape()));
  DType dt = gemm_dtype(promote_types(a.dtype(), b.dtype()));
  // 16-bit operands with a float32 result (autocast's linear, Note [Autocast] in nn/autocast.h):
  // one mixed-precision GEMM reads them as they are (bfloat16 on the CPU; bfloat16 or float16 on
  // CUDA). Otherwise the operands are converted to the type the GEMM computes in.
  const bool sixteen = a.dtype() == b.dtype() &&
                       (a.dtype() == kBFloat16 || (a.dtype() == kFloat16 && out.is_cuda()));
  const bool mixed = sixteen && out.dtype() == kFloat32;
  const DType operand_dt = mixed ? a.dtype() : dt;
  bool direct = out.dtype() == dt && out.stride(1) == 1 && out.stride(0) >= std::max<int64_t>(n, 1);
  Tensor c =
      direct ? out : (beta == 0 ? empty({m, n}, {dt, out.device()}) : contiguous(to(out, dt)));
  MatrixRef A = as_matrix(to(at, operand_dt)), B = as_matrix(to(bt, operand_dt));
  GemmArgs g = gemm_args(operand_dt, A, B, m, n, k, c.raw_data(),
                         direct ? out.stride(0) : std::max<int64_t>(n, 1));
  g.float32_c = mixed;
  g.alpha = alpha;
  g.beta = beta;
  if (m > 0 && n > 0) {
    if (k == 0) {
      if (beta == 0)
        fill_(c, 0);
      else
        mul_(c, beta);
    } else {
      backend_for(out.device()).gemm(g);
    }
  }
  if (!direct) copy_(out, c);
}

Tensor mm(const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got " << shape_str(a.shape())
                                                                           << " and "
                                                                           << shape_str(b.shape()));
  DDP_CHECK(a.size(1) == b.size(0),
            "mm: shapes " << shape_str(a.shape()) << " and " << shape_str(b.shape())
                          << " cannot be multiplied (" << a.size(1) << " != " << b.size(0) << ")");
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = empty({a.size(0), b.size(1)}, {gemm_dtype(dt), a.device()});
  gemm_(out, a, b, false, false);
  return to(out, is_floating(dt) ? dt : out.dtype());
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
            "bmm: shapes " << shape_str(a.shape()) << " and " << shape_str(b.shape())
                           << " cannot be multiplied (expected [B, m, k] and [B, k, n])");
  DDP_CHECK(a.device() == b.device(), "bmm: tensors on " << a.device() << " and " << b.device());
  DType in_dt = promote_types(a.dtype(), b.dtype());
  DType dt = gemm_dtype(in_dt);
  int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  Tensor out = zeros({batch, m, n}, {dt, a.device()});
  if (batch == 0 || m == 0 || n == 0 || k == 0) return to(out, is_floating(in_dt) ? in_dt : dt);
  MatrixRef A = as_matrix(to(a, dt)), B = as_matrix(to(b, dt));
  // Batched GEMM needs one stride between batch entries; a broadcast batch has stride 0.
  GemmArgs g = gemm_args(dt, A, B, m, n, k, out.raw_data(), n);
  g.batch = batch;
  g.stride_a = A.t.stride(0);
  g.stride_b = B.t.stride(0);
  g.stride_c = m * n;
  backend_for(a.device()).gemm(g);
  return to(out, is_floating(in_dt) ? in_dt : dt);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dim, got "
                                              << shape_str(a.shape()) << " and "
                                              << shape_str(b.shape()));
  if (a.dim() == 1 && b.dim() == 1) {
    DDP_CHECK(a.size(0) == b.size(0),
              "matmul: vectors of sizes " << a.size(0) << " and " << b.size(0));
    return reshape(mm(unsqueeze(a, 0), unsqueeze(b, 1)), {});
  }
  if (a.dim() == 2 && b.dim() == 2) return mm(a, b);
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return squeeze(matmul(a, unsqueeze(b, 1)), -1);
  DDP_CHECK(a.size(-1) == b.size(-2), "matmul: shapes " << shape_str(a.shape()) << " and "
                                                        << shape_str(b.shape())
                                                        << " cannot be multiplied (" << a.size(-1)
                                                        << " != " << b.size(-2) << ")");
  // [..., m, k] @ [k, n]: fold the batch into the rows, one GEMM.
  if (b.dim() == 2) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(b.size(1));
    return reshape(mm(reshape(a, {-1, a.size(-1)}), b), out_shape);
  }
  // Broadcast the batch dims, then one batched GEMM.
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    int64_t da = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    int64_t db = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    DDP_CHECK(da == db || da == 1 || db == 1,
              "matmul: batch dims of " << shape_str(a.shape()) << " and " << shape_str(b.shape())
                                       << " cannot be broadcast");
    batch[i] = da == 1 ? db : da;
  }
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {a.size(-2), a.size(-1)});
  sb.insert(sb.end(), {b.size(-2), b.size(-1)});
  int64_t nbatch = shape_numel(batch);
  Tensor a3 = reshape(expand(a, sa), {nbatch, a.size(-2), a.size(-1)});
  Tensor b3 = reshape(expand(b, sb), {nbatch, b.size(-2), b.size(-1)});
  Shape out_shape = batch;
  out_shape.insert(out_shape.end(), {a.size(-2), b.size(-1)});
  return reshape(bmm(a3, b3), out_shape);
}

}  // namespace ddplab::ops
