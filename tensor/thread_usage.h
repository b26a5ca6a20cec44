// ThreadUsage: how many of a run's steps ran with fewer threads than asked, because adapt_threads
// (tensor/adaptive_threads.h) lowered the count while other programs held the cores. A training
// loop says so in its epoch summary, so that a slow epoch on a busy machine explains itself.
//
//   ThreadUsage usage(get_num_threads());        // the count asked for, before any adapting
//   for (...) { step(); adapt_threads(); usage.after_step(); }
//   if (usage.fewer_steps() > 0) std::printf("  %s\n", usage.summary().c_str());
#pragma once

#include <cstdint>
#include <string>

namespace ddplab {

class ThreadUsage {
 public:
  explicit ThreadUsage(int asked);

  // Counts one step with the calling thread's count now (get_num_threads).
  void after_step();
  // Counts one step that ran with `threads`.
  void count_step(int threads);

  int asked() const { return asked_; }
  int64_t steps() const { return steps_; }
  int64_t fewer_steps() const { return fewer_; }
  int fewest() const { return fewest_; }  // the asked count while no step ran with fewer

  // "fewer threads in F of S steps (down to N of A): ...; DDPLAB_ADAPTIVE_THREADS=0 keeps A", or
  // "" when every step ran with the count asked for.
  std::string summary() const;

 private:
  int asked_;
  int64_t steps_ = 0, fewer_ = 0;
  int fewest_;
};

}  // namespace ddplab
