// Lab 8's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracles: numbers computed by hand; the library's distributed::orthogonalize_; the PowerSGD
// step recomputed in float64 from every rank's input (library ops, nothing of yours); the
// library's distributed::powerSGD_hook with the same rank, start and seed; plain DDP. Cases with
// a process group fork one process per rank (tests/distributed/fork_ranks.h).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "ddp/comm_hooks/powerSGD_hook.h"
#include "ddp/ddp.h"
#include "fork_ranks.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "powersgd_lab.h"
#include "tensor/ops.h"

using namespace ddplab;
using testing::TCPStore;

namespace {

Tensor matrix(const std::vector<float>& rows, int64_t n, int64_t m) {
  return ops::from_vector<float>(rows, {n, m});
}

Tensor randn(int64_t n, int64_t m, uint64_t seed, DType dtype = kFloat32) {
  Generator gen(seed);
  return ops::randn({n, m}, dtype, &gen);
}

// Max |a - b| / max|b|: differences relative to the size of the expected values.
double rel_diff(const Tensor& a, const Tensor& b) {
  const double scale = ops::max_abs_diff(b, ops::zeros_like(b));
  return ops::max_abs_diff(ops::to(a, kFloat64), ops::to(b, kFloat64)) / std::max(scale, 1e-30);
}

Tensor tr(const Tensor& t) {
  return ops::transpose(t, 0, 1);
}

// --- the PowerSGD step in float64, from every rank's input ----------------------------------

struct OracleStep {
  Tensor approx;               // P Q^T, the same on every rank
  Tensor q;                    // the averaged Q (the next step's warm start)
  std::vector<Tensor> errors;  // by rank: input - approx
};

// inputs[r]: rank r's gradient plus its error; q: the Q this step starts from.
OracleStep oracle_step(const std::vector<Tensor>& inputs, const Tensor& q_in) {
  const double w = static_cast<double>(inputs.size());
  Tensor q = ops::to(q_in, kFloat64);
  distributed::orthogonalize_(q);
  Tensor p = ops::zeros({inputs[0].size(0), q.size(1)}, kFloat64);
  for (const Tensor& m : inputs) ops::add_(p, ops::mm(m, q), 1 / w);
  distributed::orthogonalize_(p);
  OracleStep o;
  o.q = ops::zeros_like(q);
  for (const Tensor& m : inputs) ops::add_(o.q, ops::mm(tr(m), p), 1 / w);
  o.approx = ops::mm(p, tr(o.q));
  for (const Tensor& m : inputs) o.errors.push_back(ops::sub(m, o.approx));
  return o;
}

// Rank r's raw gradient at `step` (float64): fixed, different for each rank and step.
Tensor gradient_of(int rank, int step, int64_t n, int64_t m) {
  return randn(n, m, 1000 + 10 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank),
               kFloat64);
}

// On `world` forked ranks: `steps` calls of lab8::powersgd_step on gradient_of(rank, step), each
// checked against the oracle (result, error, Q) and for its bytes, (n + m) r 4.
void check_steps(int world, int64_t n, int64_t m, int64_t r, int steps) {
  testing::run_ranks(world, [=](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    distributed::CommHookState comm(std::shared_ptr<distributed::ProcessGroup>(std::move(pg)));
    const Tensor q0 = randn(m, r, 7);
    lab8::MatrixMemory mem{ops::zeros({n, m}), ops::clone(q0)};
    std::vector<Tensor> errors(w, ops::zeros({n, m}, kFloat64));
    Tensor q = q0;
    for (int step = 0; step < steps; ++step) {
      std::vector<Tensor> inputs;
      for (int k = 0; k < w; ++k) inputs.push_back(ops::add(gradient_of(k, step, n, m), errors[k]));
      const OracleStep o = oracle_step(inputs, q);
      Tensor mine = ops::to(gradient_of(rank, step, n, m), kFloat32);
      const int64_t before = comm.bytes_all_reduced;
      lab8::powersgd_step(comm, mine, mem, 0);
      EXPECT(comm.bytes_all_reduced - before == (n + m) * r * 4,
             "step " << step << " all-reduced " << comm.bytes_all_reduced - before
                     << " bytes; P and Q are (n + m) r floats = " << (n + m) * r * 4);
      EXPECT(rel_diff(mine, o.approx) < 1e-5,
             "step " << step << ": the result is not P Q^T of the averaged input (rel. diff "
                     << rel_diff(mine, o.approx) << ")");
      EXPECT(mem.error.defined() && rel_diff(mem.error, o.errors[rank]) < 1e-5,
             "step " << step << ": memory.error is not this rank's input minus P Q^T");
      EXPECT(mem.q.defined() && rel_diff(mem.q, o.q) < 1e-5,
             "step " << step << ": memory.q is not the averaged Q (the next warm start)");
      errors = o.errors;
      q = o.q;
    }
    testing::store_sync(*st, "finish", rank, w);
  });
}

