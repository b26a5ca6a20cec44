// gradcheck: compares an op's analytic gradient (its backward) with central finite differences.
//
// Every differentiable op and layer in ddplab is tested with it:
//   auto r = autograd::gradcheck([](const std::vector<Tensor>& x) { return my_op(x[0], x[1]); },
//                                {a, b});
//   CHECK_MESSAGE(r.ok, r.message);
// Inputs that require grad must be float64 CPU tensors (finite differences need the precision).
// A non-scalar output y is checked through L = sum(y * w) with a fixed random w, so a wrong
// gradient in any output element shows up.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::autograd {

struct GradcheckResult {
  bool ok = true;
  std::string message;   // empty when ok; else names input, element and both values
  int input = -1;        // first mismatching input
  int64_t element = -1;  // its row-major element index
  double analytic = 0;   // the backward's value there
  double numeric = 0;    // the finite-difference estimate
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5,
                          double rtol = 1e-3);

}  // namespace ddplab::autograd
