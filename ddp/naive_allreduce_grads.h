// The teaching version of DDP's gradient averaging: after backward, one blocking all-reduce per
// parameter. Correct, and the whole idea of data parallelism in ten lines, but slow:
//   - no overlap: communication starts only after backward has finished computing;
//   - one collective per parameter: a ResNet pays a network latency ~60 times per step where the
//     Reducer (ddp/reducer.h) pays it once per 25 MB bucket.
// The Reducer gives the same gradients (tests/distributed/test_ddp.cpp checks this) while hiding
// most of the communication behind backward.
#pragma once

#include "comm/process_group.h"
#include "nn/module.h"

namespace ddplab::distributed {

// Replaces every trainable parameter's .grad with its average over all ranks of `pg`. Call it
// on every rank after loss.backward() and before optimizer.step(). A parameter without a
// gradient contributes zeros (every rank must join every all-reduce, in the same order) and
// gets a zero gradient.
void naive_allreduce_grads(const nn::Module& module, ProcessGroup& pg);

}  // namespace ddplab::distributed
