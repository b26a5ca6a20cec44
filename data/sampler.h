// Samplers: which dataset indices an epoch visits, and in what order.
//
// A sampler's order is a function of the epoch number only, so rank r of a distributed job, a
// restarted job, and a loader with any number of workers all see the same order for the same
// (seed, epoch). Its one piece of state is the current epoch, set as in PyTorch with
// set_epoch(): the DataLoader reads it when an epoch begins, so `sampler->set_epoch(e)` and
// `loader.set_epoch(e)` (which forwards to its sampler) both choose the epoch. The
// DistributedSampler (data/distributed_sampler.h) implements this interface to give each rank its
// share.
#pragma once

#include <cstdint>
#include <vector>

namespace ddplab::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices to visit in epoch `epoch`, in order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // How many indices each epoch has (for len(loader)).
  virtual int64_t size() const = 0;

  // The epoch the next DataLoader epoch visits (PyTorch's set_epoch). Without it every epoch
  // repeats epoch 0's order, exactly as in PyTorch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // The indices of the epoch given to set_epoch.
  std::vector<int64_t> indices() const { return indices(epoch_); }

 private:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 that is a pure function of (seed, epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// A fixed list of indices, the same every epoch (an evaluation subset, a hand-picked order).
class ListSampler : public Sampler {
 public:
  explicit ListSampler(std::vector<int64_t> indices) : indices_(std::move(indices)) {}
  std::vector<int64_t> indices(int64_t /*epoch*/) const override { return indices_; }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }

 private:
  std::vector<int64_t> indices_;
};

// The permutation RandomSampler uses: Fisher-Yates driven by Philox words of stream
// (seed, kShuffle, epoch). Exposed for the DistributedSampler, which shuffles the same way.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace ddplab::data