// --- DDP with the hooks -----------------------------------------------------------------------

// A conv (8 x 18 as a matrix), two linears (32 x 288, 10 x 32) and three biases.
struct Net : nn::Module {
  Net() {
    register_module("conv", conv, std::make_shared<nn::Conv2d>(2, 8, 3, 1, 1));
    register_module("fc1", fc1, std::make_shared<nn::Linear>(8 * 6 * 6, 32));
    register_module("fc2", fc2, std::make_shared<nn::Linear>(32, 10));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::relu((*conv)(x));
    return (*fc2)(F::relu((*fc1)(ddplab::flatten(h, 1))));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

enum class Hook { kDefault, kLibrary, kStudent };

struct Run {
  std::vector<Tensor> params;
  std::vector<int64_t> bytes;  // per step
};

// `steps` SGD steps of Net under DDP with `hook`, each rank on its own batch.
Run train(const std::shared_ptr<distributed::ProcessGroup>& pg, Hook hook, int64_t rank_r,
          int64_t start_iter, int steps, bool small_buckets) {
  manual_seed(3);
  distributed::DDPOptions opts;
  if (small_buckets) {  // several buckets, so the hook state must keep them apart
    opts.reducer.first_bucket_cap_mb = 0.001;
    opts.reducer.bucket_cap_mb = 0.01;
  }
  auto ddp = std::make_shared<distributed::DDP>(std::make_shared<Net>(), pg, opts);
  if (hook == Hook::kLibrary) {
    auto state = std::make_shared<distributed::PowerSGDState>(pg, /*random_seed=*/11);
    state->matrix_approximation_rank = rank_r;
    state->start_powerSGD_iter = start_iter;
    ddp->register_comm_hook(state, distributed::powerSGD_hook);
  } else if (hook == Hook::kStudent) {
    auto state = std::make_shared<lab8::PowerSGDState>(pg, /*random_seed=*/11);
    state->matrix_approximation_rank = rank_r;
    state->start_powerSGD_iter = start_iter;
    ddp->register_comm_hook(state, lab8::powersgd_hook);
  }
  optim::SGDOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  optim::SGD opt(ddp->parameters(), so);
  Run run;
  for (int step = 0; step < steps; ++step) {
    Generator gen(500 + static_cast<uint64_t>(step * pg->size() + pg->rank()));
    Tensor x = ops::randn({8, 2, 6, 6}, kFloat32, &gen);
    Tensor y = ops::randint(0, 10, {8}, &gen);
    opt.zero_grad();
    F::cross_entropy(ddp->forward(x), y).backward();
    opt.step();
    run.bytes.push_back(ddp->reducer().bytes_all_reduced_last_iteration());
  }
  for (const Tensor& p : ddp->parameters()) run.params.push_back(ops::clone(p));
  return run;
}

double params_diff(const Run& a, const Run& b) {
  double worst = 0;
  for (size_t i = 0; i < a.params.size(); ++i)
    worst = std::max(worst, rel_diff(a.params[i], b.params[i]));
  return worst;
}

// On 2 forked ranks: your hook trains Net exactly as the library's PowerSGD hook does.
void check_against_library(int64_t rank_r, bool small_buckets) {
  testing::run_ranks(2, [=](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    const Run lib = train(pg, Hook::kLibrary, rank_r, 2, 6, small_buckets);
    const Run mine = train(pg, Hook::kStudent, rank_r, 2, 6, small_buckets);
    const Run plain = train(pg, Hook::kDefault, rank_r, 2, 6, small_buckets);
    // The comparison can tell: compression moved the weights away from plain DDP's.
    EXPECT(params_diff(lib, plain) > 1e-3, "the case should compress visibly");
    EXPECT(params_diff(mine, lib) < 1e-5, "after 2 plain and 4 PowerSGD steps at rank "
                                              << rank_r << " your weights differ from the "
                                              << "library's by " << params_diff(mine, lib)
                                              << " (relative)");
    testing::store_sync(*st, "finish", rank, w);
  });
}

}  // namespace

TEST_CASE("part 1 (orthogonalize): a 2 x 2 hand case") {
  // Column 0, (3, 4), has norm 5; column 1, (1, 2), minus its part along (0.6, 0.8), which is
  // 2.2, is (-0.32, 0.24), of norm 0.4.
  Tensor a = matrix({3, 1, 4, 2}, 2, 2);
  lab8::orthogonalize_(a, 0);
  CHECK(ops::max_abs_diff(a, matrix({0.6f, -0.8f, 0.8f, 0.6f}, 2, 2)) < 1e-6);
}

TEST_CASE("part 1 (orthogonalize): orthonormal columns that keep the span; the library's result") {
  for (auto [n, m] : {std::pair<int64_t, int64_t>{7, 3}, {5, 1}, {40, 4}}) {
    for (double eps : {0.0, 0.5}) {
      INFO(n << " x " << m << ", epsilon " << eps);
      const Tensor a = randn(n, m, static_cast<uint64_t>(n + m));
      Tensor q = ops::clone(a), want = ops::clone(a);
      lab8::orthogonalize_(q, eps);
      distributed::orthogonalize_(want, eps);
      CHECK(rel_diff(q, want) < 1e-5);
      if (eps > 0) continue;  // the columns are then a little shorter than 1
      const std::vector<float> qtq = ops::mm(tr(q), q).to_vector<float>();  // Q^T Q = I
      for (int64_t i = 0; i < m * m; ++i) CHECK(std::abs(qtq[i] - (i % (m + 1) == 0)) < 1e-5);
      // A = Q R with R = Q^T A upper triangular: the first k columns of Q span those of A.
      const Tensor r = ops::mm(tr(q), a);
      CHECK(rel_diff(ops::mm(q, r), a) < 1e-5);
      const std::vector<float> rv = ops::contiguous(r).to_vector<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < i; ++j) CHECK(std::abs(rv[i * m + j]) < 1e-4);
    }
  }
}

