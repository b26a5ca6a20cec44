// The Reducer: averages gradients across ranks in buckets, overlapping communication with backward.
//
// DistributedDataParallel (ddp/ddp.h) owns one Reducer. The Reducer
//   - lays the parameters out in buckets (reverse registration order, first bucket small;
//     ddp/bucket_layout.h), and after the first iteration lays them out again in the
//     order their gradients actually arrived,
//   - hooks every parameter so that, as soon as backward has accumulated its gradient, the
//     gradient is copied into its slot of the bucket's flat buffer,
//   - hands a bucket to the communication hook (an averaging all-reduce unless another hook was
//     registered: ddp/comm_hook.h) the moment its last gradient arrives (in bucket
//     order),
//   - and, at the end of backward, waits for every bucket's future and writes the averaged
//     gradients back into `.grad`.
// The why of each step is in the design notes at the top of reducer.cpp. The teaching version
// with no buckets and no overlap is ddp/naive_allreduce_grads.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "comm/process_group.h"
#include "ddp/comm_hook.h"
#include "ddp/reducer_timeline.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

// Must be the same on every rank.
struct ReducerOptions {
  double bucket_cap_mb = 25;             // cap of every bucket but the first
  double first_bucket_cap_mb = 1;        // small, so the first all-reduce starts early in backward
  bool gradient_as_bucket_view = false;  // .grad is a view into the bucket (no copy back)
  // After the first synchronized backward, lay the buckets out again in the order gradients
  // arrived, as rank 0 saw it (Note [Rebuilding buckets]). Skipped with find_unused_parameters.
  bool rebuild_buckets = true;
};

// One bucket: a flat buffer holding the gradients of `params` back to back.
struct Bucket {
  std::vector<size_t> params;    // indices into Reducer::param_names(), in slot order
  std::vector<int64_t> offsets;  // element offset of each param's slot in `buffer`
  std::vector<Tensor> views;     // buffer slices shaped like each param
  Tensor buffer;                 // 1-D, the params' dtype
};

class Reducer {
 public:
  // `params`: (name, tensor) in registration order; tensors that do not require grad are skipped.
  Reducer(const std::vector<std::pair<std::string, Tensor>>& params,
          std::shared_ptr<ProcessGroup> pg, ReducerOptions options = {});
  // Waits for launched all-reduces and removes every hook this Reducer installed.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Throws if the previous iteration's backward started but its reduction did not finish, naming
  // the parameters that got no gradient (Note [Unused parameters]). A forward whose backward
  // never started (an evaluation with grad mode on) is forgotten: Note [Forward without
  // backward].
  void ensure_prior_reduction_finished();
  // Called by DDP's forward when the coming backward must synchronize (checks the above first).
  // With find_unused_parameters, `outputs` are walked and the parameters they do not reach are
  // marked ready when backward starts (Note [Unused parameters]).
  // shadow: a joined rank's replay (comm/join.h): every bucket is filled with zeros and
  // the results are not written back into .grad.
  void prepare_for_backward(const std::vector<Tensor>& outputs, bool find_unused_parameters,
                            bool shadow = false);

  // Replaces the default averaging all-reduce (Note [DDP communication hook]). Once, before the
  // first backward, with the same hook on every rank. `state` counts the bytes the hook
  // all-reduces.
  void register_comm_hook(std::shared_ptr<CommHookState> state, CommHook hook);
  // Bytes the communication hook all-reduced during the last synchronized backward (the
  // default hook: the size of every bucket; compression hooks: less).
  int64_t bytes_all_reduced_last_iteration() const { return last_bytes_; }

  // For a rank that has joined (comm/join.h): issues exactly the collectives of one
  // synchronized backward, every bucket filled with zeros, and discards the results.
  void shadow_backward(bool find_unused_parameters);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<std::string>& param_names() const { return names_; }
  // Per-bucket and per-parameter times of the last synchronized backward (reducer_timeline.h).
  const IterationTimeline& last_iteration_timeline() const { return timeline_.last(); }
  // True between prepare_for_backward() and the end of the backward that completes it.
  bool reduction_pending() const { return armed_; }
  // True once the buckets follow the observed gradient order (Note [Rebuilding buckets]).
  bool buckets_rebuilt() const { return buckets_rebuilt_; }
  // Synchronized backward passes completed so far: each is one round of bucket all-reduces
  // (backwards inside no_sync() do not count). Lets a training loop check that gradient
  // accumulation communicates once per optimizer step.
  int64_t num_synchronized_backwards() const { return iteration_; }

 private:
  // Lays out buckets_ from `order` (parameter indices, first-ready first) and the caps.
  void initialize_buckets(const std::vector<size_t>& order);
  void on_output_grad();                 // backward reached the module's output
  void on_gradient_ready(size_t index);  // post-accumulate-grad hook of parameter `index`
  void start_backward();                 // the first hook of an armed backward
  void mark_ready(size_t index);         // copy into its slot (undivided), count down, maybe launch
  void launch_ready_buckets();           // launch every ready bucket, in order
  void launch_bucket(size_t b);          // hand bucket b to the communication hook
  void poll_finished();                  // report completed all-reduces to the timeline
  void finalize_backward();              // end of backward: wait, write averaged grads back
  // Waits for every bucket (after the unused-parameter count when find_unused_); returns, by
  // parameter, how many ranks hold a gradient (empty without find_unused_).
  std::vector<float> wait_for_buckets();
  void rebuild_buckets();  // Note [Rebuilding buckets]
  std::string unready_parameter_names() const;

  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket index
  std::vector<size_t> slot_of_;    // parameter index -> position inside its bucket
  std::vector<Bucket> buckets_;
  std::shared_ptr<ProcessGroup> pg_;
  ReducerOptions options_;
  std::vector<autograd::RemovableHandle> grad_hooks_;    // one per parameter, for our lifetime
  std::vector<autograd::RemovableHandle> output_hooks_;  // on this iteration's outputs
  bool buckets_rebuilt_ = false;

  // Per-iteration state (reset by prepare_for_backward).
  bool armed_ = false;             // a synchronized backward is expected
  bool backward_started_ = false;  // the first hook of this iteration has run
  bool shadowing_ = false;         // a joined rank's shadow backward (zero buckets)
  bool find_unused_ = false;
  std::vector<size_t> unused_;         // parameters the forward did not reach
  std::vector<size_t> arrival_order_;  // parameters in gradient arrival order (until rebuilt)
  std::vector<char> ready_;            // by parameter
  std::vector<int64_t> pending_;       // by bucket: gradients still to arrive
  size_t next_bucket_ = 0;             // the next bucket to launch
  std::vector<FuturePtr> futures_;     // by bucket: the hook's result
  int64_t iteration_ = 0;

  // Note [DDP communication hook]
  std::shared_ptr<CommHookState> hook_state_;
  CommHook hook_;
  bool hook_registered_ = false;  // a user hook replaced the default
  int64_t bytes_before_ = 0;      // hook_state_->bytes_all_reduced when this backward began
  int64_t last_bytes_ = 0;
  IterationRecorder timeline_;
};

}  // namespace ddplab::distributed
