// Helpers shared by the test executables: the devices to run each test body on, reference
// comparisons, and DDP_SKIP_IF (tests/skip.h).
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tensor/backend.h"
#include "tensor/ops.h"
#include "tests/skip.h"

namespace ddplab::testing {

// CPU always; every CUDA device too when one is present, so a GPU machine runs the same bodies.
inline std::vector<Device> test_devices() {
  std::vector<Device> d{kCPU};
  if (cuda_is_available()) d.push_back(cuda(0));
  return d;
}

// The message of the ddplab::Error that `fn` throws; empty when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Checks that `fn` throws ddplab::Error and that its message contains every fragment.
template <class Fn>
void check_error_mentions(Fn&& fn, const std::vector<std::string>& fragments) {
  bool threw = false;
  try {
    fn();
  } catch (const Error& e) {
    threw = true;
    std::string msg = e.what();
    for (const auto& f : fragments) {
      INFO("message: " << msg);
      CHECK_MESSAGE(msg.find(f) != std::string::npos, "missing '" << f << "'");
    }
  }
  CHECK_MESSAGE(threw, "expected a ddplab::Error");
}

}  // namespace ddplab::testing
