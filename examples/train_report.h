// What examples/train tells while it runs (docs/monitoring.md): the setup once the model is built;
// per optimizer step a progress line, TensorBoard scalars and the gradient-norm warning; per
// epoch the result line, the summary of where step time went and a row of the --metrics file.
// Rank 0 prints and writes the files (every rank writes its own trace). The loop calls in:
//
//   train::Report report(c, dist, steps, loop.step);
//   every epoch:  report.begin_epoch(loop);
//                 every step:  ... report.check_grad_norm(loop, stepped);
//                              ... report.end_step(loop, lr, scaler.get_scale());
//                 report.before_evaluation();
//                 ... report.end_epoch(epoch, loop, test_acc, opt.lr(), scaler, ddp);
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "ddp/ddp.h"
#include "examples/train_checkpoint.h"
#include "examples/train_config.h"
#include "examples/train_setup.h"
#include "monitor/console.h"
#include "monitor/metrics_log.h"
#include "monitor/step_monitor.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "tensor/device.h"
#include "tensor/thread_usage.h"

namespace ddplab::train {

// Rank 0, once the model is built: the model, the data and the device; DDP's shape of the job;
// the accumulation. With --sync-bn but one process, the note that nothing changed.
void print_setup(const Config& c, const nn::Module& net, int64_t n_train, int64_t n_test,
                 Device device, const Distributed& dist);
// Rank 0, once the optimizer is built: --zero's sharding (or why there is none), and an
// --accumulation-steps larger than an epoch.
void print_step_notes(const Config& c, const Distributed& dist, const StepCounts& steps);

class Report {
 public:
  using Clock = std::chrono::steady_clock;

  // `first_step` > 0 when resumed: the ETA counts this run's steps. Before the first step: the
  // calling thread's count now is the one asked for, which adapt_threads may lower later.
  Report(const Config& c, const Distributed& dist, const StepCounts& steps, int64_t first_step);

  // Phase times, TensorBoard, the trace (docs/monitoring.md): the loop reports its phases here.
  monitor::StepMonitor& monitor() { return mon_; }

  void begin_epoch(const train::LoopState& loop);
  // Rank 0 warns when the step's gradient norm exceeds --grad-norm-warn; a skipped step's norm
  // is inf by definition, and the scaler has dealt with it.
  void check_grad_norm(const train::LoopState& loop, bool stepped);
  // After each optimizer step: TensorBoard's scalars and, on rank 0, the progress line.
  void end_step(const train::LoopState& loop, double lr, double loss_scale);
  // The epoch's training ends here: its speed leaves out the evaluation.
  void before_evaluation();
  // Rank 0: the epoch's result line, its summary and its metrics row. `ddp`: null when alone.
  void end_epoch(int epoch, const train::LoopState& loop, double test_acc, double lr,
                 const optim::GradScaler& scaler, const distributed::DDP* ddp);

 private:
  const Config& c_;
  int world_;
  bool main_rank_;
  StepCounts steps_;
  int asked_threads_;
  std::optional<monitor::MetricsLog> metrics_;  // rank 0, with --metrics
  monitor::StepMonitor mon_;
  monitor::Progress bar_;
  int64_t first_step_;
  Clock::time_point run_start_, epoch_start_;
  int64_t seen_before_ = 0;  // examples of this epoch a resumed run did not see
  ThreadUsage thread_usage_;
  double train_seconds_ = 0;
  monitor::EpochTimes times_;
};

}  // namespace ddplab::train
