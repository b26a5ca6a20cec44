// DDP's communication hooks on W forked ranks (on_ranks, tests/distributed/ddp_scenario.h): a
// custom hook's calls, the 16-bit compression hooks, PowerSGD against a hand computation and its
// bytes on the wire.
#include <doctest/doctest.h>

#include "ddp_scenario.h"

using namespace ddplab;
using namespace ddplab::testing;
using namespace std::chrono_literals;

namespace {

// Counts calls by bucket, then averages like the default hook.
struct CountingState : CommHookState {
  using CommHookState::CommHookState;
  std::vector<size_t> current;             // bucket indices hooked in this step so far
  std::vector<std::vector<size_t>> steps;  // ... in every finished step (ended by is_last)
};

// a custom communication hook is called once per bucket per step, and (delegating to
// allreduce_hook) trains like one process
void hook_calls(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  auto ddp = small_bucket_mlp(pg);
  auto state = std::make_shared<CountingState>(pg);
  ddp->register_comm_hook(state, [](CountingState& s, GradBucket& b) {
    s.current.push_back(b.index());
    if (b.is_last()) s.steps.push_back(std::move(s.current)), s.current.clear();
    return allreduce_hook(s, b);
  });
  const size_t static_buckets = ddp->reducer().buckets().size();
  std::string twice;
  try {
    ddp->register_comm_hook(std::make_shared<CommHookState>(pg), allreduce_hook);
  } catch (const Error& e) {
    twice = e.what();
  }
  const double diff = train_and_compare(*ddp, "mlp", B);
  const size_t buckets = ddp->reducer().buckets().size();  // after the rebuild of step 1
  std::string calls;
  for (const auto& step : state->steps) {
    calls += "[";
    for (size_t b : step) calls += " " + std::to_string(b);
    calls += " ] ";
  }
  std::cout << "RESULT buckets static=" << static_buckets << " rebuilt=" << buckets
            << " hooked per step: " << calls
            << "bytes/step=" << ddp->reducer().bytes_all_reduced_last_iteration()
            << " max_rel_diff=" << diff << "\n";
  check(buckets >= 3, "expected several buckets");
  check(state->steps.size() == static_cast<size_t>(kSteps) && state->current.empty(),
        "is_last() should end every step once");
  for (size_t step = 0; step < state->steps.size(); ++step) {
    std::vector<size_t> expected(step == 0 ? static_buckets : buckets);
    for (size_t b = 0; b < expected.size(); ++b) expected[b] = b;
    check(state->steps[step] == expected,
          "step " + std::to_string(step) + " did not hook every bucket once, in order");
  }
  check(twice.find("only once") != std::string::npos, "a second registration must fail");
  int64_t numel = 0;
  for (const Tensor& p : ddp->parameters()) numel += p.numel();
  check(ddp->reducer().bytes_all_reduced_last_iteration() == numel * 4,
        "the default hook all-reduces every gradient once");
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

// One step of `kind` on this rank's rows; returns the DDP-averaged gradients (flattened).
std::vector<Tensor> one_step_grads(DDP& ddp) {
  const int64_t B = 8;
  loss_of(ddp, global_batch(0, g_world * B).rows(g_rank * B, B)).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : ddp.parameters()) grads.push_back(ops::clone(p.grad()));
  return grads;
}

// the 16-bit hooks give gradients close to plain averaging, half the bytes
void compress(const std::shared_ptr<ProcessGroup>& pg, const std::string& dtype) {
  auto plain = std::make_shared<DDP>(make_seeded("conv", 42), pg);
  auto hooked = std::make_shared<DDP>(make_seeded("conv", 42), pg);
  hooked->register_comm_hook(std::make_shared<CommHookState>(pg),
                             dtype == "fp16" ? fp16_compress_hook : bf16_compress_hook);
  const std::vector<Tensor> a = one_step_grads(*plain), b = one_step_grads(*hooked);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, ops::max_rel_error(b[i], a[i]));
  const int64_t bytes_plain = plain->reducer().bytes_all_reduced_last_iteration();
  const int64_t bytes_hooked = hooked->reducer().bytes_all_reduced_last_iteration();
  std::cout << "RESULT " << dtype << " max_rel_diff_to_plain=" << worst
            << " bytes plain=" << bytes_plain << " hooked=" << bytes_hooked << "\n";
  // 11 (fp16) or 8 (bf16) significant bits, one rounding before and one after the sum.
  const double tol = dtype == "fp16" ? 2e-3 : 2e-2;
  check(worst > 0, "the 16-bit hook should round something");
  check(worst <= tol, dtype + " gradients too far from plain averaging");
  check(bytes_hooked * 2 == bytes_plain, "a 16-bit hook sends half the bytes");
}

