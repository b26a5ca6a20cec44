// What train prints and logs as it runs (see train_report.h).
#include "examples/train_report.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tensor/threads.h"

namespace ddplab::train {

namespace {

double seconds_since(Report::Clock::time_point start) {
  return std::chrono::duration<double>(Report::Clock::now() - start).count();
}

}  // namespace

void print_setup(const Config& c, const nn::Module& net, int64_t n_train, int64_t n_test,
                 Device device, const Distributed& dist) {
  if (c.sync_bn && !dist.pg) std::printf("note: --sync-bn with one process: BatchNorm2d kept\n");
  std::printf("model %s: %lld parameters; %s: %lld train / %lld test examples; device %s\n",
              c.model.c_str(), static_cast<long long>(net.num_parameters()), c.dataset.c_str(),
              static_cast<long long>(n_train), static_cast<long long>(n_test),
              device.str().c_str());
  if (dist.pg) {  // DDP: the job's shape
    std::printf("DDP: %d ranks (%s), batch %lld per rank%s, comm hook %s%s\n", dist.world,
                dist.pg->backend_name().c_str(), static_cast<long long>(c.batch_size),
                c.sync_bn ? ", SyncBatchNorm" : "", c.comm_hook.c_str(),
                c.even_shards == "on" ? "" : ", uneven shards (Join)");
  }
  if (c.accumulation_steps > 1) {
    std::printf("accumulation: %lld micro-batches per step, %lld examples per step\n",
                static_cast<long long>(c.accumulation_steps),
                static_cast<long long>(c.accumulation_steps) * c.batch_size * dist.world);
  }
}

void print_step_notes(const Config& c, const Distributed& dist, const StepCounts& steps) {
  if (c.zero && dist.pg) {  // DDP:
    std::printf("ZeRO-1: optimizer state sharded over %d ranks\n", dist.world);
  } else if (c.zero) {
    std::printf("note: --zero with one process: nothing to shard, plain SGD\n");
  }
  if (steps.accumulation > steps.micro_per_epoch) {
    std::printf(
        "note: --accumulation-steps %lld exceeds the %lld batches of an epoch: one "
        "optimizer step per epoch\n",
        static_cast<long long>(steps.accumulation), static_cast<long long>(steps.micro_per_epoch));
  }
}

namespace {

std::optional<monitor::MetricsLog> open_metrics(const Config& c, bool main_rank) {
  std::optional<monitor::MetricsLog> m;
  if (!c.metrics.empty() && main_rank) m.emplace(c.metrics);
  return m;
}

}  // namespace

Report::Report(const Config& c, const Distributed& dist, const StepCounts& steps,
               int64_t first_step)
    : c_(c),
      world_(dist.world),
      main_rank_(dist.main_rank),
      steps_(steps),
      asked_threads_(get_num_threads()),
      metrics_(open_metrics(c, dist.main_rank)),
      mon_({c.logdir, c.trace_dir, dist.pg ? dist.pg->rank() : 0}),  // DDP: a trace per rank
      first_step_(first_step),
      run_start_(Clock::now()),
      thread_usage_(asked_threads_) {
  if (mon_.writer()) {
    mon_.writer()->add_text("backend", dist.pg ? dist.pg->backend_name() : "none", 0);  // DDP:
  }
}

void Report::begin_epoch(const train::LoopState& loop) {
  epoch_start_ = Clock::now();
  seen_before_ = loop.seen;
  thread_usage_ = ThreadUsage(asked_threads_);
  mon_.begin_epoch();
}

void Report::check_grad_norm(const train::LoopState& loop, bool stepped) {
  if (main_rank_ && stepped && c_.grad_norm_warn > 0 && !(loop.grad_norm <= c_.grad_norm_warn)) {
    bar_.end_line();  // on a terminal, below the progress line
    std::printf("warning: step %lld: gradient norm %.4g exceeds --grad-norm-warn %g%s\n",
                static_cast<long long>(loop.step), loop.grad_norm, c_.grad_norm_warn,
                c_.clip_grad_norm > 0 ? " (clipped)" : "");
  }
}

void Report::end_step(const train::LoopState& loop, double lr, double loss_scale) {
  thread_usage_.after_step();
  const double ips = static_cast<double>(loop.seen - seen_before_) / seconds_since(epoch_start_);
  const double eta = seconds_since(run_start_) / static_cast<double>(loop.step - first_step_) *
                     static_cast<double>(steps_.total - loop.step);
  const double seen = static_cast<double>(loop.seen);
  const double loss = loop.loss_sum / seen, acc = static_cast<double>(loop.correct) / seen;
  mon_.end_step(loop.step, {{"train/loss", loss},
                            {"train/accuracy", acc},
                            {"lr", lr},
                            {"grad_norm", loop.grad_norm},
                            {"loss_scale", loss_scale},
                            {"images_per_sec", ips * world_}});  // DDP: * world, the whole job's
  if (main_rank_) {                                              // DDP: rank 0 prints
    const bool last = loop.step >= steps_.total || loop.epoch_steps == steps_.per_epoch;
    bar_.update(static_cast<int>(loop.epoch), loop.epoch_steps, steps_.per_epoch, loss, acc,
                ips * world_, eta, last);
  }
}

void Report::before_evaluation() {
  train_seconds_ = seconds_since(epoch_start_);
  times_ = mon_.end_epoch();
}

void Report::end_epoch(int epoch, const train::LoopState& loop, double test_acc, double lr,
                       const optim::GradScaler& scaler, const distributed::DDP* ddp) {
  if (mon_.writer()) {
    mon_.writer()->add_scalar("val/accuracy", test_acc, loop.step);
    mon_.writer()->flush();
  }
  if (!main_rank_) return;  // DDP: rank 0 prints and writes the metrics
  bar_.end_line();
  const double seconds = seconds_since(epoch_start_);
  const double seen = static_cast<double>(loop.seen);
  const double train_loss = loop.seen ? loop.loss_sum / seen : 0.0;
  const double train_acc = loop.seen ? static_cast<double>(loop.correct) / seen : 0.0;
  const double ips =  // DDP: * world
      static_cast<double>((loop.seen - seen_before_) * world_) / train_seconds_;
  std::printf(
      "epoch %d: train loss %.4f, train acc %.2f%%, test acc %.2f%%, %.1f img/s, "
      "%.1f s, lr %.5f\n",
      epoch, train_loss, 100 * train_acc, 100 * test_acc, ips, seconds, lr);
  monitor::print_epoch_summary(times_, {ddp != nullptr, mon_.writer() || mon_.trace(),
                                        c_.comm_wait_warn, c_.allreduce_warn_ms});
  if (thread_usage_.fewer_steps() > 0) std::printf("  %s\n", thread_usage_.summary().c_str());
  std::fflush(stdout);
  if (!metrics_) return;
  nlohmann::ordered_json j = {{"epoch", epoch},           {"step", loop.step},
                              {"train_loss", train_loss}, {"train_acc", train_acc},
                              {"test_acc", test_acc},     {"images_per_sec", ips},
                              {"seconds", seconds},       {"grad_norm", loop.grad_norm}};
  if (c_.grad_scaler) {
    j["loss_scale"] = scaler.get_scale();
    j["skipped_steps"] = loop.skipped_steps;
  }
  // DDP: rounds of bucket all-reduces so far; with accumulation, equal to "step".
  if (ddp) j["grad_sync_rounds"] = ddp->reducer().num_synchronized_backwards();
  // DDP: what the communication hook put on the wire in the last step.
  if (ddp) j["bytes_all_reduced_per_step"] = ddp->reducer().bytes_all_reduced_last_iteration();
  metrics_->write(j);
}

}  // namespace ddplab::train
