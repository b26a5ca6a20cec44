// DistributedDataParallel: construction (check, broadcast, Reducer) and forward.
// The gradient side (buckets, hooks, averaging) is the Reducer's: distributed/reducer.cpp; the
// construction check is distributed/model_check.cpp.
#include "distributed/ddp.h"

#include <algorithm>

#include "autograd/node.h"
#include "distributed/model_check.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root) {
  // Group by dtype (in first-seen order, the same on every rank since the models match).
  std::vector<DType> dtypes;
  for (const Tensor& t : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) {
      dtypes.push_back(t.dtype());
    }
  }
  for (DType dt : dtypes) {
    std::vector<Tensor> group;
    int64_t numel = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dt) continue;
      group.push_back(t);
      numel += t.numel();
    }
    Tensor flat = ops::empty({numel}, group.front().options());
    int64_t offset = 0;
    for (const Tensor& t : group) {
      ops::copy_(ops::view(ops::narrow(flat, 0, offset, t.numel()), t.shape()), t);
      offset += t.numel();
    }
    pg.broadcast(flat, root)->wait();
    offset = 0;
    for (const Tensor& t : group) {
      ops::copy_(t, ops::view(ops::narrow(flat, 0, offset, t.numel()), t.shape()));
      offset += t.numel();
    }
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 DDPOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options) {
  DDP_CHECK(module_ != nullptr, "DistributedDataParallel: null module");
  DDP_CHECK(pg_ != nullptr, "DistributedDataParallel: null process group");
  register_module("module", module_);
  verify_same_model_on_all_ranks(*module_, *pg_);

  // Every replica starts from rank 0's values (whatever each rank initialised).
  std::vector<Tensor> state = module_->parameters();
  for (const Tensor& b : module_->buffers()) state.push_back(b);
  if (pg_->size() > 1 && !state.empty()) broadcast_coalesced(*pg_, state, 0);

  reducer_ = std::make_unique<Reducer>(module_->named_parameters(), pg_, options.reducer);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  // Communication happens only in training forwards (grad mode on) outside no_sync(); an
  // evaluation under NoGradGuard is purely local.
  const bool training_step = autograd::grad_enabled();
  const bool sync = training_step && sync_grads_;
  // Before any communication: a reduction left unfinished would otherwise be silently mixed
  // into this iteration (and its hooks would fire even inside no_sync()).
  if (training_step) reducer_->ensure_prior_reduction_finished();
  if (sync && options_.broadcast_buffers && pg_->size() > 1) {
    const std::vector<Tensor> bufs = module_->buffers();
    if (!bufs.empty()) broadcast_coalesced(*pg_, bufs, 0);
  }
  Tensor out = module_->forward(x);
  if (sync) reducer_->prepare_for_backward({out}, options_.find_unused_parameters);
  return out;
}

}  // namespace ddplab::distributed