// PowerSGD by hand (Note [PowerSGD] in powerSGD_hook.cpp), on a 4x3 gradient, rank 1: plain
// loops over doubles, nothing shared with the hook.
using Mat = std::vector<std::vector<double>>;  // rows

Mat mat_of(const Tensor& t, int64_t n, int64_t m) {
  const std::vector<float> v = ops::contiguous(t).to_vector<float>();
  Mat a(n, std::vector<double>(m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) a[i][j] = v[i * m + j];
  return a;
}

std::vector<double> normalized(std::vector<double> v) {
  double n = 0;
  for (double x : v) n += x * x;
  for (double& x : v) x /= std::sqrt(n);
  return v;
}

struct HandStep {
  Mat approx;               // P Q^T, the same on every rank
  std::vector<Mat> errors;  // by rank: input - approx
  std::vector<double> q;    // the averaged Q (warm start of the next step)
};

// inputs[r]: rank r's gradient plus its previous error; q: Q before orthogonalization.
HandStep powersgd_by_hand(const std::vector<Mat>& inputs, std::vector<double> q) {
  const size_t n = inputs[0].size(), m = inputs[0][0].size(), world = inputs.size();
  q = normalized(q);
  std::vector<double> p(n, 0.0);
  for (const Mat& a : inputs)  // P = sum_r M_r q
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < m; ++j) p[i] += a[i][j] * q[j];
  p = normalized(p);
  std::vector<double> qq(m, 0.0);
  for (const Mat& a : inputs)  // Q = (1/W) sum_r M_r^T p
    for (size_t j = 0; j < m; ++j)
      for (size_t i = 0; i < n; ++i) qq[j] += a[i][j] * p[i] / static_cast<double>(world);
  HandStep h;
  h.q = qq;
  h.approx.assign(n, std::vector<double>(m));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) h.approx[i][j] = p[i] * qq[j];
  for (const Mat& a : inputs) {
    Mat e = a;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < m; ++j) e[i][j] -= h.approx[i][j];
    h.errors.push_back(e);
  }
  return h;
}

double mat_diff(const Mat& a, const Mat& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) worst = std::max(worst, std::abs(a[i][j] - b[i][j]));
  return worst;
}

// Rank r's 4x3 gradient at `step`: fixed numbers, different by rank and step.
Mat hand_gradient(int rank, int step) {
  Mat a(4, std::vector<double>(3));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) a[i][j] = ((i * 3 + j) * (rank + 2) + step * 5) % 7 - 3.0 + 0.5 * i;
  return a;
}

