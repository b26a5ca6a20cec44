// SyncBatchNorm on 2 and 3 Gloo ranks (one forked process each) against BatchNorm2d in one
// process on the concatenated batch.
//
// Every rank builds the same global batch X and upstream gradient G from a seed, computes the
// single-process reference itself, then runs SyncBatchNorm on its slice of rows. The loss on rank
// r is sum(y_r * G_r), so the sum of the ranks' losses is the reference's sum(Y * G). Hence:
//   - each rank's output and input gradient equal the reference's rows of that rank;
//   - the weight and bias gradients SUMMED over ranks equal the reference's (each rank's are local
//     sums; DDP would average them, which matches a loss averaged over ranks);
//   - the running statistics (and num_batches_tracked) equal the reference's on every rank.
// The group's sequence number counts collectives: exactly one per forward and one per backward.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/process_group.h"
#include "ddp/ddp.h"
#include "fork_ranks.h"
#include "models/models.h"
#include "nn/layers.h"
#include "nn/sync_batchnorm.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;
using namespace ddplab::testing;

namespace {

constexpr int64_t kChannels = 3;

// |got - want| <= tol * max|want| (elementwise, relative to the tensor's scale).
void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                  double tol = 1e-5) {
  EXPECT(got.shape() == want.shape(),
         what << ": shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape()));
  if (want.numel() == 0) return;
  const double scale = std::max(1e-12, ops::amax(ops::abs(ops::to(want, kFloat64))).item<double>());
  const double err = ops::max_abs_diff(ops::to(got, kFloat64), ops::to(want, kFloat64)) / scale;
  EXPECT(err <= tol, what << ": relative error " << err);
}

// Where rank r's rows start in the global batch, and the global batch size.
std::pair<int64_t, int64_t> rows_of(const std::vector<int64_t>& sizes, int rank) {
  int64_t offset = 0, total = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (static_cast<int>(r) < rank) offset += sizes[r];
    total += sizes[r];
  }
  return {offset, total};
}

// The sum over ranks of a local gradient (an extra collective, after the counted ones).
Tensor summed(distributed::ProcessGroup& pg, const Tensor& t) {
  Tensor s = ops::clone(t);
  pg.all_reduce(s, distributed::ReduceOp::Sum)->wait();
  return s;
}

// One training step and one eval forward with batch `sizes[r]` on rank r.
void check_against_batchnorm(const std::shared_ptr<distributed::ProcessGroup>& group,
                             const std::vector<int64_t>& sizes) {
  distributed::ProcessGroup& pg = *group;
  const int rank = pg.rank();
  const auto [offset, total] = rows_of(sizes, rank);
  manual_seed(42);
  Tensor X = ops::add(ops::mul(ops::randn({total, kChannels, 3, 2}), 2.0), 5.0);
  Tensor G = ops::randn({total, kChannels, 3, 2});
  Tensor w0 = ops::rand({kChannels}), b0 = ops::randn({kChannels});

  // The reference: one process, the whole batch.
  nn::BatchNorm2d ref(kChannels, 1e-5, 0.3);
  ops::copy_(ref.weight, w0);
  ops::copy_(ref.bias, b0);
  Tensor Xr = ops::clone(X);
  Xr.set_requires_grad(true);
  Tensor Y = ref(Xr);
  sum(mul(Y, G)).backward();

  // The same layer on this rank's rows.
  nn::SyncBatchNorm sbn(kChannels, 1e-5, 0.3, true, true, group);
  ops::copy_(sbn.weight, w0);
  ops::copy_(sbn.bias, b0);
  Tensor x = ops::clone(ops::narrow(X, 0, offset, sizes[rank]));
  x.set_requires_grad(true);
  const uint64_t seq0 = pg.sequence_number();
  Tensor y = sbn(x);
  const uint64_t seq1 = pg.sequence_number();
  sum(mul(y, ops::narrow(G, 0, offset, sizes[rank]))).backward();
  const uint64_t seq2 = pg.sequence_number();
  EXPECT(seq1 - seq0 == 1, "forward issued " << seq1 - seq0 << " collectives");
  EXPECT(seq2 - seq1 == 1, "backward issued " << seq2 - seq1 << " collectives");

  expect_close(y, ops::narrow(Y, 0, offset, sizes[rank]), "output");
  expect_close(x.grad(), ops::narrow(Xr.grad(), 0, offset, sizes[rank]), "input gradient");
  expect_close(summed(pg, sbn.weight.grad()), ref.weight.grad(), "weight gradient (summed)");
  expect_close(summed(pg, sbn.bias.grad()), ref.bias.grad(), "bias gradient (summed)");
  expect_close(sbn.running_mean, ref.running_mean, "running_mean");
  expect_close(sbn.running_var, ref.running_var, "running_var");
  EXPECT(sbn.num_batches_tracked.item<int64_t>() == 1, "num_batches_tracked");

  // Eval: the running statistics, and no communication.
  sbn.eval();
  ref.eval();
  autograd::NoGradGuard no_grad;
  const uint64_t seq3 = pg.sequence_number();
  Tensor y_eval = sbn(ops::narrow(X, 0, offset, sizes[rank]));
  EXPECT(pg.sequence_number() == seq3, "eval forward communicated");
  expect_close(y_eval, ops::narrow(ref(X), 0, offset, sizes[rank]), "eval output");
}

