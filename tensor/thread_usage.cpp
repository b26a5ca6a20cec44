// Counting the steps adapt_threads slowed to fewer threads (see thread_usage.h).
#include "tensor/thread_usage.h"

#include <algorithm>
#include <cstdio>

#include "tensor/threads.h"

namespace ddplab {

ThreadUsage::ThreadUsage(int asked) : asked_(asked), fewest_(asked) {}

void ThreadUsage::after_step() {
  count_step(get_num_threads());
}

void ThreadUsage::count_step(int threads) {
  ++steps_;
  if (threads < asked_) ++fewer_;
  fewest_ = std::min(fewest_, threads);
}

std::string ThreadUsage::summary() const {
  if (fewer_ == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "fewer threads in %lld of %lld steps (down to %d of %d): other programs held the "
                "cores; DDPLAB_ADAPTIVE_THREADS=0 keeps %d",
                static_cast<long long>(fewer_), static_cast<long long>(steps_), fewest_, asked_,
                asked_);
  return buf;
}

}  // namespace ddplab
