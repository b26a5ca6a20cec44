// The Reducer: bucketed, overlapped gradient averaging for DistributedDataParallel.
//
// Read the notes first; the code below refers to them by name.
//
// Note [Bucket order]
// ~~~~~~~~~~~~~~~~~~~
// Backward produces gradients roughly last layer first (the engine runs the latest-created node
// first, see autograd/engine.cpp). So before any backward has run we lay the parameters out in
// REVERSE registration order: bucket 0 holds the last layer's parameters, the last bucket the
// first layer's (after the first iteration, the observed order replaces this guess: Note
// [Rebuilding buckets]). Bucket 0 is capped small (first_bucket_cap_mb, 1 MB) so that it fills,
// and its all-reduce starts, after only a few layers of backward; the others are capped at
// bucket_cap_mb (25 MB), large enough that each all-reduce amortises its fixed latency. A bucket
// never exceeds its cap unless one parameter alone does (it then gets a bucket of its own), and
// holds one dtype (a change of dtype starts a new bucket), so the whole bucket is one flat buffer
// and one collective. The assignment is a pure function: compute_bucket_layout
// (ddp/bucket_layout.h).
//
// Buckets are LAUNCHED strictly in bucket order: bucket i's all-reduce is issued only after
// buckets 0..i-1 were issued, even when bucket i happens to be ready first. The reason is the one
// rule of collectives: every rank must issue the same collectives in the same order, because a
// collective is matched across ranks by its position in the sequence (its sequence number), not
// by its contents. Gradients do not arrive in the same order on every rank (a data-dependent
// branch, thread timing), so "launch whatever is ready" would let rank 0 issue bucket 2 while
// rank 1 issues bucket 1 as the same collective: they would sum unrelated data, or hang when the
// sizes differ. A bucket that is ready early just waits for its predecessors.
//
// Note [Rebuilding buckets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Reverse registration order is only a guess at the order of backward. A model that registers
// its layers in another order than it uses them (a head created before the trunk, a branch
// registered last) would put late gradients in bucket 0, and with in-order launching (above)
// nothing would go on the wire until late in backward. So after the first synchronized backward
// the Reducer lays its buckets out again, with the same caps and dtype rule, in the order the
// gradients actually arrived (the hooks record it), as PyTorch does. Once: a static graph yields
// the same order every iteration.
// The layout must be IDENTICAL on every rank, because an all-reduce is matched across ranks by
// its position in the sequence and adds the buffers element by element: if bucket 0 held
// [fc.weight, fc.bias] on rank 0 and [fc.bias, fc.weight] on rank 1, the sum would add weights to
// biases (or hang, when the sizes differ). But each rank observes its own arrival order, and the
// orders can differ: data-dependent branches, and nodes that become ready together in backward
// run in an order no rank coordinates. So rank 0's order is broadcast (one int64 tensor) and
// every rank adopts it. The broadcast is issued inside the end-of-backward callback, right after
// the bucket all-reduces have completed: every rank reaches that point at the same position of
// its sequence of collectives, so it cannot be matched against anything else.
// With gradient_as_bucket_view, each .grad is a view into an old bucket: its value is copied into
// its new slot and .grad becomes the new view, so the optimizer never sees the change.
// With find_unused_parameters the buckets are not rebuilt (PyTorch does the same): the arrival
// order then covers only the parameters used in that one iteration, which may change from one
// iteration (and one rank) to the next, so it is no better a guess than registration order.
//
// Note [Averaging]
// ~~~~~~~~~~~~~~~~
// Each rank computes the gradient of the mean loss over its own B samples. The gradient of the
// mean loss over all W*B samples is the MEAN of the W per-rank gradients, so DDP averages (sum,
// then divide by W): that makes W ranks with batch B step exactly like one process with batch
// W*B, and the learning rate need not change with W. (Summing instead would multiply the
// effective learning rate by W.)
// We divide BEFORE the sum: the communication hook (Note [DDP communication hook]) multiplies the
// bucket by 1/W and then all-reduces with a sum. In exact arithmetic the order does not matter. In
// floating point it does: summing first makes the partial sums up to W times larger than any one
// gradient. In fp16 (max 65504) a large gradient times W can overflow to inf, which the later
// division cannot undo; dividing first keeps every partial sum within the range of the inputs.
// The cost is precision at the small end (g/W can underflow in fp16 when g is tiny and W is
// huge), which matters less than overflow and which loss scaling exists to fix.
// PyTorch's default communication hook divides a whole bucket before its all-reduce and gives the
// overflow reason ("especially for FP16"). (Without a hook, PyTorch's C++ reducer instead
// multiplies each gradient by 1/W while copying it into the bucket, which saves one pass over the
// data; ddplab sends every bucket through a hook, so that the default is an ordinary hook a
// reader can compare with the others, and pays that pass.)
// With gradient_as_bucket_view the gradient may already BE its slot (from the previous
// iteration); then nothing is copied, and the hook scales it in place with the rest of the
// bucket, once. A parameter without a gradient gets a zero slot.
//
// Note [DDP communication hook]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What happens to a full bucket is a function the user can replace (ddp/comm_hook.h):
// hook(state, GradBucket) -> Future of the averaged buffer. The Reducer keeps everything that
// is about WHEN (buckets fill during backward, launch in bucket order, are waited for at the end
// of backward in bucket order) and the hook decides WHAT goes on the wire: the default
// allreduce_hook divides by W and sums; fp16/bf16_compress_hook send a 16-bit copy; powerSGD_hook
// sends low-rank factors (ddp/comm_hooks/). The contract:
//   - the bucket reaches the hook holding the local gradients (the sum over no_sync
//     micro-batches), NOT divided by W; the future's value must be the average, with the
//     buffer's numel and dtype (the Reducer copies it into the buffer unless it is the buffer);
//   - the hook is called once per bucket per synchronized backward, in bucket order, on every
//     rank, and may issue collectives, the same ones on every rank. A collective issued in a
//     continuation (Future::then) runs when the Reducer waits, in bucket order too.
// The hook is registered once, before the first backward (PyTorch's rule): a hook with state
// (PowerSGD's error memory) must see every iteration. Its state counts the bytes it all-reduced,
// which bytes_all_reduced_last_iteration() reports.
//
// Note [Forward without backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training forward (grad mode on) arms the Reducer for a backward. If no backward follows (an
// evaluation without NoGradGuard, a forward whose loss is dropped) nothing was launched and no
// gradient was copied, so there is nothing to finish: the next forward just forgets it and arms
// again. As in PyTorch 2.x (whose reducer requires finalization only once a gradient hook has
// fired), ensure_prior_reduction_finished() raises only when a backward STARTED and did not
// finish: then some buckets may be in flight on this rank while other ranks wait in theirs, and
// starting over would mix two iterations' collectives.
//
// Note [Unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter that the forward did not use gets no gradient, so its hook never runs, its bucket
// never completes, no later bucket is launched (Note [Bucket order]), and the end-of-backward
// callback is never queued. We cannot detect this during that backward (the engine does not tell
// us which leaves it will not reach), so the NEXT prepare_for_backward() finds the previous
// iteration unfinished and throws, naming every parameter that got no gradient.
// With find_unused_parameters, DDP's forward walks the graph from the output
// (autograd::reachable_leaves) and the Reducer marks the unreached parameters ready when
// backward starts (their slots hold their current .grad, or zeros). Not during forward: the set
// of unused parameters can differ between ranks, so a bucket made only of unused parameters could
// be launched during forward on one rank and during backward on another, and any collective the
// user issues in between (an all-reduce of the loss for logging) would then be matched against a
// bucket. Keeping every DDP collective inside backward keeps the order the same on all ranks.
// The walk costs a graph traversal per iteration, hence off by default (as in PyTorch).
// After the buckets, one more all-reduce adds up, per parameter, how many ranks hold a gradient:
// where none does, .grad is left untouched (undefined), as in single-process training, so an
// optimizer skips the parameter; where some do, every rank gets the average.
//
// Note [Hook lifetime]
// ~~~~~~~~~~~~~~~~~~~~
// The Reducer's hooks live on the parameters (post-accumulate-grad hooks) and on the forward's
// output (a grad hook), which outlive the Reducer: a model may be unwrapped and wrapped again, or
// a graph built under one DDP may be backpropagated after it is gone. Each registration returns a
// RemovableHandle and ~Reducer removes them all, so no hook can call into a destroyed Reducer and
// a second DDP on the same model does not find the first one's hooks still firing. That leaves
// the end-of-backward callback (autograd::queue_callback), which cannot be removed: it is queued
// by a hook during a backward and runs when that same backward finishes, so it could only outlive
// the Reducer if a hook destroyed the DDP in the middle of its own backward, which is not
// supported. Hence no liveness flag: every callback may assume `this` is alive.
//
// Note [no_sync]
// ~~~~~~~~~~~~~~
// Gradient accumulation over k micro-batches needs only one all-reduce, at the last one.
// Inside DDP::no_sync() the forward does not call prepare_for_backward(), so the hooks find the
// Reducer disarmed and return at once: backward just accumulates into .grad locally (the engine
// adds in place). The first backward after no_sync() is armed; its hooks run after the engine
// has added that micro-batch's gradient, so what they copy into the buckets is the SUM over all
// k micro-batches, and one round of all-reduces averages that sum across ranks. With each
// micro-batch loss divided by k, the result equals one step on a batch k times larger. (With
// gradient_as_bucket_view, .grad is the bucket slot: the no_sync backward passes add into it in
// place, and the synced one hands that sum to the hook, which divides it in place before the
// all-reduce.)
#include "ddp/reducer.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "autograd/engine.h"
#include "ddp/bucket_layout.h"
#include "ddp/comm_hooks/default_hooks.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

