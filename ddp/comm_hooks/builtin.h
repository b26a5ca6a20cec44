// The built-in communication hooks by name, for command lines (examples/train's --comm-hook).
#pragma once

#include <memory>
#include <string>

#include "ddp/comm_hook.h"

namespace ddplab::distributed {

class DistributedDataParallel;

struct BuiltinCommHookOptions {
  std::string name = "none";           // none | fp16 | bf16 | powersgd
  int64_t powersgd_rank = 1;           // PowerSGDState::matrix_approximation_rank
  int64_t powersgd_start_iter = 1000;  // PowerSGDState::start_powerSGD_iter
};

// The names register_builtin_comm_hook accepts, for help texts and error messages.
inline const char* builtin_comm_hook_names() {
  return "none|fp16|bf16|powersgd";
}

// Registers the named hook on `ddp` (none: keeps the default averaging all-reduce) and returns
// the hook's state, whose bytes_all_reduced counts what went on the wire. Throws on an unknown
// name or a rank < 1.
std::shared_ptr<CommHookState> register_builtin_comm_hook(DistributedDataParallel& ddp,
                                                          const BuiltinCommHookOptions& options);

}  // namespace ddplab::distributed
