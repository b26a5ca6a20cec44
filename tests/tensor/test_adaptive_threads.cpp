// Note [Threads under load] (tensor/adaptive_threads.cpp): the governor's rule on made-up
// measurements, the run queue delays Linux reports, and adapt_threads under contention this test
// makes itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "tensor/adaptive_threads.h"
#include "tensor/threads.h"
#include "tests/skip.h"

using namespace ddplab;

namespace {

// Runs `windows` windows of a quarter second with `queued` threads waiting on average.
int run_windows(ThreadGovernor& g, double queued, int windows) {
  for (int i = 0; i < windows; ++i) g.update(queued, 0.25);
  return g.threads();
}

// Spins `n` threads, and after `seconds` calls `then` while they still spin: more runnable threads
// than cores, so some of them wait (a thread that has exited leaves no statistics behind).
template <class F>
void with_spinners(int n, double seconds, F then) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  spinners.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    spinners.emplace_back([&stop] {
      volatile double x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  then();
  stop = true;
  for (auto& t : spinners) t.join();
}

int spinners_for_contention() {
  return 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

TEST_CASE("ThreadGovernor: a quiet machine keeps every thread") {
  ThreadGovernor g(4);
  CHECK(run_windows(g, 0.0, 100) == 4);
  CHECK(run_windows(g, 0.45, 100) == 4);  // under half a thread waiting: not worth a thread
}

TEST_CASE("ThreadGovernor: fewer threads by the number that waited, never below one") {
  ThreadGovernor g(8);
  CHECK(g.update(3.2, 0.25) == 5);
  CHECK(g.update(0.6, 0.25) == 4);  // at least one fewer from half a thread on
  CHECK(g.update(9.0, 0.25) == 1);
  CHECK(g.update(5.0, 0.25) == 1);
  ThreadGovernor single(1);
  CHECK(single.update(3.0, 0.25) == 1);
}

TEST_CASE("ThreadGovernor: back up one thread at a time after a second of quiet") {
  ThreadGovernor g(3);
  CHECK(g.update(2.0, 0.25) == 1);
  CHECK(run_windows(g, 0.33, 40) == 1);  // others still hold the cores: stay down
  CHECK(run_windows(g, 0.0, 3) == 1);    // 0.75 s of quiet
  CHECK(g.update(0.0, 0.25) == 2);       // 1 s
  CHECK(g.update(0.05, 0.25) == 2);      // the new thread found a core (and a quiet window)
  CHECK(run_windows(g, 0.0, 2) == 2);
  CHECK(g.update(0.0, 0.25) == 3);
  CHECK(run_windows(g, 0.0, 40) == 3);  // never above the count asked for
}

TEST_CASE("ThreadGovernor: a try that makes threads wait again waits twice as long next time") {
  // One competing program on two cores: one thread runs free, two queue.
  ThreadGovernor g(2);
  CHECK(g.update(0.67, 0.25) == 1);
  double wait = g.wait_before_raise();
  CHECK(wait == doctest::Approx(1.0));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const int quiet_windows = static_cast<int>(wait / 0.25);
    CHECK(run_windows(g, 0.0, quiet_windows - 1) == 1);
    CHECK(g.update(0.0, 0.25) == 2);   // the try
    CHECK(g.update(0.67, 0.25) == 1);  // undone
    const double expected = std::min(2 * wait, 64.0);
    CHECK(g.wait_before_raise() == doctest::Approx(expected));
    wait = g.wait_before_raise();
  }
  CHECK(wait == doctest::Approx(64.0));
  // The competitor leaves: the next try holds, and the wait is short again.
  run_windows(g, 0.0, static_cast<int>(wait / 0.25));
  CHECK(g.threads() == 2);
  CHECK(g.update(0.0, 0.25) == 2);
  CHECK(g.wait_before_raise() == doctest::Approx(1.0));
}

// The run queue delay of this process's threads over `seconds` of twice as many spinning
// threads as cores: about half of them wait at any time, 0.5 s per core and second in all.
// 0 where the kernel keeps no such statistics (no files, or delays never counted).
struct Waiting {
  double seconds = 0;
  bool never_less = true;         // no thread's delay went down
  size_t before = 0, during = 0;  // threads counted
};

Waiting waited_while_spinning(double seconds) {
  const auto before = thread_run_delays();
  std::map<int64_t, double> during;
  with_spinners(spinners_for_contention(), seconds, [&] { during = thread_run_delays(); });
  Waiting w;
  w.before = before.size();
  w.during = during.size();
  for (const auto& [tid, delay] : during) {
    auto b = before.find(tid);
    const double was = b == before.end() ? 0.0 : b->second;  // a spinner: all of its delay
    w.never_less = w.never_less && delay >= was;
    w.seconds += delay - was;
  }
  return w;
}

TEST_CASE("thread_run_delays: the time runnable threads waited for a CPU") {
  const Waiting w = waited_while_spinning(0.3);
  DDP_SKIP_IF(w.seconds == 0, "no run queue delays in /proc/self/task/*/schedstat here");
  CHECK(w.never_less);
  CHECK(w.during >= w.before);  // the calling thread and the spinners
  CHECK(w.seconds > 0.05);      // about 0.15 s per core
}

TEST_CASE("adapt_threads: runs fewer threads while others hold every core") {
  DDP_SKIP_IF(waited_while_spinning(0.1).seconds == 0,
              "no run queue delays in /proc/self/task/*/schedstat here");
  const ScopedNumThreads start(2);
  adapt_threads();  // the first call takes the count as the most to run
  // Twice as many spinning threads as cores, for longer than a window: on average at least one
  // of them waits, far above the half a thread at which the governor gives one up.
  with_spinners(spinners_for_contention(), 0.4, [] { adapt_threads(); });
  CHECK(get_num_threads() == 1);
}
