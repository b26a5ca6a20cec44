// Note [Threads under load]
//
// A training step is a chain of parallel regions: each convolution, each batch norm pass, each
// elementwise op splits its work between the pool's threads and waits for the last of them at
// the end. On a machine of its own that costs little. On a busy one it costs much: when another
// program holds one of the cores, one of our threads waits for the scheduler to give it a turn
// (milliseconds) while the other has finished its half and waits at the region's end, and this
// repeats at every region, a few hundred per step. resnet20 at batch 128 on a 2-core machine with
// two competing spinning processes (bench_train.py --load 2, 2026-12-04, Intel Xeon with AMX):
// float32 345 ms per step with 2 threads, 290 ms with 1; bfloat16 208 ms with 2, 137 with 1. One
// competing process: 236 vs 202 ms, 148 vs 98. So when the cores are taken, fewer threads finish
// the step sooner.
//
// What "taken" means is measured, not guessed: Linux keeps for every thread the time it spent
// ready to run but waiting for a CPU (the run queue delay, /proc/self/task/*/schedstat). Summed
// over this process's threads and divided by the wall time of a window, it is the mean number of
// our threads that were waiting: about 0 on a quiet machine, about 1 with two threads and two
// competing programs on two cores (each of our threads gets half a core), about 0.33 with one
// thread and the same two programs. It sees what the process sees, whatever the cause (other
// programs, other containers on the host, our own data-loading threads), and needs no knowledge
// of the machine.
//
// The rule (ThreadGovernor), applied once per window of about a quarter second:
//  * If half a thread or more waited on average, run that many threads fewer (rounded, at least
//    one fewer, never below 1): we were running threads the machine could not give cores to.
//  * If almost nothing waited for a while, try one thread more (up to the count the program
//    asked for). If the try makes threads wait again, it is undone at the next window, and the
//    next try waits twice as long (1 s, 2 s, ... at most 64 s): with one competing program on
//    two cores, 1 thread runs free and 2 would queue, and the count would otherwise swing between
//    them.
//
// Changing the count during a run changes how oneDNN splits a convolution's work, and with it
// the rounding of its sums: a run that must be bitwise reproducible keeps its count fixed
// (examples/train does so under --deterministic). oneDNN sizes many kernels for the thread
// count they were built with, so its primitives are cached per count (nn/onednn.cpp), and a
// convolution's backward runs with its forward's count (nn/conv.cpp).
#include "tensor/adaptive_threads.h"

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>

#include "tensor/env_switch.h"
#include "tensor/error.h"
#include "tensor/threads.h"

namespace ddplab {

namespace {

constexpr double kWindowSeconds = 0.25;
constexpr double kLowerAt = 0.5;     // mean threads waiting at which we run fewer
constexpr double kQuietBelow = 0.1;  // mean threads waiting below which the machine is quiet
constexpr double kFirstWait = 1.0;   // seconds of quiet before trying one thread more
constexpr double kLongestWait = 64.0;

}  // namespace

ThreadGovernor::ThreadGovernor(int max_threads)
    : max_(max_threads), n_(max_threads), wait_before_raise_(kFirstWait) {
  DDP_CHECK(max_threads >= 1, "ThreadGovernor: need at least 1 thread, got " << max_threads);
}

int ThreadGovernor::update(double queued, double seconds) {
  if (queued >= kLowerAt && n_ > 1) {
    const int fewer = std::max(1, static_cast<int>(std::lround(queued)));
    if (just_raised_) wait_before_raise_ = std::min(2 * wait_before_raise_, kLongestWait);
    n_ = std::max(1, n_ - fewer);
    just_raised_ = false;
    quiet_for_ = 0;
    return n_;
  }
  if (just_raised_) {  // the extra thread found a core: the next try need not wait long
    wait_before_raise_ = kFirstWait;
    just_raised_ = false;
  }
  quiet_for_ = queued < kQuietBelow ? quiet_for_ + seconds : 0;
  if (n_ < max_ && quiet_for_ >= wait_before_raise_) {
    ++n_;
    just_raised_ = true;
    quiet_for_ = 0;
  }
  return n_;
}

std::map<int64_t, double> thread_run_delays() {
  std::map<int64_t, double> out;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    // Three numbers: time on a CPU, time waiting on a run queue (both ns), time slices.
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/schedstat");
    double on_cpu = 0, waiting = 0;
    if (f >> on_cpu >> waiting) out[std::atoll(e->d_name)] = waiting * 1e-9;
  }
  closedir(dir);
  return out;
}

void adapt_threads() {
  static const bool enabled = env_switch_on("DDPLAB_ADAPTIVE_THREADS");
  if (!enabled) return;
  using Clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static std::optional<ThreadGovernor> governor;
  static Clock::time_point window_start;
  static std::map<int64_t, double> delays_at_start;
  std::lock_guard<std::mutex> lock(mutex);
  const Clock::time_point now = Clock::now();
  // First call, or the program set a count of its own since: that count is the most to run.
  if (!governor || governor->threads() != get_num_threads()) {
    governor.emplace(get_num_threads());
    window_start = now;
    delays_at_start = thread_run_delays();
    return;
  }
  const double seconds = std::chrono::duration<double>(now - window_start).count();
  if (seconds < kWindowSeconds) return;
  std::map<int64_t, double> delays = thread_run_delays();
  double waited = 0;
  for (const auto& [tid, delay] : delays) {
    auto before = delays_at_start.find(tid);  // a thread started in the window: all of its delay
    waited += delay - (before == delays_at_start.end() ? 0.0 : before->second);
  }
  const int n = governor->update(waited / seconds, seconds);
  if (n != get_num_threads()) set_num_threads(n);
  window_start = now;
  delays_at_start = std::move(delays);
}

}  // namespace ddplab
