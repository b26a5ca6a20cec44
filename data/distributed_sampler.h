// DistributedSampler: each rank's share of a dataset, as PyTorch's
// torch.utils.data.distributed.DistributedSampler.
//
// Every rank computes the same epoch order (a permutation that depends only on seed and epoch),
// pads it so it divides evenly by the number of replicas, and keeps every num_replicas-th index
// starting at its own rank. So the ranks together visit every sample once per epoch (plus a few
// repeated for padding), no two ranks overlap outside the padding, and no communication is needed.
// With even_shards=false nothing is padded: every sample is visited exactly once, and the ranks'
// shares differ by at most one sample, so their numbers of batches may differ by one; train them
// inside a distributed::Join (comm/join.h), or the rank with more batches waits forever.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sampler.h"

// In data/ with the other samplers (it needs no process group: rank and world size are numbers),
// and in the namespace distributed, where users look for it, as PyTorch's
// torch.utils.data.distributed.
namespace ddplab::distributed {

class DistributedSampler : public data::Sampler {
 public:
  // drop_last=false pads by repeating the first indices of the epoch order (cyclically when the
  // dataset is smaller than the padding); drop_last=true drops the tail so every rank gets
  // floor(N / num_replicas) samples. even_shards=false (not in PyTorch, whose sampler always
  // pads or drops) does neither: rank r gets the samples r, r + W, r + 2W, ... of the epoch
  // order, i.e. ceil((N - r) / W) of them.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false, bool even_shards = true);

  // set_epoch(e) (from data::Sampler) picks the epoch: call it at the start of every epoch,
  // directly or through DataLoader::set_epoch; without it every epoch repeats the same order,
  // exactly as in PyTorch.

  // This rank's indices for `epoch` (the Sampler interface; ignores set_epoch).
  std::vector<int64_t> indices(int64_t epoch) const override;
  // This rank's indices for the epoch given to set_epoch.
  using data::Sampler::indices;
  // Samples per rank per epoch.
  int64_t size() const override { return num_samples_; }
  int64_t num_samples() const { return num_samples_; }
  // The padded (or truncated) length of the epoch order, num_samples() * num_replicas; with
  // even_shards=false the dataset size.
  int64_t total_size() const { return even_shards_ ? num_samples_ * num_replicas_ : dataset_size_; }
  bool even_shards() const { return even_shards_; }

  int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  bool even_shards_;
  int64_t num_samples_;
};

}  // namespace ddplab::distributed
