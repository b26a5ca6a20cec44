// The ring all-reduce, written out step by step: the teaching version of what Gloo's (and NCCL's)
// all_reduce does for large tensors. ProcessGroupGloo::all_reduce is the one to use; this one is
// here to be read, and tests check that both give the same sums.
//
// The idea (Patarasuk & Yuan 2009; Baidu's "ring all-reduce" 2017). W ranks sit on a ring; each
// sends only to its right neighbour and receives only from its left one. The tensor is cut into
// W chunks.
//   Phase 1, reduce-scatter (W-1 steps): in step s, rank r sends chunk (r - s) mod W to the right
//   and adds the chunk (r - s - 1) mod W arriving from the left into its own copy. Each chunk
//   travels around the ring collecting one rank's contribution per hop, so after W-1 steps rank r
//   holds the complete sum of chunk (r + 1) mod W.
//   Phase 2, all-gather (W-1 steps): in step s, rank r sends chunk (r + 1 - s) mod W (complete)
//   to the right and stores the complete chunk (r - s) mod W arriving from the left.
// Every rank sends 2 (W-1)/W times the tensor in total, whatever W is: the bandwidth-optimal
// all-reduce, which is why DDP is limited by the link speed and not by the number of ranks.
#pragma once

#include <memory>

#include "comm/process_group_gloo.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

// In place: `t` becomes the element-wise sum of every rank's `t`. CPU, contiguous; float32,
// float64 or int64; at most 128 ranks. Runs on pg's worker thread, in order with pg's other
// collectives, under pg's sequence numbers and timeout (its name in errors: "ring_allreduce").
std::shared_ptr<Work> ring_allreduce(ProcessGroupGloo& pg, const Tensor& t);

}  // namespace ddplab::distributed
