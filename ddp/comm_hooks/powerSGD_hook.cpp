// PowerSGD as a communication hook. Read the note first.
//
// Note [PowerSGD]
// ~~~~~~~~~~~~~~~
// The average gradient of a layer, viewed as an n x m matrix M = (1/W) sum_i M_i, is usually
// close to a matrix of low rank r. PowerSGD sends only what it takes to rebuild such a rank-r
// approximation, with one step of power iteration per training step:
//   1. P_i = M_i Q                (n x r; Q is m x r, the same on every rank)
//   2. P = sum_i P_i              all-reduce #1: n*r numbers instead of n*m
//   3. P <- orthonormal columns   (Gram-Schmidt; the scale of P does not matter, so no 1/W)
//   4. Q_i = M_i^T P              (m x r)
//   5. Q = (1/W) sum_i Q_i        all-reduce #2: m*r numbers; Q = M^T P for the average M
//   6. M ~ P Q^T = P P^T M        the projection of the average gradient onto span(P)
// Every rank computes the same P Q^T, so the replicas stay identical. Steps 1-5 are one round
// of the power method for the top-r singular subspace of M; one round per step is enough
// because of two more ideas:
//   - Warm start: step 1 of the next training step starts from this step's Q (orthogonalized)
//     instead of a random one. Gradients change slowly, so the iteration keeps converging
//     across steps. Only the very first Q is random, drawn from a generator with the same seed
//     on every rank (all ranks must start from the same Q).
//   - Error feedback: what compression dropped is not lost. Each rank keeps
//     e_i = (M_i + e_i_old) - P Q^T and adds it to its next gradient, so every part of the
//     gradient is applied eventually (the paper's key to reaching full-precision accuracy).
//     As in PyTorch, e_i is the rank's compressed input minus the AVERAGED result, so it also
//     holds the rank's own deviation from the mean; those deviations sum to zero over the
//     ranks, so the next average is unaffected, and the average of the e_i is exactly the
//     average gradient minus its approximation.
// Not everything is worth compressing: a vector (bias, BatchNorm weight) has no low-rank
// structure, and an n x m matrix with (n + m) r * min_compression_rate >= n m would not shrink
// enough; those are all-reduced as they are (averaged like allreduce_hook). For the first
// start_powerSGD_iter iterations the whole bucket is all-reduced plainly: early gradients change
// fast, and compressing them from the start costs accuracy (PyTorch's default waits 1000 steps).
// Memory per bucket (error, P and Q) is keyed by bucket index and dropped when the bucket's
// parameters change (the Reducer rebuilds its buckets once, after the first iteration; PyTorch
// asks for start_powerSGD_iter > 1 for the same reason).
//
// Cost for one matrix: two small all-reduces ((n + m) r numbers) instead of n m, plus matmuls of
// M with thin matrices. Our fast hook batches: the P's of all matrices in a bucket live in one
// flat tensor and go in one all-reduce, the Q's likewise, and the uncompressed tensors are
// concatenated into a third; P's all-reduce is issued during backward like any bucket, the Q's
// when the Reducer waits for the bucket (Future::then). powerSGD_hook_naive is the same math one
// matrix at a time, waiting for every all-reduce: easier to follow, slower.
#include "ddp/comm_hooks/powerSGD_hook.h"

#include <algorithm>
#include <cmath>

#include "ddp/comm_hooks/default_hooks.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> pg, uint64_t random_seed)
    : CommHookState(std::move(pg)), rng(random_seed) {}

void orthogonalize_(const Tensor& matrix, double epsilon) {
  DDP_CHECK(matrix.dim() == 2,
            "orthogonalize_: expected a 2-D tensor, got " << shape_str(matrix.shape()));
  const int64_t cols = matrix.size(1);
  for (int64_t i = 0; i < cols; ++i) {
    Tensor col = ops::narrow(matrix, 1, i, 1);
    const double norm = std::sqrt(ops::sum_all(ops::square(col)));
    if (norm + epsilon > 0) ops::mul_(col, 1.0 / (norm + epsilon));
    if (i + 1 == cols) break;
    // Remove col's direction from every later column.
    Tensor rest = ops::narrow(matrix, 1, i + 1, cols - i - 1);
    Tensor dots = ops::sum(ops::mul(col, rest), {0}, /*keepdim=*/true);  // [1, rest]
    ops::sub_(rest, ops::mul(col, dots));
  }
}

