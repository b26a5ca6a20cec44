// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded across the ranks
// (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer; Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).
//
// Under plain DDP every rank runs the same optimizer step on the same averaged gradients, so
// every rank holds the same momentum buffers (SGD) or moments (Adam): W identical copies. ZeRO-1
// gives each parameter one owner rank; only the owner keeps that parameter's state and updates
// it, then sends the new values to the other ranks. Why this saves memory, what it costs and the
// partition rule: Note [ZeRO-1] in zero_redundancy_optimizer.cpp; the user's guide: docs/zero.md.
//
//   auto ddp = std::make_shared<distributed::DDP>(model, pg);
//   optim::AdamOptions adam;
//   distributed::ZeroRedundancyOptimizer opt(
//       ddp->parameters(), distributed::optimizer_factory<optim::Adam>(adam), pg);
//   loss.backward();                 // DDP averages the gradients, as always
//   opt.step();                      // collective: shard update, then parameter broadcasts
//   opt.consolidate_state_dict(0);   // collective: rank 0 gathers the shards' state
//   if (pg->rank() == 0) opt.save("opt.safetensors");  // loadable by a plain optim::Adam
//
// It lives in ddp/ rather than optim/ because it is a collective object built on top of the
// optimizers: it wraps any optim::Optimizer and needs the process group. The optimizers in optim/
// never shard; the one place optim/ meets ranks is GradScaler, which agrees on overflow over
// comm/ (below it).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "optim/optimizer.h"

namespace ddplab::distributed {

// Builds the optimizer each rank runs over its shard: PyTorch's `optimizer_class` and its
// `**defaults` in one object. optimizer_factory<optim::SGD>(sgd_options) makes one.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

template <class OptimizerClass, class Options>
OptimizerFactory optimizer_factory(Options options) {
  return [options](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<OptimizerClass>(std::move(groups), options);
  };
}

// The owner rank of every parameter, by flat index (group after group, as in state_dict()):
// within each group, largest parameter first, each goes to the rank with the fewest elements so
// far (the lowest rank on a tie); the counts carry over from group to group. Parameters are
// never split, so one parameter larger than total / world unbalances the shards.
std::vector<int> partition_parameters(const std::vector<optim::ParamGroup>& groups, int world);

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // Collective in spirit: every rank must pass the same parameters (shapes, order) and the same
  // factory, so all ranks compute the same partition; no communication happens here (DDP has
  // already made the parameters equal). Every parameter must live on pg->device().
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, const OptimizerFactory& factory,
                          std::shared_ptr<ProcessGroup> pg);
  ZeroRedundancyOptimizer(const std::vector<Tensor>& params, const OptimizerFactory& factory,
                          std::shared_ptr<ProcessGroup> pg)
      : ZeroRedundancyOptimizer(std::vector<optim::ParamGroup>{optim::ParamGroup(params)}, factory,
                                std::move(pg)) {}

  // Collective. Copies the hyper-parameters of param_groups() (an LR schedule changes them
  // there) into the local optimizer, which updates this rank's shard from the gradients (already
  // averaged by DDP); then each rank broadcasts its shard, so every rank ends with the same
  // parameters.
  void step() override;
  std::string type_name() const override { return "ZeroRedundancyOptimizer"; }

  // Collective: every rank sends its shard's state to rank `to` (PyTorch's default: 0), which
  // assembles the state a plain optimizer of the same kind would have. Call it before
  // state_dict() or save() on rank `to`; a later step() makes it stale. Returns whether this rank
  // is `to`.
  bool consolidate_state_dict(int to = 0) override;
  // On rank `to` after consolidate_state_dict(to): the whole state in the plain optimizer's
  // layout (type "SGD", "Adam", ...; "state.<flat index>.<name>"). Elsewhere, or before it:
  // throws, saying what to call.
  optim::OptimizerState state_dict() const override;
  // Not collective; call it on every rank with the same whole state (from state_dict() here or
  // from a plain optimizer of the same kind). Each rank keeps the entries of its own shard.
  void load_state_dict(const optim::OptimizerState& state) override;

  // Inspection, for tests and logs. The per-parameter state lives in the local optimizer, under
  // its own (shard) indices; this optimizer's state(i) and step_count(i) stay empty.
  optim::Optimizer& local_optimizer() { return *local_; }
  const optim::Optimizer& local_optimizer() const { return *local_; }
  // The owner of each flat parameter index.
  const std::vector<int>& owners() const { return owner_; }
  // Bytes of optimizer state tensors this rank holds (its shard only).
  size_t local_state_bytes() const;

 private:
  // Copies the wrapper's group options (what schedulers and load_state_dict change) into the
  // local optimizer's groups.
  void sync_options_to_local();
  // Every rank's parameters of rank r's shard, in flat order.
  std::vector<Tensor> shard_params(int r) const;

  std::shared_ptr<ProcessGroup> pg_;
  std::vector<int> owner_;             // per flat index
  std::vector<size_t> local_to_flat_;  // local optimizer's flat index -> this optimizer's
  std::unique_ptr<optim::Optimizer> local_;
  std::optional<optim::OptimizerState> consolidated_;  // only on the `to` rank
  int consolidated_to_ = -1;  // the last `to`; -1: never consolidated or stale since a step()
};

}  // namespace ddplab::distributed
