// DistributedDataParallel: construction (check, broadcast, Reducer) and forward.
// The gradient side (buckets, hooks, averaging) is the Reducer's: ddp/reducer.cpp; the
// construction check is ddp/model_check.cpp.
#include "ddp/ddp.h"

#include <algorithm>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/collectives.h"
#include "ddp/model_check.h"
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
  // Every group is packed and its broadcast issued before the first one is waited for: the
  // collectives then follow each other on the wire instead of paying one round trip each (DDP's
  // forward broadcasts BatchNorm's float32 statistics and int64 counters at every step).
  std::vector<std::vector<Tensor>> groups;
  std::vector<Tensor> flats;
  std::vector<std::shared_ptr<Work>> works;
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
    works.push_back(pg.broadcast(flat, root));
    groups.push_back(std::move(group));
    flats.push_back(std::move(flat));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    works[g]->wait();
    if (pg.rank() == root) continue;  // the root's tensors already hold what it sent
    int64_t offset = 0;
    for (const Tensor& t : groups[g]) {
      ops::copy_(t, ops::view(ops::narrow(flats[g], 0, offset, t.numel()), t.shape()));
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

int DistributedDataParallel::find_common_rank(bool eligible) {
  return static_cast<int>(all_reduce_value(*pg_, eligible ? pg_->rank() : -1, ReduceOp::Max));
}

void DistributedDataParallel::sync_buffers(int root) {
  const std::vector<Tensor> bufs = module_->buffers();
  if (!bufs.empty()) broadcast_coalesced(*pg_, bufs, root);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  // Communication happens only in training forwards (grad mode on) outside no_sync(); an
  // evaluation under NoGradGuard is purely local.
  const bool training_step = autograd::grad_enabled();
  const bool sync = training_step && sync_grads_;
  // Before any communication: a reduction left unfinished would otherwise be silently mixed
  // into this iteration (and its hooks would fire even inside no_sync()).
  if (training_step) reducer_->ensure_prior_reduction_finished();
  const bool joining = training_step && join_config.enable;
  if (joining) {  // Note [Join]: "still running", then whether this iteration all-reduces
    Join::notify_join_context(*this);
    all_reduce_value(*pg_, sync ? 1 : 0, ReduceOp::Max);
  }
  if (sync && options_.broadcast_buffers && pg_->size() > 1 && !module_->buffers().empty()) {
    // Under a Join rank 0 may have stopped early: the buffers of the highest running rank win.
    sync_buffers(joining ? find_common_rank(true) : 0);
  }
  if (joining) last_input_ = x;
  Tensor out = module_->forward(x);
  if (sync) reducer_->prepare_for_backward({out}, options_.find_unused_parameters);
  return out;
}

}  // namespace ddplab::distributed

namespace ddplab::distributed {

// What a joined rank does for DDP (Note [Join] in join.cpp).
class DDPJoinHook : public JoinHook {
 public:
  explicit DDPJoinHook(DistributedDataParallel& ddp) : ddp_(ddp) {}
  void main_hook() override { ddp_.join_shadow_iteration(); }
  void post_hook(bool is_last_joiner) override { ddp_.join_sync_final_model(is_last_joiner); }

 private:
  DistributedDataParallel& ddp_;
};

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook() {
  return std::make_unique<DDPJoinHook>(*this);
}

void DistributedDataParallel::join_shadow_iteration() {
  // The collectives of a running rank's forward and backward, in their order (forward above).
  const bool others_sync = all_reduce_value(*pg_, 0, ReduceOp::Max) != 0;
  if (!others_sync) return;  // they are inside no_sync(): no communication this iteration
  if (options_.broadcast_buffers && pg_->size() > 1 && !module_->buffers().empty()) {
    sync_buffers(find_common_rank(false));
  }
  bool has_collectives = false;  // Note [Join] in join.cpp: such a model is replayed
  module_->apply([&](nn::Module& m) { has_collectives |= m.runs_collectives(); });
  if (has_collectives) {
    join_replay_iteration();
  } else {
    reducer_->shadow_backward(options_.find_unused_parameters);
  }
}

void DistributedDataParallel::join_replay_iteration() {
  DDP_CHECK(last_input_.defined(),
            "Join: this rank ran out of inputs before its first training forward, so it cannot "
            "replay one to match the collectives of the model's SyncBatchNorm layers");
  // The replay's backward accumulates into .grad: keep this rank's own gradients.
  const std::vector<Tensor> params = module_->parameters();
  std::vector<Tensor> saved;
  saved.reserve(params.size());
  for (const Tensor& p : params)
    saved.push_back(p.grad().defined() ? ops::clone(p.grad()) : p.grad());
  {
    JoinShadowGuard shadow;  // SyncBatchNorm contributes a count of 0 and zero sums
    Tensor out = module_->forward(last_input_);
    reducer_->prepare_for_backward({out}, options_.find_unused_parameters, /*shadow=*/true);
    ddplab::sum(out).backward();  // any loss: every contribution of this rank is zeroed
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (saved[i].defined() && params[i].grad().defined()) {
      ops::copy_(params[i].grad(), saved[i]);  // in place: it may be a view into a bucket
    } else {
      params[i].set_grad(saved[i]);
    }
  }
}

void DistributedDataParallel::join_sync_final_model(bool is_last_joiner) {
  // The joined ranks skipped the last optimizer steps: copy a last joiner's parameters and
  // buffers to everyone, so the replicas are identical again.
  const int root = find_common_rank(is_last_joiner);
  std::vector<Tensor> state = module_->parameters();
  for (const Tensor& b : module_->buffers()) state.push_back(b);
  if (pg_->size() > 1 && !state.empty()) broadcast_coalesced(*pg_, state, root);
}

}  // namespace ddplab::distributed