TEST_CASE("part 1 (orthogonalize): zero and dependent columns stay zero and never NaN") {
  // Columns: (0, 2, 0, 0); zero; (0, 5, 0, 0), a multiple of the first; (3, 1, 0, 4), whose part
  // off the first is (3, 0, 0, 4), of norm 5. Every number here is exact in float.
  const Tensor a = matrix({0, 0, 0, 3, 2, 0, 5, 1, 0, 0, 0, 0, 0, 0, 0, 4}, 4, 4);
  const Tensor want = matrix({0, 0, 0, 0.6f, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.8f}, 4, 4);
  for (double eps : {0.0, 1e-8}) {
    INFO("epsilon " << eps);
    Tensor q = ops::clone(a);
    lab8::orthogonalize_(q, eps);
    CHECK(ops::all_finite(q));
    CHECK(ops::max_abs_diff(q, want) < 1e-6);
  }
}

TEST_CASE("part 2 (PowerSGD step): one rank by hand: the result and the error and the warm start") {
  testing::run_ranks(1, [](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    distributed::CommHookState comm(testing::make_group(rank, w, st));
    // M = [[3, 1], [4, 2], [0, 5]], Q = (1, 0): P = M Q = (3, 4, 0), orthonormal (0.6, 0.8, 0);
    // Q = M^T P = (5, 2.2); P Q^T = [[3, 1.32], [4, 1.76], [0, 0]]; the error is M - P Q^T.
    const Tensor grad = matrix({3, 1, 4, 2, 0, 5}, 3, 2);
    lab8::MatrixMemory mem{ops::zeros({3, 2}), matrix({1, 0}, 2, 1)};
    Tensor m = ops::clone(grad);
    lab8::powersgd_step(comm, m, mem, 0);
    EXPECT(ops::max_abs_diff(m, matrix({3, 1.32f, 4, 1.76f, 0, 0}, 3, 2)) < 1e-5,
           "step 1: the result is not P Q^T");
    EXPECT(ops::max_abs_diff(mem.error, matrix({0, -0.32f, 0, 0.24f, 0, 5}, 3, 2)) < 1e-5,
           "step 1: memory.error is not M - P Q^T");
    EXPECT(ops::max_abs_diff(mem.q, matrix({5, 2.2f}, 2, 1)) < 1e-5,
           "step 1: memory.q is not M^T P (the next step's warm start)");
    // Step 2, the same gradient: the input is M + error, the start is (5, 2.2).
    const OracleStep o =
        oracle_step({ops::to(ops::add(grad, mem.error), kFloat64)}, matrix({5, 2.2f}, 2, 1));
    m = ops::clone(grad);
    lab8::powersgd_step(comm, m, mem, 0);
    EXPECT(rel_diff(m, o.approx) < 1e-5, "step 2: the error of step 1 was not added back");
    EXPECT(rel_diff(mem.error, o.errors[0]) < 1e-5, "step 2: memory.error is wrong");
  });
}

