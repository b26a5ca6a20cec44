// LAB_TODO marks an exercise in a lab's starter code: until the student replaces it, the function
// throws, naming the exercise, and the grader scores that part 0 (scripts/lab).
#pragma once

#include <string>

#include "tensor/error.h"

namespace lab {

// [[noreturn]]: a function whose whole body is LAB_TODO compiles without a return statement.
[[noreturn]] inline void todo(const std::string& what) {
  throw ddplab::Error("lab exercise not implemented yet: " + what);
}

}  // namespace lab

#define LAB_TODO(what) ::lab::todo(what)
