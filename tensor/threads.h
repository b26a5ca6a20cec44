// The one CPU thread pool.
//
// Every CPU kernel of ddplab and oneDNN's GEMM and convolutions run on the same OpenMP pool. Two
// pools (say OpenBLAS pthreads and OpenMP) busy-wait against each other and, on a 2-core machine,
// can make a step 8x slower; one pool avoids it by construction.
#pragma once

#include <cstdint>

namespace ddplab {

void set_num_threads(int n);
int get_num_threads();

// Runs the enclosing scope with n threads on the calling thread (n = 0: as it is), then restores
// the count: a convolution's backward runs with its forward's count (Note [Threads under load] in
// tensor/adaptive_threads.cpp), and some oneDNN kernels are built for one thread.
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int n);
  ~ScopedNumThreads();
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int prev_;
  bool changed_;
};

// Below this many elements a loop runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelGrain = 32768;

}  // namespace ddplab
