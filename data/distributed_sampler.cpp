// DistributedSampler: PyTorch's padding and striding rules over ddplab's seeded permutation.
#include "data/distributed_sampler.h"

#include <numeric>

#include "tensor/error.h"

namespace ddplab::distributed {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last,
                                       bool even_shards)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      even_shards_(even_shards) {
  DDP_CHECK(dataset_size >= 0,
            "DistributedSampler: dataset size " << dataset_size << " is negative");
  DDP_CHECK(num_replicas >= 1,
            "DistributedSampler: num_replicas must be >= 1, got " << num_replicas);
  DDP_CHECK(rank >= 0 && rank < num_replicas,
            "DistributedSampler: rank " << rank << " is outside [0, " << num_replicas << ")");
  DDP_CHECK(even_shards || !drop_last,
            "DistributedSampler: drop_last=true makes the shards even by dropping samples; it "
            "cannot be combined with even_shards=false");
  const int64_t w = num_replicas;
  if (!even_shards) {  // ceil((N - rank) / W) samples: rank, rank + W, ... below N
    num_samples_ = dataset_size > rank ? (dataset_size - rank + w - 1) / w : 0;
    return;
  }
  // PyTorch: with drop_last and an uneven split, ceil((N - W) / W), which equals floor(N / W);
  // otherwise ceil(N / W). floor is written directly (it also stays >= 0 when N < W).
  num_samples_ = drop_last ? dataset_size / w : (dataset_size + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  // 1. The epoch order, identical on every rank. Keyed by (seed, epoch) as RandomSampler is, so
  //    with one replica this is exactly RandomSampler(N, seed).indices(epoch). (PyTorch seeds
  //    one generator with seed + epoch, so its seed 1/epoch 0 equals seed 0/epoch 1; ours not.)
  std::vector<int64_t> order;
  if (shuffle_) {
    order = data::random_permutation(dataset_size_, seed_, epoch);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }

  // 2. Make its length total_size(): pad by repeating from the front (cyclically: a dataset of 2
  //    on 5 ranks becomes 0 1 0 1 0), or truncate when drop_last (neither when !even_shards).
  const auto total = static_cast<size_t>(total_size());
  if (order.size() < total && !order.empty()) {
    const size_t n = order.size();
    order.reserve(total);
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % n]);
  }
  order.resize(total);

  // 3. This rank's stride: order[rank], order[rank + W], order[rank + 2W], ...
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace ddplab::distributed
