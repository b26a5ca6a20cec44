// Communication hooks: how DDP turns a bucket of local gradients into averaged gradients.
//
// After backward fills a bucket (ddp/reducer.h), the Reducer does not all-reduce it
// itself: it hands the bucket to a communication hook, a function that starts the communication
// and returns a Future of the averaged buffer. The default hook is a plain averaging all-reduce
// (ddp/comm_hooks/default_hooks.h); a user registers another one with
// DDP::register_comm_hook(state, hook) to compress gradients (fp16/bf16 casts, PowerSGD in
// ddp/comm_hooks/powerSGD_hook.h) or to do anything else with them, as in PyTorch:
//
//   struct CountingState : distributed::CommHookState { using CommHookState::CommHookState; int n = 0; };
//   ddp->register_comm_hook(std::make_shared<CountingState>(pg),
//                           [](CountingState& s, distributed::GradBucket& b) {
//                             ++s.n;
//                             return distributed::allreduce_hook(s, b);
//                           });
//
// The contract (Note [DDP communication hook] in reducer.cpp): the hook receives the bucket's
// local gradients NOT divided by the world size, and its future's value must be the average over
// the ranks, with the bucket buffer's size and dtype. Every rank calls the hook for the same
// buckets in the same order, so the hook may issue any collectives as long as it issues the same
// ones on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

// A tensor that communication will produce (PyTorch's torch.futures.Future, reduced to what
// hooks need). A future is made from a collective's Work, or from a value at hand, and then()
// chains a continuation onto it.
// Continuations run lazily, inside wait(), on the thread that waits (PyTorch runs them when the
// collective completes, on a background thread). For DDP that is the end of backward, where the
// Reducer waits for the buckets in bucket order on every rank, so a continuation that issues a
// further collective (PowerSGD's second all-reduce) issues it in the same order on every rank.
class Future : public std::enable_shared_from_this<Future> {
 public:
  // A future whose value is already known.
  static std::shared_ptr<Future> completed(Tensor value);
  // Completes when `work` does; its value is `value`, the tensor the collective writes into.
  static std::shared_ptr<Future> from_work(std::shared_ptr<Work> work, Tensor value);

  // A future whose value is fn(this future's value). fn may issue and wait for collectives.
  std::shared_ptr<Future> then(std::function<Tensor(const Tensor&)> fn);

  // Waits for the collective (and runs the continuations, once); returns the value.
  Tensor wait();
  // True once wait() would not block. A chain reports true only after it has been waited for.
  bool is_completed();
  // Waits for the collective at the root of the chain without running any continuation (they
  // may issue collectives): what a destructor may do with a future it abandons.
  void wait_for_collective();

 private:
  std::shared_ptr<Work> work_;      // null for a completed value or a chain
  std::shared_ptr<Future> parent_;  // a chain: this = fn_(parent_'s value)
  std::function<Tensor(const Tensor&)> fn_;
  Tensor value_;
  bool done_ = false;
};
using FuturePtr = std::shared_ptr<Future>;

// One bucket as a hook sees it (PyTorch's dist.GradBucket).
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, Tensor buffer, std::vector<Tensor> gradients,
             std::vector<Tensor> parameters)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}
  size_t index() const { return index_; }
  // True for the last bucket of the iteration (a per-iteration counter ticks on it).
  bool is_last() const { return is_last_; }
  // The flat 1-D buffer: every gradient of the bucket back to back, not yet averaged.
  const Tensor& buffer() const { return buffer_; }
  // Views into buffer(), shaped like the parameters (what per-layer compression works on).
  const std::vector<Tensor>& gradients() const { return gradients_; }
  const std::vector<Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  bool is_last_;
  Tensor buffer_;
  std::vector<Tensor> gradients_;
  std::vector<Tensor> parameters_;
};

// What every hook's state holds: the group to communicate over, and a count of the bytes it
// all-reduced (for benchmarks and tests: how much a compression hook saves). Hooks with more
// state (PowerSGDState) derive from it.
struct CommHookState {
  explicit CommHookState(std::shared_ptr<ProcessGroup> process_group);
  virtual ~CommHookState() = default;

  // An all-reduce (sum) of `t` over process_group, counted in bytes_all_reduced.
  std::shared_ptr<Work> all_reduce(const Tensor& t);

  std::shared_ptr<ProcessGroup> process_group;
  int64_t bytes_all_reduced = 0;  // since construction
};

// A hook bound to its state: what the Reducer stores and calls once per bucket per iteration.
using CommHook = std::function<FuturePtr(GradBucket&)>;

}  // namespace ddplab::distributed
