// evaluate_sharded: test accuracy computed by all ranks together, each on its own share of the
// test set, and exact: the same number one process would get on the same weights.
//
//   auto result = distributed::evaluate_sharded(*net, test_set, {.batch_size = 256}, pg.get());
//   if (rank == 0) std::printf("test acc %.2f%%\n", 100 * result.accuracy());
//
// Rank r of W evaluates the contiguous block [r*N/W, (r+1)*N/W) of the N test examples (sizes
// differ by at most one; no example twice, none left out) and one all-reduce sums the correct
// and total counts, so every rank returns the same result. Note [Exact sharded evaluation] in
// evaluate.cpp says why this does not use the DistributedSampler.
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataset.h"
#include "nn/module.h"
#include "tensor/device.h"

namespace ddplab::distributed {

class ProcessGroup;

struct EvalOptions {
  int64_t batch_size = 256;
  int num_workers = 0;   // DataLoader threads
  Device device = kCPU;  // where the model is; batches are moved there
  int64_t limit = 0;     // evaluate the first `limit` examples only (quick runs); 0: all
};

struct EvalResult {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const {
    return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
  }
};

// This rank's share of [0, n) for evaluation: the contiguous block [rank*n/world,
// (rank+1)*n/world).
std::pair<int64_t, int64_t> eval_shard(int64_t n, int world, int rank);

// Top-1 accuracy of `model` (in eval mode, without autograd; its mode is restored) over
// `dataset`. With `pg` null, this process evaluates everything.
EvalResult evaluate_sharded(nn::Module& model, const std::shared_ptr<const data::Dataset>& dataset,
                            const EvalOptions& options, ProcessGroup* pg);

}  // namespace ddplab::distributed
