// The simple communication hooks (PyTorch's torch.distributed.algorithms.ddp_comm_hooks.
// default_hooks): a plain averaging all-reduce, the DDP default, and two that halve the bytes
// on the wire by all-reducing a 16-bit copy of the bucket.
//
//   ddp->register_comm_hook(std::make_shared<distributed::CommHookState>(pg),
//                           distributed::fp16_compress_hook);
//
// Every hook averages: it divides by the world size BEFORE the sum (Note [Averaging] in
// ddp/reducer.cpp), which for the 16-bit hooks also keeps the partial sums inside
// float16's range (max 65504).
#pragma once

#include "ddp/comm_hook.h"

namespace ddplab::distributed {

// Divides the bucket by the world size in place and all-reduces it (the DDP default).
FuturePtr allreduce_hook(CommHookState& state, GradBucket& bucket);

// Divides by the world size, casts to float16 (bfloat16), all-reduces the 16-bit copy and casts
// the sum back into the bucket: half the bytes of allreduce_hook for float32 gradients, at the
// cost of rounding every gradient to 11 (8) significant bits. float16 has more precision and
// less range (small gradients underflow below 6e-8), bfloat16 float32's range and less precision.
FuturePtr fp16_compress_hook(CommHookState& state, GradBucket& bucket);
FuturePtr bf16_compress_hook(CommHookState& state, GradBucket& bucket);

}  // namespace ddplab::distributed
