// The check DistributedDataParallel runs before anything else: do all ranks hold the same model?
//
// DDP broadcasts rank 0's parameters into every rank's tensors and later all-reduces gradient
// buckets laid out from the local parameter list; both silently assume every rank has the same
// parameters and buffers in the same order with the same shapes and dtypes. A rank that built a
// different model would otherwise fail much later with a size mismatch inside a collective, or
// not at all (same total size, wrong numbers). This turns that into one error at construction,
// raised on every rank, naming each difference.
#pragma once

#include "comm/process_group.h"
#include "nn/module.h"

namespace ddplab::distributed {

// Collective (every rank of `pg` calls it). Returns when the ranks' parameters and buffers match
// in name, shape and dtype; otherwise throws on every rank, listing how each rank differs from
// rank 0. Costs one all-gather of an 8-byte hash when the models match.
void verify_same_model_on_all_ranks(const nn::Module& module, ProcessGroup& pg);

}  // namespace ddplab::distributed
