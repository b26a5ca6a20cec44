// StepMonitor: phase timing, communication sums, TensorBoard scalars and traces (step_monitor.h).
#include "monitor/step_monitor.h"

namespace ddplab::monitor {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Adds the time from its construction to its destruction to `sum`: the monitor's own cost.
class SelfTimer {
 public:
  explicit SelfTimer(double& sum) : sum_(sum), start_(std::chrono::steady_clock::now()) {}
  ~SelfTimer() { sum_ += seconds_between(start_, std::chrono::steady_clock::now()); }
  SelfTimer(const SelfTimer&) = delete;
  SelfTimer& operator=(const SelfTimer&) = delete;

 private:
  double& sum_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

CommTimes comm_times(const distributed::IterationTimeline& t) {
  CommTimes c;
  if (t.finalized_ms >= 0 && t.backward_end_ms >= 0) c.wait_ms = t.finalized_ms - t.backward_end_ms;
  double sum = 0;
  for (const distributed::BucketTimes& b : t.buckets) {
    if (b.launched_ms < 0 || b.finished_ms < 0) continue;
    sum += b.finished_ms - b.launched_ms;
    ++c.buckets;
  }
  if (c.buckets > 0) c.mean_allreduce_ms = sum / static_cast<double>(c.buckets);
  return c;
}

StepMonitor::StepMonitor(const StepMonitorOptions& o) {
  if (!o.logdir.empty() && o.rank == 0) writer_ = std::make_unique<SummaryWriter>(o.logdir);
  if (!o.trace_dir.empty()) {
    trace_ = std::make_unique<ChromeTrace>(o.trace_dir + "/rank" + std::to_string(o.rank) + ".json",
                                           o.rank);
  }
  begin_epoch();
}

void StepMonitor::begin_epoch() {
  step_start_ = batch_end_ = Clock::now();
  epoch_ = EpochTimes{};
}

StepMonitor::BatchScope StepMonitor::batch_arrived() {
  record("data wait", batch_end_, Clock::now());
  return BatchScope(this);
}

void StepMonitor::record(const char* name, Clock::time_point start, Clock::time_point end) {
  if (!trace_) return;
  SelfTimer self(epoch_.monitor_seconds);
  trace_->complete(name, "step", kComputeTrack, start, end);
}

void StepMonitor::reducer_iteration(const distributed::IterationTimeline& t) {
  if (t.iteration < 0 || t.iteration == last_iteration_) return;  // nothing new was synchronized
  last_iteration_ = t.iteration;
  step_comm_ = comm_times(t);
  step_synced_ = true;
  epoch_.comm_wait_seconds += step_comm_.wait_ms / 1e3;
  epoch_.allreduce_ms_sum += step_comm_.mean_allreduce_ms * static_cast<double>(step_comm_.buckets);
  epoch_.allreduces += step_comm_.buckets;
  if (trace_) {
    SelfTimer self(epoch_.monitor_seconds);
    trace_->add_reducer_iteration(t);
  }
}

void StepMonitor::end_step(int64_t step,
                           const std::vector<std::pair<std::string, double>>& scalars) {
  const Clock::time_point now = Clock::now();
  const double step_s = seconds_between(step_start_, now);
  step_start_ = now;
  epoch_.step_seconds += step_s;
  ++epoch_.steps;
  const bool synced = step_synced_;
  step_synced_ = false;
  if (!writer_) return;
  SelfTimer self(epoch_.monitor_seconds);
  for (const auto& [tag, value] : scalars) writer_->add_scalar(tag, value, step);
  writer_->add_scalar("step_time", 1e3 * step_s, step);
  if (synced) {
    writer_->add_scalar("comm_wait_time", step_comm_.wait_ms, step);
    writer_->add_scalar("allreduce_latency", step_comm_.mean_allreduce_ms, step);
  }
}

EpochTimes StepMonitor::end_epoch() {
  {
    SelfTimer self(epoch_.monitor_seconds);
    if (writer_) writer_->flush();
  }
  const EpochTimes done = epoch_;
  begin_epoch();
  return done;
}

}  // namespace ddplab::monitor
