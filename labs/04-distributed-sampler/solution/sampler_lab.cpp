// Lab 4, the reference: the library's DistributedSampler (data/distributed_sampler.cpp, which is the
// code to read after the lab).
#include "sampler_lab.h"
#include "data/distributed_sampler.h"

namespace lab4 {

int64_t num_samples(int64_t dataset_size, int num_replicas, bool drop_last) {
  return ddplab::distributed::DistributedSampler(dataset_size, num_replicas, 0, false, 0, drop_last)
      .num_samples();
}

std::vector<int64_t> shard(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                           uint64_t seed, int64_t epoch, bool drop_last) {
  return ddplab::distributed::DistributedSampler(dataset_size, num_replicas, rank, shuffle, seed,
                                                 drop_last)
      .indices(epoch);
}

}  // namespace lab4
