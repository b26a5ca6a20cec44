// DistributedDataParallel: data-parallel training of one model replica per process.
//
// Every rank holds a full copy of the model and trains on its own slice of each batch. Wrapping
// the model in DDP keeps the copies identical:
//   - at construction, it checks that all ranks hold the same parameters (names, shapes, dtypes;
//     ddp/model_check.h) and copies rank 0's parameters and buffers to every rank;
//   - in forward, it copies rank 0's buffers (BatchNorm running stats) to every rank, runs the
//     model, and arms the Reducer (ddp/reducer.h);
//   - during backward, the Reducer averages the gradients across ranks in buckets, overlapping the
//     all-reduces with the rest of backward; when backward returns, every rank's .grad holds the
//     same average, so identical optimizer steps keep the replicas identical.
//
//   auto pg = distributed::init_process_group();
//   auto model = std::make_shared<models::SmallCNN>();
//   auto ddp = std::make_shared<distributed::DDP>(model, pg);
//   optim::SGD opt(ddp->parameters(), optim::SGDOptions{/*lr=*/0.1});
//   Tensor loss = nn::functional::cross_entropy(ddp->forward(x), y);
//   loss.backward();   // gradients averaged over all ranks here
//   opt.step();
//
// The wrapper is an nn::Module whose only child is "module", so its parameter names carry the
// `module.` prefix exactly as PyTorch's do; save `ddp->module()` to get checkpoints without it.
// Options, error messages and the differences from PyTorch are in docs/ddp.md.
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include "comm/join.h"
#include "comm/process_group.h"
#include "ddp/comm_hook.h"
#include "ddp/reducer.h"
#include "nn/module.h"

namespace ddplab::distributed {

// Every option must be the same on every rank (they decide which collectives run).
struct DDPOptions {
  // How gradients are bucketed and averaged: bucket_cap_mb, first_bucket_cap_mb,
  // gradient_as_bucket_view, rebuild_buckets (ddp/reducer.h).
  ReducerOptions reducer;
  // Walk the graph after each forward and mark parameters it does not reach as ready
  // (Note [Unused parameters]). Needed when some parameters take no part in some iterations.
  bool find_unused_parameters = false;
  // Copy rank 0's buffers to every rank at the start of each training forward.
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Module, public Joinable {
 public:
  // Collective: every rank of `pg` must construct its DDP together. Throws on every rank, listing
  // the differences by name and shape, when the ranks' parameters or buffers do not match.
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                          DDPOptions options = {});

  // Runs the wrapped module. When grad mode is on (training) and not inside no_sync(): first
  // broadcasts buffers from rank 0 (broadcast_buffers), then arms the Reducer for the backward
  // that follows. Under autograd::NoGradGuard (evaluation) it only runs the module and
  // communicates nothing, so a single rank may evaluate on its own.
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DistributedDataParallel"; }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  const DDPOptions& options() const { return options_; }
  Reducer& reducer() { return *reducer_; }
  const Reducer& reducer() const { return *reducer_; }

  // Replaces the averaging all-reduce of each bucket by hook(*state, bucket) (PyTorch's
  // register_comm_hook; ddp/comm_hook.h, Note [DDP communication hook]). State is a
  // CommHookState or a type derived from it (PowerSGDState); hook any callable
  // FuturePtr(State&, GradBucket&), e.g. distributed::fp16_compress_hook. Once, before the first
  // backward, on every rank.
  template <class State, class Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    static_assert(std::is_base_of_v<CommHookState, State>,
                  "register_comm_hook: the state must derive from distributed::CommHookState");
    State* s = state.get();
    reducer_->register_comm_hook(std::move(state),
                                 [s, hook](GradBucket& bucket) { return hook(*s, bucket); });
  }

  // Joinable (comm/join.h): inside a Join, a rank out of inputs shadows the others'
  // gradient all-reduces with zeros; when all are done the model is copied from a rank that
  // ran longest. Note [Join] in comm/join.cpp.
  std::unique_ptr<JoinHook> join_hook() override;
  Device join_device() const override { return pg_->device(); }
  std::shared_ptr<ProcessGroup> join_process_group() const override { return pg_; }

  // RAII: while alive, backward only accumulates gradients locally (no communication). The first
  // backward after it reduces the accumulated sum (Note [no_sync]).
  //   { auto guard = ddp->no_sync(); for (...) { forward; (loss / k).backward(); } }
  //   forward; (loss / k).backward();  // all-reduces the sum of the k + 1 micro-batches
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.sync_grads_) {
      ddp.sync_grads_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_grads_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

 private:
  friend class DDPJoinHook;
  // The rank that holds the state to copy: the highest rank for which `eligible` is true.
  int find_common_rank(bool eligible);
  void sync_buffers(int root);
  void join_shadow_iteration();  // a joined rank's part of one iteration
  void join_replay_iteration();  // ... for a model with collectives of its own (SyncBatchNorm)
  void join_sync_final_model(bool is_last_joiner);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_grads_ = true;  // false inside no_sync()
  Tensor last_input_;       // inside a Join: the last training input, for a replay
};

using DDP = DistributedDataParallel;

// Copies `tensors` from rank `root` to every rank with one broadcast per dtype (the tensors are
// packed into a flat buffer and unpacked again): what DDP uses for parameters and buffers.
void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root = 0);

}  // namespace ddplab::distributed
