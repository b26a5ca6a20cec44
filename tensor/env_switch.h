// The project's on/off switches in the environment (DDPLAB_FUSED, DDPLAB_BLOCKED,
// DDPLAB_ADAPTIVE_THREADS): a fast path is on unless its variable starts with '0', so that
// `NAME=0` turns it off for a comparison and anything else, or nothing, leaves it as it is.
#pragma once

#include <cstdlib>

namespace ddplab {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || v[0] != '0';
}

}  // namespace ddplab
