// The OpenMP pool size, shared with oneDNN (which also runs on OpenMP).
#include "tensor/threads.h"

#include <omp.h>

#include "tensor/error.h"

namespace ddplab {

void set_num_threads(int n) {
  DDP_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got " << n);
  omp_set_num_threads(n);
}

int get_num_threads() {
  return omp_get_max_threads();
}

ScopedNumThreads::ScopedNumThreads(int n)
    : prev_(omp_get_max_threads()), changed_(n > 0 && n != prev_) {
  if (changed_) omp_set_num_threads(n);
}

ScopedNumThreads::~ScopedNumThreads() {
  if (changed_) omp_set_num_threads(prev_);
}

}  // namespace ddplab