// Finite differences of the global loss sum_r sum(y_r * G_r), taken in lockstep: for each element
// of each rank's input (and of the shared weight and bias), every rank evaluates the perturbed
// loss, so every rank issues the same collectives in the same order.
void gradcheck_across_ranks(const std::shared_ptr<distributed::ProcessGroup>& group,
                            const std::vector<int64_t>& sizes) {
  distributed::ProcessGroup& pg = *group;
  const int rank = pg.rank();
  manual_seed(7 + rank);
  Tensor x = ops::randn({sizes[rank], 2, 2, 2}, kFloat64);
  Tensor g = ops::randn({sizes[rank], 2, 2, 2}, kFloat64);
  manual_seed(3);  // the parameters are the same on every rank
  Tensor w = ops::rand({2}, kFloat64), b = ops::randn({2}, kFloat64);
  auto global_loss = [&] {
    Tensor loss = ops::reshape(
        ops::sum(ops::mul(
            nn::functional::sync_batch_norm(x, Tensor(), Tensor(), w, b, 0.1, 1e-5, group), g)),
        {1});
    pg.all_reduce(loss, distributed::ReduceOp::Sum)->wait();
    return loss.item<double>();
  };
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  sum(mul(nn::functional::sync_batch_norm(x, Tensor(), Tensor(), w, b, 0.1, 1e-5, group), g))
      .backward();
  const Tensor dx = x.grad(), dw = summed(pg, w.grad()), db = summed(pg, b.grad());
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(false);

  const double eps = 1e-6;
  // `mine`: this rank holds the element; the others only take part in the collectives.
  auto numeric = [&](const Tensor& t, int64_t i, bool mine) {
    double* p = mine ? t.data_ptr<double>() + i : nullptr;
    const double v = mine ? *p : 0;
    if (mine) *p = v + eps;
    const double up = global_loss();
    if (mine) *p = v - eps;
    const double down = global_loss();
    if (mine) *p = v;
    return (up - down) / (2 * eps);
  };
  auto agree = [](double analytic, double num, const std::string& what) {
    EXPECT(std::abs(analytic - num) <= 1e-5 + 1e-4 * std::abs(num),
           what << ": analytic " << analytic << ", numeric " << num);
  };
  for (int owner = 0; owner < pg.size(); ++owner) {
    for (int64_t i = 0; i < sizes[owner] * 8; ++i) {
      const double num = numeric(x, i, owner == rank);
      if (owner == rank) agree(dx.data_ptr<double>()[i], num, "dx[" + std::to_string(i) + "]");
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    agree(dw.data_ptr<double>()[i], numeric(w, i, true), "dweight");
    agree(db.data_ptr<double>()[i], numeric(b, i, true), "dbias");
  }
}

// resnet20 twice from one seed: the first converted to SyncBatchNorm on `group`, the second plain.
std::pair<nn::ModulePtr, nn::ModulePtr> resnet20_twins(
    const std::shared_ptr<distributed::ProcessGroup>& group) {
  manual_seed(0);
  auto synced = models::create("resnet20", 10);
  manual_seed(0);
  auto plain = models::create("resnet20", 10);
  nn::convert_sync_batchnorm(synced, group);
  return {synced, plain};
}

// resnet20 converted on every rank (batch sizes[r] of 8x8 images) against the plain resnet20 on
// the concatenated batch; the forward must go through every converted layer.
void check_resnet20(const std::shared_ptr<distributed::ProcessGroup>& group,
                    const std::vector<int64_t>& sizes) {
  const int rank = group->rank();
  const auto [offset, total] = rows_of(sizes, rank);
  const auto [model, reference] = resnet20_twins(group);
  int layers = 0;
  for (const auto& [name, m] : model->named_modules()) layers += m->type_name() == "SyncBatchNorm";
  EXPECT(layers == 21, layers << " SyncBatchNorm layers");

  manual_seed(1);
  Tensor X = ops::randn({total, 3, 8, 8});
  Tensor Y = (*reference)(X);
  const uint64_t seq0 = group->sequence_number();
  Tensor y = (*model)(ops::narrow(X, 0, offset, sizes[rank]));
  const uint64_t seq1 = group->sequence_number();
  sum(y).backward();
  const uint64_t seq2 = group->sequence_number();
  EXPECT(static_cast<int>(seq1 - seq0) == layers, "forward issued " << seq1 - seq0);
  EXPECT(static_cast<int>(seq2 - seq1) == layers, "backward issued " << seq2 - seq1);
  expect_close(y, ops::narrow(Y, 0, offset, sizes[rank]), "logits", 1e-4);
}

// The intended use: resnet20 converted, then wrapped in DDP, one step on every rank against the
// plain resnet20 on the concatenated batch. DDP averages the local gradients, so with the loss
// sum(y_r * G_r) on rank r every parameter's gradient is the reference's divided by W.
void check_ddp_resnet20(const std::shared_ptr<distributed::ProcessGroup>& group,
                        const std::vector<int64_t>& sizes) {
  const int rank = group->rank();
  const auto [offset, total] = rows_of(sizes, rank);
  const auto [model, reference] = resnet20_twins(group);
  distributed::DistributedDataParallel ddp(model, group);

  manual_seed(1);
  Tensor X = ops::randn({total, 3, 8, 8});
  Tensor G = ops::randn({total, 10});
  sum(mul((*reference)(X), G)).backward();
  Tensor y = ddp.forward(ops::narrow(X, 0, offset, sizes[rank]));
  sum(mul(y, ops::narrow(G, 0, offset, sizes[rank]))).backward();

  const auto mine = model->named_parameters(), want = reference->named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    expect_close(ops::mul(mine[i].second.grad(), static_cast<double>(group->size())),
                 want[i].second.grad(), want[i].first + " gradient x world size", 1e-4);
  }
  const auto bufs = model->named_buffers(), want_bufs = reference->named_buffers();
  for (size_t i = 0; i < want_bufs.size(); ++i) {
    expect_close(bufs[i].second, want_bufs[i].second, want_bufs[i].first, 1e-5);
  }
}