Reducer::Reducer(const std::vector<std::pair<std::string, Tensor>>& params,
                 std::shared_ptr<ProcessGroup> pg, ReducerOptions options)
    : pg_(std::move(pg)),
      options_(options),
      hook_state_(std::make_shared<CommHookState>(pg_)),
      hook_([state = hook_state_.get()](GradBucket& b) { return allreduce_hook(*state, b); }) {
  DDP_CHECK(pg_ != nullptr, "Reducer: no process group");
  DDP_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0,
            "Reducer: bucket caps must be positive, got bucket_cap_mb="
                << options.bucket_cap_mb
                << ", first_bucket_cap_mb=" << options.first_bucket_cap_mb);
  for (const auto& [name, t] : params) {
    if (!t.requires_grad()) continue;  // frozen parameters are neither hooked nor reduced
    DDP_CHECK(is_floating(t.dtype()) && t.is_contiguous(),
              "Reducer: parameter '" << name << "' must be a contiguous floating tensor");
    names_.push_back(name);
    params_.push_back(t);
  }

  // Last parameter first (Note [Bucket order]).
  std::vector<size_t> reverse_registration(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) reverse_registration[i] = params_.size() - 1 - i;
  initialize_buckets(reverse_registration);

  for (size_t i = 0; i < params_.size(); ++i) {  // Note [Hook lifetime]
    grad_hooks_.push_back(autograd::register_post_accumulate_grad_hook(
        params_[i], [this, i](const Tensor&) { on_gradient_ready(i); }));
  }
}

