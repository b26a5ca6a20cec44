// StepMonitor: what a training loop reports about its steps, in one place: the time of each phase
// (data wait, forward, backward, optimizer step), the DDP Reducer's communication, TensorBoard
// scalars and a Chrome trace per rank. examples/train.cpp is its user:
//
//   monitor::StepMonitor mon({/*logdir=*/"runs/a", /*trace_dir=*/"traces", rank});
//   mon.begin_epoch();
//   for (auto& batch : loader) {
//     const auto in_step = mon.batch_arrived();        // the wait since the last batch: data
//     { const auto p = mon.phase("forward"); ... }
//     { const auto p = mon.phase("backward"); loss.backward(); }
//     mon.reducer_iteration(ddp->reducer().last_iteration_timeline());
//     { const auto p = mon.phase("optimizer step"); opt.step(); }
//     mon.end_step(step, {{"train/loss", loss}, {"lr", lr}});
//   }
//   monitor::EpochTimes t = mon.end_epoch();        // for the console summary
//
// With neither a log folder nor a trace folder the monitor only reads the clock a few times per
// step, for the epoch summary. It also times itself, so the cost of monitoring is measured in the
// run it slows down (EpochTimes::monitor_share).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/reducer_timeline.h"
#include "monitor/chrome_trace.h"
#include "monitor/summary_writer.h"

namespace ddplab::monitor {

struct StepMonitorOptions {
  std::string logdir;     // TensorBoard event files, written by rank 0 only ("": none)
  std::string trace_dir;  // Chrome trace DIR/rank<r>.json, one per rank ("": none)
  int rank = 0;
};

// Sums over one epoch's optimizer steps (this rank's view).
struct EpochTimes {
  int64_t steps = 0;
  double step_seconds = 0;       // end of one step to the end of the next (data wait included)
  double comm_wait_seconds = 0;  // backward's end waiting for the last all-reduces
  double allreduce_ms_sum = 0;   // over every bucket all-reduce of the epoch
  int64_t allreduces = 0;
  double monitor_seconds = 0;  // spent writing events and traces

  // The share of step time spent waiting on communication (what overlap did not hide).
  double comm_wait_share() const { return step_seconds > 0 ? comm_wait_seconds / step_seconds : 0; }
  double mean_allreduce_ms() const {
    return allreduces > 0 ? allreduce_ms_sum / static_cast<double>(allreduces) : 0;
  }
  double monitor_share() const { return step_seconds > 0 ? monitor_seconds / step_seconds : 0; }
};

// Communication of one synchronized backward, from the Reducer's recorder.
struct CommTimes {
  // Finalize waited this long (ms) for all-reduces still running when backward ended.
  double wait_ms = 0;
  // Launch to done, averaged over the buckets (ms). An upper bound: the Reducer sees a finished
  // all-reduce only when it next polls (at a gradient hook or at the end of backward).
  double mean_allreduce_ms = 0;
  int64_t buckets = 0;
};
CommTimes comm_times(const distributed::IterationTimeline& timeline);

class StepMonitor {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StepMonitor(const StepMonitorOptions& options);

  SummaryWriter* writer() { return writer_.get(); }  // null unless logging on this rank
  ChromeTrace* trace() { return trace_.get(); }      // null unless tracing

  // The first step of the epoch starts now.
  void begin_epoch();

  // A scope that times one phase of a step and traces it at end() or on destruction.
  class Phase {
   public:
    Phase(StepMonitor* m, const char* name) : m_(m), name_(name), start_(Clock::now()) {}
    ~Phase() { end(); }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    void end() {
      if (m_) m_->record(name_, start_, Clock::now());
      m_ = nullptr;
    }

   private:
    StepMonitor* m_;
    const char* name_;
    Clock::time_point start_;
  };
  [[nodiscard]] Phase phase(const char* name) { return Phase(this, name); }

  // Call first thing in the loop body: traces the wait for this batch (since the previous body
  // ended). The returned scope marks the body's end when it is destroyed.
  class BatchScope {
   public:
    explicit BatchScope(StepMonitor* m) : m_(m) {}
    ~BatchScope() { m_->batch_end_ = Clock::now(); }
    BatchScope(const BatchScope&) = delete;
    BatchScope& operator=(const BatchScope&) = delete;

   private:
    StepMonitor* m_;
  };
  [[nodiscard]] BatchScope batch_arrived();

  // After a backward under DDP: takes the Reducer's last timeline once per synchronized backward
  // (a repeated or unsynchronized one is ignored), for the trace and the epoch's sums.
  void reducer_iteration(const distributed::IterationTimeline& timeline);

  // Ends an optimizer step: adds step_time (ms) and, under DDP, comm_wait_time and
  // allreduce_latency (ms) of its synchronized backward to the given scalars and writes them all
  // to TensorBoard at `step` (rank 0).
  void end_step(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  // This epoch's sums; flushes the files and starts new sums.
  EpochTimes end_epoch();

 private:
  void record(const char* name, Clock::time_point start, Clock::time_point end);

  std::unique_ptr<SummaryWriter> writer_;
  std::unique_ptr<ChromeTrace> trace_;
  Clock::time_point step_start_, batch_end_;
  int64_t last_iteration_ = -1;
  CommTimes step_comm_;
  bool step_synced_ = false;
  EpochTimes epoch_;
};

}  // namespace ddplab::monitor
