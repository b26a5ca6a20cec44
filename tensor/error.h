// ddplab's one error type and the check macros that build its messages.
//
// Every user-facing failure (a shape mismatch, a corrupt file, a peer that never arrived) throws
// ddplab::Error with a message naming what is wrong and where. DDP_CHECK keeps call sites short:
//   DDP_CHECK(a.dim() == 2, "mm: expected a 2-D tensor, got shape " << a.shape());
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddplab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ddplab

// Throws ddplab::Error with the streamed message when `cond` is false.
#define DDP_CHECK(cond, msg)                          \
  do {                                                \
    if (!(cond)) {                                    \
      std::ostringstream ddp_check_stream_;           \
      ddp_check_stream_ << msg;                       \
      throw ::ddplab::Error(ddp_check_stream_.str()); \
    }                                                 \
  } while (0)

// Unconditional form, for the end of a switch or an unsupported case.
#define DDP_FAIL(msg) DDP_CHECK(false, msg)