Reducer::~Reducer() {
  for (auto& h : grad_hooks_) h.remove();
  for (auto& h : output_hooks_) h.remove();
  // Launched all-reduces still write into our buffers: let them finish first (but run no
  // continuation: it could issue a collective no other rank matches).
  for (auto& f : futures_) {
    if (!f) continue;
    try {
      f->wait_for_collective();
    } catch (const std::exception&) {  // a failed collective has no buffer access left
    }
  }
}

void Reducer::initialize_buckets(const std::vector<size_t>& order) {
  std::vector<size_t> nbytes;
  std::vector<DType> dtypes;
  for (const Tensor& p : params_) {
    nbytes.push_back(p.nbytes());
    dtypes.push_back(p.dtype());
  }
  const double mb = 1024.0 * 1024.0;
  const std::vector<std::vector<size_t>> layout = compute_bucket_layout(
      nbytes, dtypes, order, static_cast<size_t>(options_.first_bucket_cap_mb * mb),
      static_cast<size_t>(options_.bucket_cap_mb * mb));

  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < layout.size(); ++b) {
    Bucket bucket;
    bucket.params = layout[b];
    int64_t numel = 0;
    for (size_t i : bucket.params) {
      bucket.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    bucket.buffer = ops::zeros({numel}, params_[bucket.params.front()].options());
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket.views.push_back(
          ops::view(ops::narrow(bucket.buffer, 0, bucket.offsets[k], params_[i].numel()),
                    params_[i].shape()));
      bucket_of_[i] = b;
      slot_of_[i] = k;
      // gradient_as_bucket_view: an existing gradient (also a view into an old bucket, on a
      // rebuild) moves into the bucket now.
      if (options_.gradient_as_bucket_view && params_[i].grad().defined()) {
        ops::copy_(bucket.views[k], params_[i].grad());
        params_[i].set_grad(bucket.views[k]);
      }
    }
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(params_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  futures_.assign(buckets_.size(), nullptr);
}

std::string Reducer::unready_parameter_names() const {
  std::ostringstream os;
  size_t listed = 0, total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (listed < 20) os << (listed++ ? ", " : "") << names_[i];
    ++total;
  }
  if (total > listed) os << " (and " << total - listed << " more)";
  return os.str();
}

