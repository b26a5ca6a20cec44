// GradScaler: dynamic loss scaling for mixed-precision training (PyTorch's torch.amp.GradScaler).
//
// Small float16 gradients underflow to zero. Multiplying the loss by a large factor S before
// backward multiplies every gradient by S too, lifting them into float16's range; dividing them
// by S again before the optimizer step restores their true values. S is chosen dynamically: when
// a step's gradients overflow (inf or NaN), the step is skipped and S halved; after
// `growth_interval` clean steps in a row, S is doubled.
//
//   optim::GradScaler scaler({}, pg);          // pg: the DDP process group (or null)
//   scaler.scale(loss).backward();             // gradients are S times too large here
//   scaler.unscale_(opt);                      // optional: true gradients, e.g. for clipping
//   optim::clip_grad_norm_(params, 1.0);
//   scaler.step(opt);                          // skipped if any rank found inf/NaN
//   scaler.update();                           // halve S after an overflow, grow it after a run
//
// With a process group, the overflow flag is all-reduced (max) so that every rank takes the same
// decision (Note [One scale on every rank] in grad_scaler.cpp).
//
// With uneven inputs the scaler joins the Join after the DDP model, because a rank out of data
// must take part in that all-reduce too (Note [GradScaler under Join] in grad_scaler.cpp):
//
//   distributed::Join join({ddp.get(), &scaler});
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "comm/join.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace ddplab::optim {

// PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
  bool enabled = true;             // false: every method passes through (same loop either way)
};

class GradScaler : public distributed::Joinable {
 public:
  // `pg`: the group whose ranks must agree on skipping a step (null: this process alone).
  explicit GradScaler(GradScalerOptions options = {},
                      std::shared_ptr<distributed::ProcessGroup> pg = nullptr);

  // loss * scale, differentiable (so backward produces scaled gradients).
  Tensor scale(const Tensor& loss) const;
  // Divides the optimizer's gradients by the scale, in place, and records whether any of them
  // (on any rank) is inf or NaN. At most once per optimizer between update()s.
  void unscale_(Optimizer& optimizer);
  // Unscales (if unscale_ was not called) and runs optimizer.step() unless an overflow was found.
  // Returns whether the optimizer stepped.
  bool step(Optimizer& optimizer);
  // Adjusts the scale from this iteration's overflow flags and forgets them.
  void update();
  // Sets the scale directly (PyTorch's update(new_scale)).
  void update(double new_scale);

  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  int64_t get_growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

  // Joinable (comm/join.h): a rank out of inputs answers "no overflow" to the others'
  // found-inf all-reduce of every step, and updates its scale with their verdict.
  std::unique_ptr<distributed::JoinHook> join_hook() override;
  Device join_device() const override;
  std::shared_ptr<distributed::ProcessGroup> join_process_group() const override { return pg_; }

 private:
  friend class GradScalerJoinHook;
  // The all-reduce (max) of this rank's overflow flag (1 or 0): whether any rank overflowed.
  bool agree_on_overflow(Tensor found);
  // One update() from the step's agreed flag: back off, or count towards growth.
  void update_scale(bool found_inf);
  void join_shadow_step();  // a joined rank's part of one step of the others

  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    bool found_inf = false;  // agreed across ranks
  };

  GradScalerOptions options_;
  std::shared_ptr<distributed::ProcessGroup> pg_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::map<const Optimizer*, PerOptimizer> per_optimizer_;  // this iteration's, until update()
  size_t optimizers_per_step_ = 1;  // how many agreements the last step made (one per optimizer)
};

}  // namespace ddplab::optim
