// Lab 2: all-reduce from point-to-point messages. The functions the student writes (starter/,
// graded by grader/grader.cpp against Gloo's all_reduce); solution/ is the course staff's
// version. Handout: README.md. Communication goes only through lab2::Comm (comm.h).
#pragma once

#include <cstddef>

#include "comm.h"

namespace lab2 {

using AllReduceFn = void (*)(Comm& comm, float* data, size_t n);

// Part 1. The ring all-reduce, in place: every rank's `data` (n floats) becomes the element-wise
// sum over all ranks. Cut the buffer into size() chunks; W-1 reduce-scatter steps, then W-1
// all-gather steps, each rank sending only to rank+1 and receiving only from rank-1 (sendrecv).
// n may be smaller than the number of ranks (some chunks are empty) or 0.
void ring_allreduce(Comm& comm, float* data, size_t n);

// Part 2. A binomial-tree all-reduce, in place: reduce to rank 0 along a tree of depth
// ceil(log2 W) (in round k, rank r with bit k set sends its partial sum to r - 2^k and drops out;
// ranks that receive add it in), then broadcast the total back down the same tree.
void tree_allreduce(Comm& comm, float* data, size_t n);

// Part 3. nccl-tests' bus bandwidth of an all-reduce: the algorithm bandwidth (bytes / time)
// times 2 (W-1) / W, the fraction of the data each rank's link must carry in a bandwidth-optimal
// all-reduce; it makes numbers comparable across W. 0 for one rank.
double allreduce_bus_bandwidth(double algorithm_bandwidth, int world_size);

}  // namespace lab2
