// Lab 6's experiment: why float16 training needs loss scaling. Run it under ddprun (README.md):
//   ddprun --standalone --nproc-per-node 2 build/labs/lab06_fp16_training_starter [steps]
//
// A linear model learns y = x . w* where the true weights span 2^-2 down to 2^-32, as a deep
// network's gradients span many decades. DDP sends the gradients as float16
// (distributed::fp16_compress_hook): each rank rounds its gradient / world size to float16, the
// sum travels in float16. That is the float16 gradient path of mixed precision, on the CPU. The
// program trains twice from the same start, without loss scaling and with the student's
// LossScaler (loss_scaler.h), and rank 0 prints, per step, the scale and what check_float16
// (part 1) says of its gradient values on their way into float16.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/init_process_group.h"
#include "ddp/comm_hooks/default_hooks.h"
#include "ddp/ddp.h"
#include "loss_scaler.h"
#include "loss_scaling_lab.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

namespace {

constexpr int64_t kFeatures = 16;
constexpr int64_t kSamplesPerRank = 256;

// Small true weights, about 2^-12, so the gradients start small and shrink as the model learns:
// below 2^-14 they are float16 subnormals, below 2^-25 they round to zero.
Tensor true_weights() {
  std::vector<float> w(kFeatures);
  for (int64_t j = 0; j < kFeatures; ++j)
    w[j] = static_cast<float>((j % 2 ? -1 : 1) * 0x1p-12 * (1 + j / 8.0));
  return ops::from_vector<float>(w, {kFeatures, 1});
}

// fp16_compress_hook, but first counts what float16 does to this rank's share of the sum.
struct CountingState : distributed::CommHookState {
  using CommHookState::CommHookState;
  lab6::Float16Report seen;  // of the current step
};

distributed::FuturePtr counting_fp16_hook(CountingState& state, distributed::GradBucket& bucket) {
  const Tensor& buffer = bucket.buffer();
  // The hook divides by the world size before rounding: these are the values that get rounded.
  const float share = 1.0f / static_cast<float>(state.process_group->size());
  const lab6::Float16Report r =
      lab6::check_float16(buffer.data_ptr<float>(), static_cast<size_t>(buffer.numel()), share);
  state.seen.underflow += r.underflow;
  state.seen.subnormal += r.subnormal;
  state.seen.overflow += r.overflow;
  return distributed::fp16_compress_hook(state, bucket);
}

struct RunResult {
  double loss = 0;
  double weight_error = 0;  // the largest |w - w*| / |w*|
  int64_t underflowed = 0, values = 0;
};

RunResult train(const std::shared_ptr<distributed::ProcessGroup>& pg, const Tensor& x,
                const Tensor& y, bool loss_scaling, int steps) {
  const bool talk = pg->rank() == 0;
  manual_seed(0);
  auto linear = std::make_shared<nn::Linear>(kFeatures, 1);
  {
    autograd::NoGradGuard no_grad;  // start from zero: every weight has to be learned
    for (const Tensor& p : linear->parameters()) ops::mul_(p, 0.0);
  }
  auto ddp = std::make_shared<distributed::DDP>(linear, pg);
  auto state = std::make_shared<CountingState>(pg);
  ddp->register_comm_hook(state, counting_fp16_hook);
  optim::SGD opt(ddp->parameters(), {0.4});

  optim::GradScalerOptions o;
  o.enabled = loss_scaling;
  o.init_scale = 0x1p28;  // too large on purpose: the first steps overflow
  o.growth_interval = 4;  // PyTorch's 2000 is for long runs; 4 shows growth within a few steps
  lab6::LossScaler scaler(o, pg);

  if (talk) {
    std::printf("\n%s loss scaling:\n", loss_scaling ? "WITH" : "WITHOUT");
    std::printf("%5s %12s %12s %10s %10s %9s %8s\n", "step", "scale", "loss", "underflow",
                "subnormal", "overflow", "stepped");
  }
  RunResult result;
  for (int step = 0; step < steps; ++step) {
    state->seen = {};
    const double scale = scaler.get_scale();
    Tensor loss = ddplab::mean(ddplab::square(ddplab::sub(ddp->forward(x), y)));
    opt.zero_grad();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    result.loss = loss.item<double>();
    result.underflowed += state->seen.underflow;
    result.values += kFeatures + 1;
    if (talk)
      std::printf("%5d %12g %12.4e %6lld/%-3lld %10lld %9lld %8s\n", step, scale, result.loss,
                  static_cast<long long>(state->seen.underflow),
                  static_cast<long long>(kFeatures) + 1,
                  static_cast<long long>(state->seen.subnormal),
                  static_cast<long long>(state->seen.overflow), stepped ? "yes" : "SKIPPED");
  }
  const std::vector<float> w = linear->weight.to_vector<float>();
  const std::vector<float> want = true_weights().to_vector<float>();
  for (int64_t j = 0; j < kFeatures; ++j)
    result.weight_error =
        std::fmax(result.weight_error, std::fabs(w[j] - want[j]) / std::fabs(want[j]));
  return result;
}

void run(int steps) {
  auto pg = distributed::init_process_group();
  // Each rank its own samples (seeded by rank), the same rule y = x . w* everywhere.
  Generator gen(100 + static_cast<uint64_t>(pg->rank()));
  const Tensor x = ops::randn({kSamplesPerRank, kFeatures}, {}, &gen);
  const Tensor y = ops::matmul(x, true_weights());

  const RunResult plain = train(pg, x, y, /*loss_scaling=*/false, steps);
  const RunResult scaled = train(pg, x, y, /*loss_scaling=*/true, steps);
  if (pg->rank() == 0) {
    std::printf("\n%-24s %12s %24s %22s\n", "", "final loss", "gradients underflowed",
                "largest weight error");
    for (const auto& [name, r] :
         {std::pair{"without loss scaling", plain}, {"with loss scaling", scaled}})
      std::printf("%-24s %12.4e %12lld of %-10lld %21.2e\n", name, r.loss,
                  static_cast<long long>(r.underflowed), static_cast<long long>(r.values),
                  r.weight_error);
  }
  pg->barrier()->wait();
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  if (steps <= 0) {
    std::fprintf(stderr,
                 "fp16_training: the number of steps must be a positive integer, got '%s'\n",
                 argv[1]);
    return 2;
  }
  try {
    run(steps);
  } catch (const std::exception& e) {  // e.g. a LAB_TODO not done yet: say which, do not abort
    std::fprintf(stderr, "fp16_training: %s\n", e.what());
    return 1;
  }
  return 0;
}
