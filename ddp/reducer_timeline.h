// When things happened inside one synchronized backward: per-parameter gradient arrival and
// per-bucket ready / launched / finished times, recorded for the Reducer (ddp/reducer.h).
//
// The Reducer makes one call per event (a gradient arrived, a bucket was launched, ...) and the
// recorder does the clock arithmetic, so reducer.cpp reads as the algorithm. The result of the
// last completed iteration is an IterationTimeline: what tests check overlap with, what
// bench/bench_ddp prints, and what the monitoring tools render (monitor/chrome_trace.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddplab::distributed {

// All times in milliseconds since backward reached the module's output (steady_clock); -1 means
// "did not happen".
struct BucketTimes {
  double ready_ms = -1;     // its last gradient arrived
  double launched_ms = -1;  // its all-reduce was issued (>= ready: buckets launch in order)
  double finished_ms = -1;  // first time the reducer saw the all-reduce complete (an upper bound:
                            // it polls at every gradient hook and at the end of backward)
  // How many parameters' gradients had arrived when its all-reduce was issued: unlike the times,
  // deterministic, so a test can compare bucket layouts on a noisy machine.
  int64_t grads_ready_at_launch = -1;
};
struct IterationTimeline {
  int64_t iteration = -1;                         // counts synchronized backward passes from 0
  std::chrono::steady_clock::time_point start{};  // the clock's zero: when backward started
  std::vector<BucketTimes> buckets;               // by bucket index
  std::vector<double> param_ready_ms;  // by parameter index; -1 for a parameter marked unused
  double backward_end_ms = -1;         // the end-of-backward callback started
  double finalized_ms = -1;            // all averaged gradients were in .grad
};

class IterationRecorder {
 public:
  // A new iteration with this layout; forgets the current (unfinished) one.
  void begin(int64_t iteration, size_t num_buckets, size_t num_params);
  // Starts the clock: backward reached the module's output (or the first gradient arrived).
  void backward_started();
  void param_ready(size_t param);
  void bucket_ready(size_t bucket);
  void bucket_launched(size_t bucket);
  void bucket_finished(size_t bucket);  // keeps the first report only (the Reducer polls)
  void backward_ended();
  // The averaged gradients are in .grad: the iteration becomes last().
  void finalized();

  const IterationTimeline& last() const { return last_; }

 private:
  double now_ms() const;

  std::chrono::steady_clock::time_point t0_;
  int64_t grads_ready_ = 0;
  IterationTimeline current_, last_;
};

}  // namespace ddplab::distributed