void Reducer::ensure_prior_reduction_finished() {
  if (armed_ && !backward_started_) {  // Note [Forward without backward]
    armed_ = false;
    for (auto& h : output_hooks_) h.remove();
    output_hooks_.clear();
    return;
  }
  DDP_CHECK(!armed_,
            "DistributedDataParallel: Expected to have finished reduction in the prior iteration "
            "before starting a new one. On rank "
                << pg_->rank() << " the previous backward started but these parameters did not "
                << "receive a gradient in it: " << unready_parameter_names()
                << ". Their buckets (and every later one) were never all-reduced. This usually "
                   "means the module has parameters that were not used in producing the loss: "
                   "pass find_unused_parameters=true in DDPOptions (DDP then marks them ready "
                   "when backward starts), or make every parameter take part in the loss. It also "
                   "happens when a backward stopped half-way (an exception in backward). See Note "
                   "[Unused parameters] in ddp/reducer.cpp and docs/ddp.md.");
}

void Reducer::register_comm_hook(std::shared_ptr<CommHookState> state, CommHook hook) {
  DDP_CHECK(state != nullptr && hook != nullptr,
            "register_comm_hook: expected a state and a hook, got a null one");
  DDP_CHECK(!hook_registered_,
            "register_comm_hook: a communication hook is already registered; it can be registered "
            "only once (as in PyTorch)");
  DDP_CHECK(iteration_ == 0 && !armed_,
            "register_comm_hook: register the hook before the first backward, on every rank");
  DDP_CHECK(state->process_group.get() == pg_.get(),
            "register_comm_hook: the state's process group is not the DDP's");
  hook_state_ = std::move(state);
  hook_ = std::move(hook);
  hook_registered_ = true;
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs, bool find_unused_parameters,
                                   bool shadow) {
  ensure_prior_reduction_finished();
  if (params_.empty()) return;  // nothing to reduce (every parameter is frozen)
  armed_ = true;
  shadowing_ = shadow;
  backward_started_ = false;
  find_unused_ = find_unused_parameters;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = static_cast<int64_t>(buckets_[b].params.size());
  }
  next_bucket_ = 0;
  arrival_order_.clear();
  timeline_.begin(iteration_, buckets_.size(), params_.size());
  bytes_before_ = hook_state_->bytes_all_reduced;

  unused_.clear();
  if (find_unused_parameters) {  // Note [Unused parameters]
    const std::unordered_set<const TensorImpl*> reached = autograd::reachable_leaves(outputs);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!reached.count(params_[i].impl_ptr().get())) unused_.push_back(i);
    }
  }
  // Backward starts when it reaches the module's output. The previous iteration's output hooks
  // went with its graph; removing them is a no-op unless that graph is still alive.
  for (auto& h : output_hooks_) h.remove();
  output_hooks_.clear();
  for (const Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad() || out.is_leaf()) continue;
    output_hooks_.push_back(autograd::register_hook(out, [this](const Tensor&) {
      on_output_grad();
      return Tensor();  // observe only; the gradient passes unchanged
    }));
  }
}