TEST_CASE("part 2 (PowerSGD step): two ranks at rank 2 for three steps and the bytes") {
  check_steps(2, 6, 5, 2, 3);
}

TEST_CASE("part 2 (PowerSGD step): rank min(n m) is the plain average") {
  // P then spans every column of the average M, so P P^T M = M; the error is the rank's own
  // deviation from the mean, which sums to zero over the ranks.
  testing::run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    distributed::CommHookState comm(testing::make_group(rank, w, st));
    for (auto [n, m] : {std::pair<int64_t, int64_t>{5, 3}, {3, 6}}) {
      const int64_t r = std::min(n, m);
      Tensor mine = ops::to(gradient_of(rank, 0, n, m), kFloat32);
      const Tensor avg = ops::mul(ops::add(gradient_of(0, 0, n, m), gradient_of(1, 0, n, m)), 0.5);
      lab8::MatrixMemory mem{ops::zeros({n, m}), randn(m, r, 5)};
      const Tensor input = ops::clone(mine);
      lab8::powersgd_step(comm, mine, mem, 0);
      EXPECT(rel_diff(mine, avg) < 1e-5, n << " x " << m << " at rank " << r << ": not the mean");
      EXPECT(rel_diff(mem.error, ops::sub(ops::to(input, kFloat64), avg)) < 1e-4,
             n << " x " << m << ": the error is not input - mean");
    }
    testing::store_sync(*st, "finish", rank, w);
  });
}

TEST_CASE(
    "part 3 (hook): the weights of the library's PowerSGD hook at rank 1 with several buckets") {
  check_against_library(1, true);
}

TEST_CASE("part 3 (hook): the weights of the library's PowerSGD hook at rank 2 with one bucket") {
  check_against_library(2, false);
}

TEST_CASE("part 3 (hook): bytes per step are (n + m) r 4 per matrix plus the rest") {
  testing::run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    for (int64_t r : {1, 2, 4}) {
      // The formula, from the parameters' shapes and the compression rule.
      int64_t plain = 0, compressed = 0;
      for (const Tensor& p : Net().parameters()) {
        plain += p.numel() * 4;
        const int64_t k = lab8::compression_rank(p, r, 2);
        compressed += k == 0 ? p.numel() * 4 : (p.size(0) + p.numel() / p.size(0)) * k * 4;
      }
      const Run mine = train(pg, Hook::kStudent, r, 2, 4, true);
      const Run lib = train(pg, Hook::kLibrary, r, 2, 4, true);
      EXPECT(mine.bytes == lib.bytes, "rank " << r << ": not the library's bytes");
      const std::vector<int64_t> want = {plain, plain, compressed, compressed};
      EXPECT(mine.bytes == want, "rank " << r << ": bytes per step " << mine.bytes[0] << ", "
                                         << mine.bytes[1] << ", " << mine.bytes[2] << ", "
                                         << mine.bytes[3] << "; expected " << plain << " twice, "
                                         << "then " << compressed);
    }
    testing::store_sync(*st, "finish", rank, w);
  });
}

TEST_CASE("part 3 (hook): before start_powerSGD_iter it trains exactly as plain DDP") {
  testing::run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& st) {
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    const Run mine = train(pg, Hook::kStudent, 1, 1000, 3, true);
    const Run plain = train(pg, Hook::kDefault, 1, 1000, 3, true);
    EXPECT(params_diff(mine, plain) == 0,
           "differs from DDP's averaging all-reduce by " << params_diff(mine, plain));
    EXPECT(mine.bytes == plain.bytes, "not the bytes of plain DDP");
    testing::store_sync(*st, "finish", rank, w);
  });
}
