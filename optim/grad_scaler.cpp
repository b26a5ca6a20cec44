// GradScaler: dynamic loss scaling (see optim/grad_scaler.h).
//
// Note [One scale on every rank]
// ------------------------------
// Under data parallelism every rank holds its own GradScaler, yet the replicas stay identical only
// if every rank skips exactly the same steps and therefore keeps exactly the same scale. ddplab
// gets this by construction rather than by luck:
//   1. The only input to the skip decision is one overflow flag per step, and that flag is
//      all-reduced with MAX over the process group before anyone reads it. After the all-reduce
//      every rank holds the same value: "some rank saw inf/NaN".
//   2. update() is a pure function of (scale, growth tracker, that flag). Identical inputs on
//      every rank give identical outputs, so the scales cannot drift apart, step after step.
// Under plain DDP the gradients are already equal after backward's all-reduce (an inf on one rank
// becomes inf or NaN in everyone's average), so the reduction looks redundant there. It is not
// redundant in general: with gradient compression, with model parallelism (each rank holds
// different parameters), or when a rank checks its gradients before they are averaged, ranks can
// see different flags. PyTorch's GradScaler checks only local gradients (the failure reported in
// PyTorch issue 136009: per-rank overflow flags with compressed communication let the scales
// diverge, and with them the updates). One extra 4-byte all-reduce per step removes the question.
//
// Finding inf/NaN in one reduction per gradient
// ---------------------------------------------
// An inf or NaN element makes sum(g) inf or NaN (inf + -inf = NaN), so one pass over each gradient
// gives a scalar whose finiteness answers "is g finite?", and the scalars of all gradients are
// summed (in float64) into a single number whose finiteness is the flag: no per-tensor isfinite
// map, no per-tensor host sync, one host sync per step. The converse holds except at float32's
// very limit: the sum of finite elements comes back as inf only when it exceeds ~3.4e38 (the CPU
// accumulates in float64 but returns float32; CUDA accumulates in float32). Such a gradient's
// squared norm is inf already, so calling it an overflow is the useful answer; PyTorch's fused
// kernel, which tests each element, would let that step through.
//
// Note [GradScaler under Join]
// ----------------------------
// With uneven inputs (comm/join.h) a rank that has run out of batches sits in Join::join()
// while the others keep stepping, and each of their steps ends with the all-reduce above. The
// joined rank must issue it too, or the others wait forever (or, worse, their all-reduce meets
// the joined rank's next per-iteration count). So the scaler is a Joinable: for every iteration of
// the others, after DDP's hook has shadowed the gradient all-reduces, its hook all-reduces a 0
// ("no overflow here": a joined rank has no gradients of its own) once per optimizer its last
// step unscaled, and feeds the verdict to the same update rule. Its scale and growth tracker so
// follow the running ranks' step by step, and all ranks leave the Join with one scale: the next
// epoch, or a checkpoint, sees a single value.
// The hook shadows one step per iteration, so the loop must step after every synchronizing
// backward (no accumulation under no_sync); and it must come after the DDP model in the Join's
// list, whose first participant counts the iterations at the start of the forward (the scaler
// refuses to be first rather than hang).

#include "optim/grad_scaler.h"

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/process_group.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ddplab::optim {

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<distributed::ProcessGroup> pg)
    : options_(options), pg_(std::move(pg)), scale_(options.init_scale) {
  DDP_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale),
            "GradScaler: init_scale must be positive and finite, got " << options_.init_scale);
  DDP_CHECK(options_.growth_factor > 1,
            "GradScaler: growth_factor must be > 1, got " << options_.growth_factor);
  DDP_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
            "GradScaler: backoff_factor must be in (0, 1), got " << options_.backoff_factor);
  DDP_CHECK(options_.growth_interval > 0,
            "GradScaler: growth_interval must be positive, got " << options_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  return ddplab::mul(loss, scale_);
}

namespace {

// Note [GradScaler under Join]: the Join's first participant must be the one whose forward
// starts the iteration (DDP), not the scaler, whose all-reduce ends it.
void check_not_first_joinable(const distributed::JoinConfig& config) {
  DDP_CHECK(!(config.enable && config.is_first_joinable),
            "GradScaler: it is the first participant of a Join; list the DDP model first, e.g. "
            "Join({ddp.get(), &scaler})");
}

}  // namespace

