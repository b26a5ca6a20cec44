// Skipping a test case from inside, when what it checks is not on this machine (no GPU, no
// dataset). A case that merely returned would be counted as passed although it checked nothing;
// a skipped one is counted as skipped, with its reason, by the main() of tests/doctest_main.cpp.
#pragma once

#include <string>

namespace ddplab::testing {

// Marks the running test case as skipped and prints why. Called by DDP_SKIP_IF; defined in
// tests/doctest_main.cpp, which does the counting.
void skip_test_case(const std::string& reason);

}  // namespace ddplab::testing

// Ends the current test case as skipped when `cond` holds. It returns from the enclosing
// function, so use it in the body of the TEST_CASE itself, before anything is checked:
//
//   DDP_SKIP_IF(!cuda_is_available(), "no GPU");
//
// (doctest's own `* doctest::skip()` decorator is decided when the program starts; this one is
// decided while the case runs, where probing the machine is safe.)
#define DDP_SKIP_IF(cond, reason)                \
  do {                                           \
    if (cond) {                                  \
      ::ddplab::testing::skip_test_case(reason); \
      return;                                    \
    }                                            \
  } while (0)