namespace {

// A gradient to compress: its n x m view into the bucket and its rank.
struct Matrix {
  Tensor m;       // view into the bucket buffer
  int64_t r = 0;  // min(n, m, matrix_approximation_rank)
};

// Splits the bucket's gradients into matrices worth compressing and tensors sent as they are.
void split(const PowerSGDState& state, const GradBucket& bucket, std::vector<Matrix>& matrices,
           std::vector<Tensor>& uncompressed) {
  for (const Tensor& g : bucket.gradients()) {
    if (g.dim() >= 2) {
      const int64_t n = g.size(0), m = g.numel() / n;
      const int64_t r = std::min({n, m, state.matrix_approximation_rank});
      if (static_cast<double>((n + m) * r) * state.min_compression_rate <
          static_cast<double>(n * m)) {
        matrices.push_back({ops::view(g, {n, m}), r});
        continue;
      }
    }
    uncompressed.push_back(g);
  }
}

// This bucket's memory, made (or made again, after a rebuild) to fit `matrices`. `fresh` tells
// whether Q holds nothing to warm-start from.
PowerSGDState::BucketMemory& memory_for(PowerSGDState& state, const GradBucket& bucket,
                                        const std::vector<Matrix>& matrices, bool& fresh) {
  std::vector<const void*> params;
  for (const Tensor& p : bucket.parameters()) params.push_back(p.impl_ptr().get());
  PowerSGDState::BucketMemory& mem = state.memory[bucket.index()];
  fresh = mem.params != params || !state.warm_start;
  if (mem.params != params) {
    int64_t p_numel = 0, q_numel = 0;
    for (const Matrix& mat : matrices) {
      p_numel += mat.m.size(0) * mat.r;
      q_numel += mat.m.size(1) * mat.r;
    }
    const TensorOptions opts = bucket.buffer().options();
    mem.params = params;
    mem.error = ops::zeros({bucket.buffer().numel()}, opts);
    mem.p = ops::empty({p_numel}, opts);
    mem.q = ops::empty({q_numel}, opts);
  }
  return mem;
}

// The P and Q of each matrix: views into the flat memories.
void carve(const std::vector<Matrix>& matrices, const PowerSGDState::BucketMemory& mem,
           std::vector<Tensor>& ps, std::vector<Tensor>& qs) {
  int64_t p_at = 0, q_at = 0;
  for (const Matrix& mat : matrices) {
    const int64_t n = mat.m.size(0), m = mat.m.size(1);
    ps.push_back(ops::view(ops::narrow(mem.p, 0, p_at, n * mat.r), {n, mat.r}));
    qs.push_back(ops::view(ops::narrow(mem.q, 0, q_at, m * mat.r), {m, mat.r}));
    p_at += n * mat.r;
    q_at += m * mat.r;
  }
}

// Everything up to step 1 of the note, shared by both hooks: error feedback in, the split, the
// memory, Q (random or warm), P_i = M_i Q. Returns the input as compressed (for the error).
struct Prepared {
  std::vector<Matrix> matrices;
  std::vector<Tensor> uncompressed, ps, qs;
  PowerSGDState::BucketMemory* mem = nullptr;
  Tensor input;  // the rank's input after error feedback (undefined without it)
};

Prepared prepare(PowerSGDState& state, GradBucket& bucket) {
  Prepared pr;
  split(state, bucket, pr.matrices, pr.uncompressed);
  bool fresh = false;
  pr.mem = &memory_for(state, bucket, pr.matrices, fresh);
  if (state.use_error_feedback) {
    ops::add_(bucket.buffer(), pr.mem->error);
    pr.input = ops::clone(bucket.buffer());
  }
  carve(pr.matrices, *pr.mem, pr.ps, pr.qs);
  if (fresh) ops::normal_(pr.mem->q, 0, 1, &state.rng);  // the same draw on every rank
  for (size_t k = 0; k < pr.matrices.size(); ++k) {
    orthogonalize_(pr.qs[k], state.orthogonalization_epsilon);
    ops::gemm_(pr.ps[k], pr.matrices[k].m, pr.qs[k], false, false);  // P_i = M_i Q
  }
  return pr;
}

// Steps 3-4: orthonormal P, then Q_i = M_i^T P.
void compute_qs(const PowerSGDState& state, const Prepared& pr) {
  for (size_t k = 0; k < pr.matrices.size(); ++k) {
    orthogonalize_(pr.ps[k], state.orthogonalization_epsilon);
    ops::gemm_(pr.qs[k], pr.matrices[k].m, pr.ps[k], true, false);
  }
}

// Step 6 (Q already averaged), the error for next time, the iteration count.
Tensor decompress(PowerSGDState& state, GradBucket& bucket, const Prepared& pr) {
  for (size_t k = 0; k < pr.matrices.size(); ++k) {
    ops::gemm_(pr.matrices[k].m, pr.ps[k], pr.qs[k], false, true);  // M = P Q^T
  }
  if (state.use_error_feedback) pr.mem->error = ops::sub(pr.input, bucket.buffer());
  if (!state.warm_start) state.memory.erase(bucket.index());
  state.maybe_increase_iter(bucket);
  return bucket.buffer();
}

}  // namespace