// PowerSGD rank 1 on a 4x3 gradient, computed by hand: P, Q, the result, the error
// feedback, warm start in step 2; the naive hook agrees
void powersgd_hand(const std::shared_ptr<ProcessGroup>& pg) {
  const Tensor weight = ops::zeros({4, 3});  // the parameter whose gradient this is
  const std::vector<double> q0 = {1.0, -2.0, 0.5};
  // Both hooks, each with its own state, on the same inputs.
  for (bool naive : {false, true}) {
    auto state = std::make_shared<PowerSGDState>(pg);
    state->matrix_approximation_rank = 1;
    state->start_powerSGD_iter = 0;
    state->min_compression_rate = 1;  // (4 + 3) * 1 < 12: worth compressing
    // Seed the warm-start memory with a known Q instead of a random one.
    PowerSGDState::BucketMemory& mem = state->memory[0];
    mem.params = {weight.impl_ptr().get()};
    mem.error = ops::zeros({12});
    mem.p = ops::zeros({4});
    mem.q = ops::from_vector(std::vector<float>(q0.begin(), q0.end()), {3});
    std::vector<Mat> prev_errors(g_world, Mat(4, std::vector<double>(3, 0.0)));
    std::vector<double> q = q0;
    for (int step = 0; step < 2; ++step) {
      std::vector<Mat> inputs;
      for (int r = 0; r < g_world; ++r) {
        Mat a = hand_gradient(r, step);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 3; ++j) a[i][j] += prev_errors[r][i][j];  // error feedback
        inputs.push_back(a);
      }
      const HandStep h = powersgd_by_hand(inputs, q);
      // The hook, on this rank's raw gradient (it adds its own stored error).
      const Mat mine = hand_gradient(g_rank, step);
      std::vector<float> flat;
      for (const auto& row : mine) flat.insert(flat.end(), row.begin(), row.end());
      Tensor buffer = ops::from_vector(flat, {12});
      GradBucket bucket(0, true, buffer, {ops::view(buffer, {4, 3})}, {weight});
      const Tensor out =
          (naive ? powerSGD_hook_naive(*state, bucket) : powerSGD_hook(*state, bucket))->wait();
      const double d_out = mat_diff(mat_of(out, 4, 3), h.approx);
      const double d_err = mat_diff(mat_of(state->memory[0].error, 4, 3), h.errors[g_rank]);
      const Mat q_mat = mat_of(state->memory[0].q, 1, 3);
      const double d_q = mat_diff(q_mat, Mat{h.q});
      std::cout << "RESULT " << (naive ? "naive" : "fast") << " step " << step
                << ": |result - P Q^T|=" << d_out << " |error - (M + e - P Q^T)|=" << d_err
                << " |Q - hand Q|=" << d_q << " result[0][0]=" << mat_of(out, 4, 3)[0][0]
                << " hand=" << h.approx[0][0] << "\n";
      check(d_out < 1e-5 && d_err < 1e-5 && d_q < 1e-5,
            "PowerSGD differs from the hand computation at step " + std::to_string(step));
      check(mat_diff(h.errors[g_rank], Mat(4, std::vector<double>(3, 0.0))) > 1e-3,
            "the test case should leave a residual (rank-1 approximation of a rank-3 matrix)");
      prev_errors = h.errors;
      q = h.q;  // warm start
    }
    check(state->iter == 2, "two iterations counted");
  }
}

// resnet20: bytes all-reduced per step, PowerSGD rank 2 vs plain; the replicas stay
// identical
void powersgd_bytes(const std::shared_ptr<ProcessGroup>& pg) {
  const int steps = 3;
  int64_t bytes[2] = {0, 0};
  for (bool compressed : {false, true}) {
    manual_seed(7);
    auto ddp = std::make_shared<DDP>(models::create("resnet20", 10), pg);
    auto state = std::make_shared<PowerSGDState>(pg);
    state->matrix_approximation_rank = 2;
    state->start_powerSGD_iter = compressed ? 1 : 1000;  // after the bucket rebuild of step 1
    ddp->register_comm_hook(state, powerSGD_hook);
    optim::SGD opt(ddp->parameters(), sgd_options());
    for (int step = 0; step < steps; ++step) {
      Generator gen(500 + step * g_world + g_rank);
      Tensor x = ops::randn({2, 3, 32, 32}, kFloat32, &gen);
      Tensor y = ops::randint(0, 10, {2}, &gen);
      opt.zero_grad();
      nn::functional::cross_entropy(ddp->forward(x), y).backward();
      opt.step();
    }
    bytes[compressed] = ddp->reducer().bytes_all_reduced_last_iteration();
    // Every rank applied the same decompressed gradients: the replicas are still identical.
    double drift = 0;
    for (const Tensor& p : ddp->parameters()) {
      Tensor rank0 = ops::clone(p);
      pg->broadcast(rank0, 0)->wait();
      drift = std::max(drift, ops::max_abs_diff(p, rank0));
    }
    check(drift == 0, "replicas differ after PowerSGD steps");
  }
  std::cout << "RESULT resnet20 bytes all-reduced per step: plain " << bytes[0]
            << ", PowerSGD rank 2 " << bytes[1] << " (" << 100.0 * bytes[1] / bytes[0] << "%)\n";
  check(bytes[1] * 10 < bytes[0], "PowerSGD rank 2 should send < 10% of the bytes");
}

}  // namespace

TEST_CASE("DDP comm hook: a custom hook is called once per bucket per step") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { hook_calls(pg); });
}

TEST_CASE("DDP comm hook: fp16 and bf16 compression give gradients close to plain averaging") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { compress(pg, "fp16"); });
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { compress(pg, "bf16"); });
}

TEST_CASE("DDP comm hook: PowerSGD equals a hand computation, with error feedback") {
  on_ranks(1, [](const std::shared_ptr<ProcessGroup>& pg) { powersgd_hand(pg); });
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { powersgd_hand(pg); });
}

TEST_CASE("DDP comm hook: PowerSGD rank 2 all-reduces far fewer bytes on resnet20") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { powersgd_bytes(pg); });
}
