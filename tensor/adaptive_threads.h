// Fewer threads when the machine is busy (Note [Threads under load] in adaptive_threads.cpp).
//
// A training loop calls adapt_threads() once per step, as examples/train (except under
// --deterministic) and bench/bench_train do; DDPLAB_ADAPTIVE_THREADS=0 turns it off everywhere.
#pragma once

#include <cstdint>
#include <map>

namespace ddplab {

// Once per training step, on the thread that runs the step. Every quarter second or so it
// measures how long this process's threads waited for a CPU, and lowers or raises the thread
// count of the calling thread (set_num_threads) between 1 and the count it found on its first
// call (or that the caller set since). Does nothing when DDPLAB_ADAPTIVE_THREADS=0.
void adapt_threads();

// The decision of adapt_threads, apart from the measuring (for tests and for readers).
class ThreadGovernor {
 public:
  explicit ThreadGovernor(int max_threads);
  // One measurement window of `seconds`: `queued` is the mean number of this process's threads
  // that were ready to run but waited for a CPU (their run queue delays summed, over the
  // window's length). Returns the thread count to run the next window with.
  int update(double queued, double seconds);
  int threads() const { return n_; }
  int max_threads() const { return max_; }
  // Seconds of quiet needed before the next try of one more thread.
  double wait_before_raise() const { return wait_before_raise_; }

 private:
  int max_, n_;
  double quiet_for_ = 0;  // seconds in a row with (almost) nothing queued
  double wait_before_raise_;
  bool just_raised_ = false;  // the last window ran with one thread more than the one before
};

// The run queue delay, in seconds, summed over this process's threads from the kernel's
// scheduler statistics (/proc/self/task/*/schedstat), per thread id; empty where the kernel
// keeps none.
std::map<int64_t, double> thread_run_delays();

}  // namespace ddplab
