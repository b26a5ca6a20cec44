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

// Below this many elements a loop runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelGrain = 32768;

}  // namespace ddplab
