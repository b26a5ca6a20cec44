// The Reducer's per-iteration timeline (see reducer_timeline.h).
#include "ddp/reducer_timeline.h"

namespace ddplab::distributed {

void IterationRecorder::begin(int64_t iteration, size_t num_buckets, size_t num_params) {
  current_ = IterationTimeline{};
  current_.iteration = iteration;
  current_.buckets.assign(num_buckets, BucketTimes{});
  current_.param_ready_ms.assign(num_params, -1);
  grads_ready_ = 0;
  t0_ = std::chrono::steady_clock::now();
}

double IterationRecorder::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

void IterationRecorder::backward_started() {
  t0_ = std::chrono::steady_clock::now();
}

void IterationRecorder::param_ready(size_t param) {
  current_.param_ready_ms[param] = now_ms();
  ++grads_ready_;
}

void IterationRecorder::bucket_ready(size_t bucket) {
  current_.buckets[bucket].ready_ms = now_ms();
}

void IterationRecorder::bucket_launched(size_t bucket) {
  current_.buckets[bucket].launched_ms = now_ms();
  current_.buckets[bucket].grads_ready_at_launch = grads_ready_;
}

void IterationRecorder::bucket_finished(size_t bucket) {
  if (current_.buckets[bucket].finished_ms < 0) current_.buckets[bucket].finished_ms = now_ms();
}

void IterationRecorder::backward_ended() {
  current_.backward_end_ms = now_ms();
}

void IterationRecorder::finalized() {
  current_.finalized_ms = now_ms();
  current_.start = t0_;
  last_ = current_;
}

}  // namespace ddplab::distributed