void Reducer::start_backward() {
  backward_started_ = true;
  timeline_.backward_started();
  for (size_t i : unused_) mark_ready(i);  // Note [Unused parameters]
}

void Reducer::on_output_grad() {
  if (armed_ && !backward_started_) start_backward();
}

void Reducer::on_gradient_ready(size_t i) {
  if (!armed_) return;  // no_sync(), or a backward that DDP's forward did not prepare for
  if (!backward_started_) start_backward();
  DDP_CHECK(!ready_[i], "DistributedDataParallel: parameter '"
                            << names_[i]
                            << "' received a gradient twice in one iteration. Expected each "
                               "parameter to be marked ready once per forward: run forward again "
                               "before every backward, and do not use a parameter outside the "
                               "module's forward (e.g. in a loss term) when "
                               "find_unused_parameters=true has marked it unused.");
  timeline_.param_ready(i);
  if (options_.rebuild_buckets && !buckets_rebuilt_) arrival_order_.push_back(i);
  mark_ready(i);
}

void Reducer::mark_ready(size_t i) {
  ready_[i] = 1;
  const size_t b = bucket_of_[i];
  const Tensor& slot = buckets_[b].views[slot_of_[i]];
  const Tensor grad = params_[i].grad();
  // The local gradient, not yet divided: averaging is the hook's (Note [Averaging]).
  if (!grad.defined() || shadowing_) {
    ops::zero_(slot);                // an unused parameter contributes nothing
  } else if (!grad.is_same(slot)) {  // (with gradient_as_bucket_view it may already BE the slot)
    ops::copy_(slot, grad);
    if (options_.gradient_as_bucket_view) params_[i].set_grad(slot);  // from now on, a view
  }
  if (--pending_[b] == 0) {
    timeline_.bucket_ready(b);
    launch_ready_buckets();
  }
  poll_finished();
}

void Reducer::launch_ready_buckets() {
  // Note [Bucket order]: only a prefix of ready buckets may go.
  while (next_bucket_ < buckets_.size() && pending_[next_bucket_] == 0) {
    timeline_.bucket_launched(next_bucket_);
    launch_bucket(next_bucket_);
    ++next_bucket_;
  }
  if (next_bucket_ == buckets_.size()) {
    // Every bucket is in flight: collect them once the engine has finished this backward.
    autograd::queue_callback([this] { finalize_backward(); });  // Note [Hook lifetime]
  }
}

void Reducer::launch_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  std::vector<Tensor> params;
  for (size_t i : bucket.params) params.push_back(params_[i]);
  GradBucket grad_bucket(b, b + 1 == buckets_.size(), bucket.buffer, bucket.views,
                         std::move(params));
  futures_[b] = hook_(grad_bucket);
  DDP_CHECK(futures_[b] != nullptr, "communication hook returned no future for bucket " << b);
}

void Reducer::poll_finished() {
  for (size_t b = 0; b < next_bucket_; ++b) {
    if (futures_[b]->is_completed()) timeline_.bucket_finished(b);
  }
}