using RankCheck = void (*)(const std::shared_ptr<distributed::ProcessGroup>& group,
                           const std::vector<int64_t>& sizes);

// Runs `check` on sizes.size() forked ranks, rank r with batch size sizes[r].
void on_ranks(const std::vector<int64_t>& sizes, RankCheck check) {
  run_ranks(static_cast<int>(sizes.size()), [&](int rank, int world,
                                                const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, world, store);
    // A non-owning handle for the layer: finish() is what tears the group down.
    std::shared_ptr<distributed::ProcessGroup> group(pg.get(), [](distributed::ProcessGroup*) {});
    check(group, sizes);
    finish(pg, *store);
  });
}

}  // namespace

TEST_CASE("SyncBatchNorm on 2 and 3 ranks equals BatchNorm2d on the concatenated batch") {
  // Equal batches, unequal ones, and an empty rank (first or in the middle).
  for (const std::vector<int64_t>& sizes :
       std::vector<std::vector<int64_t>>{{2, 2}, {3, 1}, {0, 4}, {2, 2, 2}, {1, 2, 4}, {2, 0, 3}}) {
    CAPTURE(sizes);
    on_ranks(sizes, check_against_batchnorm);
  }
}

TEST_CASE("SyncBatchNorm gradcheck across ranks (float64, uneven batches, an empty rank)") {
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{{2, 1}, {1, 0, 2}}) {
    CAPTURE(sizes);
    on_ranks(sizes, gradcheck_across_ranks);
  }
}

TEST_CASE("resnet20 after convert_sync_batchnorm: one collective per layer, equals one process") {
  on_ranks({2, 2}, check_resnet20);
  on_ranks({3, 1}, check_resnet20);
}

TEST_CASE("DDP with SyncBatchNorm: one step equals one process on the concatenated batch") {
  on_ranks({2, 2}, check_ddp_resnet20);
}
