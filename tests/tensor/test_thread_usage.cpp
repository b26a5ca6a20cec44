// tensor/thread_usage.h: the count of steps adapt_threads ran with fewer threads, and the line a
// training loop prints about them.
#include <doctest/doctest.h>

#include "tensor/thread_usage.h"
#include "tensor/threads.h"

using namespace ddplab;

TEST_CASE("ThreadUsage: silent while every step has the threads asked for") {
  ThreadUsage usage(4);
  for (int i = 0; i < 3; ++i) usage.count_step(4);
  CHECK(usage.steps() == 3);
  CHECK(usage.fewer_steps() == 0);
  CHECK(usage.fewest() == 4);
  CHECK(usage.summary().empty());
}

TEST_CASE("ThreadUsage: counts the steps with fewer threads and the fewest") {
  ThreadUsage usage(4);
  for (int threads : {4, 3, 1, 2, 4}) usage.count_step(threads);
  CHECK(usage.steps() == 5);
  CHECK(usage.fewer_steps() == 3);
  CHECK(usage.fewest() == 1);
  CHECK(usage.summary() ==
        "fewer threads in 3 of 5 steps (down to 1 of 4): other programs held the cores; "
        "DDPLAB_ADAPTIVE_THREADS=0 keeps 4");
}

TEST_CASE("ThreadUsage::after_step reads the calling thread's count") {
  const int before = get_num_threads();
  ThreadUsage usage(2);
  set_num_threads(1);
  usage.after_step();
  set_num_threads(2);
  usage.after_step();
  set_num_threads(before);
  CHECK(usage.steps() == 2);
  CHECK(usage.fewer_steps() == 1);
  CHECK(usage.fewest() == 1);
}