std::vector<float> Reducer::wait_for_buckets() {
  // Note [Unused parameters]: how many ranks hold a gradient for each parameter. Issued before
  // the buckets are waited for, since waiting may issue a hook's later collectives: the order
  // must be the same on every rank, joined ones included (shadow_backward).
  Tensor holders;
  std::shared_ptr<Work> holders_work;
  if (find_unused_) {
    std::vector<float> has(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      has[i] = !shadowing_ && params_[i].grad().defined() ? 1.f : 0.f;
    }
    holders = ops::from_vector(has, {static_cast<int64_t>(has.size())});
    holders_work = pg_->all_reduce(holders, ReduceOp::Sum);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Tensor result = futures_[b]->wait();
    DDP_CHECK(result.defined() && result.numel() == buckets_[b].buffer.numel() &&
                  result.dtype() == buckets_[b].buffer.dtype(),
              "communication hook: the future of bucket "
                  << b << " must hold " << buckets_[b].buffer.numel() << " "
                  << dtype_name(buckets_[b].buffer.dtype()) << " values");
    if (!result.is_same(buckets_[b].buffer)) ops::copy_(buckets_[b].buffer, result);
    if (!shadowing_) timeline_.bucket_finished(b);
    futures_[b].reset();
  }
  last_bytes_ = hook_state_->bytes_all_reduced - bytes_before_;
  if (!holders_work) return {};
  holders_work->wait();
  return holders.to_vector<float>();
}

void Reducer::shadow_backward(bool find_unused_parameters) {
  if (params_.empty()) return;
  find_unused_ = find_unused_parameters;
  // Rebuilding needs the order rank 0 observed; a rank that never ran a backward has none.
  if (options_.rebuild_buckets && !buckets_rebuilt_ && !find_unused_) {
    DDP_CHECK(pg_->rank() != 0,
              "Join: rank 0 ran out of inputs before its first synchronized backward, so it has "
              "no gradient order to share for rebuilding the buckets (Note [Rebuilding "
              "buckets]); give every rank at least one batch or set rebuild_buckets=false");
  }
  shadowing_ = true;
  bytes_before_ = hook_state_->bytes_all_reduced;
  for (size_t b = 0; b < buckets_.size(); ++b) {  // launch all, then wait all: as in a backward
    ops::zero_(buckets_[b].buffer);
    launch_bucket(b);
  }
  wait_for_buckets();  // the results are the others' average: this rank does not step
  shadowing_ = false;
  if (options_.rebuild_buckets && !buckets_rebuilt_ && !find_unused_) {
    arrival_order_.assign(params_.size(), 0);  // a placeholder: rank 0's order wins
    rebuild_buckets();
  }
}

void Reducer::finalize_backward() {
  timeline_.backward_ended();
  poll_finished();
  const std::vector<float> held = wait_for_buckets();
  if (shadowing_) {  // a joined rank's replay: the others' average is not this rank's to apply
    armed_ = false;
    shadowing_ = false;
    return;
  }
  // Write the averages back into .grad (with views they are already there).
  for (const Bucket& bucket : buckets_) {
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      if (!held.empty() && held[i] == 0) continue;  // no rank has a gradient: leave it undefined
      const Tensor grad = params_[i].grad();
      if (options_.gradient_as_bucket_view) {
        if (!grad.is_same(bucket.views[k])) params_[i].set_grad(bucket.views[k]);
      } else if (grad.defined()) {
        ops::copy_(grad, bucket.views[k]);
      } else {
        params_[i].set_grad(ops::clone(bucket.views[k]));
      }
    }
  }
  armed_ = false;
  ++iteration_;
  timeline_.finalized();
  if (options_.rebuild_buckets && !buckets_rebuilt_ && !find_unused_) rebuild_buckets();
}

void Reducer::rebuild_buckets() {
  // Note [Rebuilding buckets]. Without find_unused_parameters a backward finishes only when every
  // parameter got its gradient, so every rank holds a full order of the same length.
  DDP_CHECK(arrival_order_.size() == params_.size(),
            "Reducer: recorded " << arrival_order_.size() << " gradient arrivals for "
                                 << params_.size() << " parameters");
  Tensor order =
      ops::from_vector<int64_t>(std::vector<int64_t>(arrival_order_.begin(), arrival_order_.end()),
                                {static_cast<int64_t>(arrival_order_.size())}, kInt64);
  if (pg_->size() > 1) pg_->broadcast(order, 0)->wait();
  const std::vector<int64_t> rank0_order = order.to_vector<int64_t>();
  initialize_buckets(std::vector<size_t>(rank0_order.begin(), rank0_order.end()));
  buckets_rebuilt_ = true;
  arrival_order_.clear();
}

}  // namespace ddplab::distributed
