// The Reducer: averages gradients across ranks in buckets, overlapping communication with backward.
//
// DistributedDataParallel (distributed/ddp.h) owns one Reducer. The Reducer
//   - lays the parameters out in buckets (reverse registration order, first bucket small),
//   - hooks every parameter so that, as soon as backward has accumulated its gradient, the
//     gradient is copied into its slot of the bucket's flat buffer,
//   - launches a bucket's all-reduce the moment its last gradient arrives (in bucket order),
//   - and, at the end of backward, waits for every all-reduce and writes the averaged gradients
//     back into `.grad`.
// The why of each step is in the design notes at the top of reducer.cpp. The teaching version
// with no buckets and no overlap is distributed/naive_allreduce_grads.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

struct ReducerOptions {
  double bucket_cap_mb = 25;             // cap of every bucket but the first
  double first_bucket_cap_mb = 1;        // small, so the first all-reduce starts early in backward
  bool gradient_as_bucket_view = false;  // .grad is a view into the bucket (no copy back)
};

// One bucket: a flat buffer holding the gradients of `params` back to back.
struct Bucket {
  std::vector<size_t> params;    // indices into Reducer::param_names(), in slot order
  std::vector<int64_t> offsets;  // element offset of each param's slot in `buffer`
  std::vector<Tensor> views;     // buffer slices shaped like each param
  Tensor buffer;                 // 1-D, the params' dtype
};

// What happened in one iteration, in milliseconds since backward reached the module's output
// (steady_clock). -1 means "did not happen". Rendered as a Chrome trace by the monitoring tools.
struct BucketTimes {
  double ready_ms = -1;     // its last gradient arrived
  double launched_ms = -1;  // its all-reduce was issued (>= ready: buckets launch in order)
  double finished_ms = -1;  // first time the reducer saw the all-reduce complete (an upper bound:
                            // it polls at every gradient hook and at the end of backward)
};
struct IterationTimeline {
  int64_t iteration = -1;              // counts synchronized backward passes from 0
  std::vector<BucketTimes> buckets;    // by bucket index
  std::vector<double> param_ready_ms;  // by parameter index; -1 for a parameter marked unused
  double backward_end_ms = -1;         // the end-of-backward callback started
  double finalized_ms = -1;            // all averaged gradients were in .grad
};

class Reducer {
 public:
  // `params`: (name, tensor) in registration order; tensors that do not require grad are skipped.
  Reducer(const std::vector<std::pair<std::string, Tensor>>& params,
          std::shared_ptr<ProcessGroup> pg, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Throws if the previous iteration's reduction did not finish, naming the parameters that got
  // no gradient (Note [Unused parameters]).
  void ensure_prior_reduction_finished() const;
  // Called by DDP's forward when the coming backward must synchronize (checks the above first).
  // With find_unused_parameters, `outputs` are walked and the parameters they do not reach are
  // marked ready when backward starts (Note [Unused parameters]).
  void prepare_for_backward(const std::vector<Tensor>& outputs, bool find_unused_parameters);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<std::string>& param_names() const { return names_; }
  const IterationTimeline& last_iteration_timeline() const { return last_timeline_; }
  // True between prepare_for_backward() and the end of the backward that completes it.
  bool reduction_pending() const { return armed_; }

 private:
  void on_output_grad();                 // backward reached the module's output
  void on_gradient_ready(size_t index);  // post-accumulate-grad hook of parameter `index`
  void mark_ready(size_t index);         // copy into the bucket, count down, maybe launch
  void launch_ready_buckets();           // launch every ready bucket, in order
  void poll_finished();                  // note the finish time of completed all-reduces
  void finalize_backward();              // end of backward: wait, write averaged grads back
  void start_iteration_clock();
  double now_ms() const;
  std::string unready_parameter_names() const;

  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket index
  std::vector<size_t> slot_of_;    // parameter index -> position inside its bucket
  std::vector<Bucket> buckets_;
  std::shared_ptr<ProcessGroup> pg_;
  ReducerOptions options_;
  std::shared_ptr<bool> alive_;  // hooks outlive the Reducer; they check this first

  // Per-iteration state (reset by prepare_for_backward).
  bool armed_ = false;             // a synchronized backward is expected
  bool backward_started_ = false;  // the first hook of this iteration has run
  bool find_unused_ = false;
  std::vector<size_t> unused_;    // parameters the forward did not reach
  std::vector<char> ready_;       // by parameter
  std::vector<int64_t> pending_;  // by bucket: gradients still to arrive
  size_t next_bucket_ = 0;        // the next bucket to launch
  std::vector<std::shared_ptr<Work>> works_;
  int64_t iteration_ = 0;
  std::chrono::steady_clock::time_point t0_;
  IterationTimeline timeline_, last_timeline_;
};

}  // namespace ddplab::distributed
