// register_builtin_comm_hook: a name to a hook and its state.
#include "ddp/comm_hooks/builtin.h"

#include "ddp/comm_hooks/default_hooks.h"
#include "ddp/comm_hooks/powerSGD_hook.h"
#include "ddp/ddp.h"
#include "tensor/error.h"

namespace ddplab::distributed {

std::shared_ptr<CommHookState> register_builtin_comm_hook(DistributedDataParallel& ddp,
                                                          const BuiltinCommHookOptions& o) {
  const auto& pg = ddp.process_group();
  if (o.name == "none") {
    // The default hook with a state of our own, so that the bytes can be reported too.
    auto state = std::make_shared<CommHookState>(pg);
    ddp.register_comm_hook(state, allreduce_hook);
    return state;
  }
  if (o.name == "fp16" || o.name == "bf16") {
    auto state = std::make_shared<CommHookState>(pg);
    if (o.name == "fp16") {
      ddp.register_comm_hook(state, fp16_compress_hook);
    } else {
      ddp.register_comm_hook(state, bf16_compress_hook);
    }
    return state;
  }
  DDP_CHECK(o.name == "powersgd", "unknown communication hook '" << o.name << "'; expected one of "
                                                                 << builtin_comm_hook_names());
  DDP_CHECK(o.powersgd_rank >= 1, "PowerSGD: the rank must be at least 1, got " << o.powersgd_rank);
  DDP_CHECK(o.powersgd_start_iter >= 0,
            "PowerSGD: start_powerSGD_iter must be >= 0, got " << o.powersgd_start_iter);
  auto state = std::make_shared<PowerSGDState>(pg);
  state->matrix_approximation_rank = o.powersgd_rank;
  state->start_powerSGD_iter = o.powersgd_start_iter;
  ddp.register_comm_hook(state, powerSGD_hook);
  return state;
}

}  // namespace ddplab::distributed
