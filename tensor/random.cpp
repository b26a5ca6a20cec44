// The process-wide default generator.
#include "tensor/random.h"

namespace ddplab {

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) {
  default_generator().manual_seed(seed);
}

}  // namespace ddplab