FuturePtr powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  if (state.iter < state.start_powerSGD_iter) {
    state.maybe_increase_iter(bucket);
    return allreduce_hook(state, bucket);
  }
  const double inv_world = 1.0 / state.process_group->size();
  auto pr = std::make_shared<Prepared>(prepare(state, bucket));

  // One all-reduce for every uncompressed tensor, one for every P: both now, during backward.
  Tensor flat;
  std::shared_ptr<Work> flat_work, p_work;
  if (!pr->uncompressed.empty()) {
    std::vector<Tensor> pieces;
    for (const Tensor& t : pr->uncompressed) pieces.push_back(ops::reshape(t, {-1}));
    flat = ops::cat(pieces);
    ops::mul_(flat, inv_world);
    flat_work = state.all_reduce(flat);
  }
  if (!pr->matrices.empty()) p_work = state.all_reduce(pr->mem->p);

  // The continuation runs when the Reducer waits for this bucket (Future::then); it holds what it
  // needs by value (the GradBucket's tensors are shared handles).
  return Future::from_work(p_work, pr->mem->p)
      ->then([&state, bucket, pr, flat, flat_work, inv_world](const Tensor&) mutable {
        if (flat_work) {  // the uncompressed tensors back into the bucket
          flat_work->wait();
          int64_t at = 0;
          for (const Tensor& t : pr->uncompressed) {
            ops::copy_(t, ops::view(ops::narrow(flat, 0, at, t.numel()), t.shape()));
            at += t.numel();
          }
        }
        if (!pr->matrices.empty()) {
          compute_qs(state, *pr);
          state.all_reduce(pr->mem->q)->wait();
          ops::mul_(pr->mem->q, inv_world);
        }
        return decompress(state, bucket, *pr);
      });
}

FuturePtr powerSGD_hook_naive(PowerSGDState& state, GradBucket& bucket) {
  if (state.iter < state.start_powerSGD_iter) {
    state.maybe_increase_iter(bucket);
    return allreduce_hook(state, bucket);
  }
  const double inv_world = 1.0 / state.process_group->size();
  Prepared pr = prepare(state, bucket);  // P_i = M_i Q for every matrix
  for (const Tensor& t : pr.uncompressed) {
    Tensor flat = ops::contiguous(t);  // a slice of the bucket: already contiguous
    ops::mul_(flat, inv_world);
    state.all_reduce(flat)->wait();
  }
  for (size_t k = 0; k < pr.matrices.size(); ++k) {
    const Tensor& m = pr.matrices[k].m;
    state.all_reduce(pr.ps[k])->wait();  // P = sum_i M_i Q
    orthogonalize_(pr.ps[k], state.orthogonalization_epsilon);
    ops::gemm_(pr.qs[k], m, pr.ps[k], true, false);  // Q_i = M_i^T P
    state.all_reduce(pr.qs[k])->wait();
    ops::mul_(pr.qs[k], inv_world);  // Q = M^T P for the average M
  }
  return Future::completed(decompress(state, bucket, pr));
}

}  // namespace ddplab::distributed