void GradScaler::unscale_(Optimizer& optimizer) {
  check_not_first_joinable(join_config);
  if (!options_.enabled) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  DDP_CHECK(state.stage == Stage::kReady,
            (state.stage == Stage::kUnscaled
                 ? "GradScaler::unscale_: already called on this optimizer since the last update()"
                 : "GradScaler::unscale_: called after step(); call update() first"));
  autograd::NoGradGuard no_grad;
  // Computed in double, applied in the gradients' dtype: exact for the usual powers of two.
  const double inv_scale = 1.0 / scale_;
  std::vector<Tensor> sums;
  Device device = kCPU;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      // As PyTorch: the parameters (and so their gradients) must stay float32 under autocast; a
      // float16 gradient would overflow the unscaled sum at 65504 and lose the small values.
      DDP_CHECK(g.dtype() != kFloat16,
                "GradScaler::unscale_: a float16 gradient; keep the parameters in float32 and let "
                "autocast run the float16 math");
      ops::mul_(g, inv_scale);
      sums.push_back(ops::to(ops::sum(g), kFloat64));  // inf/NaN survive: see the note above
      device = g.device();
    }
  }
  Tensor total = sums.empty() ? ops::zeros({1}, {kFloat64, device})
                              : ops::reshape(ops::sum(ops::stack(sums)), {1});
  // 1 where some gradient was not finite, else 0.
  state.found_inf = agree_on_overflow(ops::rsub(ops::to(ops::isfinite(total), kFloat32), 1.0));
  state.stage = Stage::kUnscaled;
}

bool GradScaler::agree_on_overflow(Tensor found) {
  if (pg_) {  // Note [One scale on every rank]
    found = ops::to(found, pg_->device());
    pg_->all_reduce(found, distributed::ReduceOp::Max)->wait();
  }
  return found.item<double>() != 0;
}

bool GradScaler::step(Optimizer& optimizer) {
  check_not_first_joinable(join_config);
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  DDP_CHECK(state.stage != Stage::kStepped,
            "GradScaler::step: already called on this optimizer since the last update()");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  const bool stepped = !state.found_inf;
  if (stepped) optimizer.step();
  state.stage = Stage::kStepped;
  return stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (per_optimizer_.empty()) return;  // nothing was unscaled: no evidence either way
  bool found_inf = false;
  for (const auto& entry : per_optimizer_) found_inf = found_inf || entry.second.found_inf;
  optimizers_per_step_ = per_optimizer_.size();  // each made one agreement (unscale_)
  update_scale(found_inf);
  per_optimizer_.clear();
}

void GradScaler::update_scale(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  DDP_CHECK(new_scale > 0 && std::isfinite(new_scale),
            "GradScaler::update: the new scale must be positive and finite, got " << new_scale);
  scale_ = new_scale;
  per_optimizer_.clear();
}

nlohmann::json GradScaler::state_dict() const {
  if (!options_.enabled) return nlohmann::json::object();  // as PyTorch: nothing to save
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval},
          {"_growth_tracker", growth_tracker_}};
}

void GradScaler::load_state_dict(const nlohmann::json& state) {
  if (!options_.enabled) return;
  DDP_CHECK(!state.empty(),
            "GradScaler::load_state_dict: the state is empty (saved from a disabled GradScaler)");
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    DDP_CHECK(state.contains(key), "GradScaler::load_state_dict: missing key '" << key << "'");
  }
  scale_ = state.at("scale").get<double>();
  options_.growth_factor = state.at("growth_factor").get<double>();
  options_.backoff_factor = state.at("backoff_factor").get<double>();
  options_.growth_interval = state.at("growth_interval").get<int64_t>();
  growth_tracker_ = state.at("_growth_tracker").get<int64_t>();
}

// What a joined rank does for the scaler (Note [GradScaler under Join]).
class GradScalerJoinHook : public distributed::JoinHook {
 public:
  explicit GradScalerJoinHook(GradScaler& scaler) : scaler_(scaler) {}
  void main_hook() override { scaler_.join_shadow_step(); }

 private:
  GradScaler& scaler_;
};

std::unique_ptr<distributed::JoinHook> GradScaler::join_hook() {
  return std::make_unique<GradScalerJoinHook>(*this);
}

Device GradScaler::join_device() const {
  return pg_ ? pg_->device() : Device(kCPU);
}

void GradScaler::join_shadow_step() {
  if (!options_.enabled || !pg_) return;  // the running ranks issue no all-reduce either
  bool found_inf = false;
  for (size_t i = 0; i < optimizers_per_step_; ++i) {
    // The running ranks' verdict, to which this rank adds "no overflow".
    found_inf = agree_on_overflow(ops::zeros({1}, {kFloat32, pg_->device()})) || found_inf;
  }
  update_scale(found_inf);
}

}  // namespace ddplab::optim
