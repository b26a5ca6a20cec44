// Exact evaluation sharded across ranks (see evaluate.h).
#include "ddp/evaluate.h"

#include <algorithm>

#include <cmath>

#include "autograd/node.h"
#include "comm/process_group.h"
#include "data/dataloader.h"
#include "nn/functional.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

// Note [Exact sharded evaluation]
// The DistributedSampler gives every rank the same number of examples, so that training ranks run
// the same number of steps (a rank with one batch fewer would leave the others waiting in an
// all-reduce). When N is not a multiple of W it pads by repeating the first examples of the
// epoch: with N = 10001 and W = 2 one example is counted twice, and the "accuracy" is
// (correct + c) / 10002 where c is 0 or 1 depending on that one example. Small, but not the
// test accuracy, and different for every world size, so runs on 2 and 8 ranks would disagree.
// Evaluation has no such constraint: its only collective is the one all-reduce at the end, which
// every rank reaches however many batches it had. So each rank takes a contiguous block of the
// test set, the blocks cover it exactly once, and the counts (not the per-rank accuracies, whose
// mean would weigh a short block like a long one) are summed.

std::pair<int64_t, int64_t> eval_shard(int64_t n, int world, int rank) {
  return {n * rank / world, n * (rank + 1) / world};
}

EvalResult evaluate_sharded(nn::Module& model, const std::shared_ptr<const data::Dataset>& dataset,
                            const EvalOptions& options, ProcessGroup* pg) {
  const int world = pg ? pg->size() : 1;
  const int rank = pg ? pg->rank() : 0;
  const int64_t n = options.limit > 0 ? std::min(options.limit, dataset->size()) : dataset->size();
  const auto [begin, end] = eval_shard(n, world, rank);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) mine.push_back(i);

  data::DataLoaderOptions lo;
  lo.batch_size = options.batch_size;
  lo.num_workers = options.num_workers;
  lo.pin_memory = options.device.is_cuda();
  lo.sampler = std::make_shared<data::ListSampler>(std::move(mine));
  data::DataLoader loader(dataset, lo);

  const bool was_training = model.is_training();
  model.eval();
  EvalResult r;
  {
    autograd::NoGradGuard no_grad;
    for (auto& batch : loader) {
      data::Batch b = options.device.is_cuda() ? batch.to(options.device, true) : batch;
      const Tensor logits = model(b.images);
      const int64_t n = b.labels.size(0);
      r.correct += std::llround(F::accuracy(logits, b.labels) * static_cast<double>(n));
      r.total += n;
    }
  }
  model.train(was_training);
  if (pg) {  // one all-reduce of the two counts (int64: exact at any size)
    TensorOptions on_group(kInt64);
    on_group.device = pg->device();
    Tensor counts = ops::from_vector<int64_t>({r.correct, r.total}, {2}, on_group);
    pg->all_reduce(counts, ReduceOp::Sum)->wait();
    const std::vector<int64_t> sum = ops::to(counts, kCPU).to_vector<int64_t>();
    r.correct = sum[0];
    r.total = sum[1];
  }
  return r;
}

}  // namespace ddplab::distributed
