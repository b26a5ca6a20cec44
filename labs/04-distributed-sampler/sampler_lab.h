// Lab 4: the DistributedSampler's sharding, padding and epochs. The two functions the student
// writes (starter/, graded by grader/grader.cpp against PyTorch's cases and the library); the
// reference (solution/) is the library's own distributed::DistributedSampler. Handout: README.md.
#pragma once

#include <cstdint>
#include <vector>

namespace lab4 {

// Part 1. How many samples each of `num_replicas` ranks gets per epoch from a dataset of
// `dataset_size`: every rank the same number, so that all ranks run the same number of steps
// (DDP's all-reduces must pair up). Without drop_last, round up (the last ranks get repeated
// samples: padding); with drop_last, round down (the tail is dropped).
int64_t num_samples(int64_t dataset_size, int num_replicas, bool drop_last);

// Parts 2 and 3. The indices rank `rank` visits in epoch `epoch`:
//   1. the epoch order: 0, 1, ..., N-1, or, when `shuffle`, data::random_permutation(N, seed,
//      epoch) (data/sampler.h): the same on every rank, since every rank computes it alike;
//   2. made num_samples * num_replicas long: padded by repeating the order from its start
//      (cyclically when the dataset is smaller than the padding), or truncated when drop_last;
//   3. this rank's stride: order[rank], order[rank + num_replicas], ...
std::vector<int64_t> shard(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                           uint64_t seed, int64_t epoch, bool drop_last);

}  // namespace lab4
