// Lab 6: the student's four functions (loss_scaling_lab.h) put together into a GradScaler with
// the same loop as optim::GradScaler (optim/grad_scaler.h), minus its checks and its state_dict:
//
//   lab6::LossScaler scaler(options, pg);
//   scaler.scale(loss).backward();   // every gradient is S times too large
//   scaler.step(opt);                // unscale_grads_ (part 2), any_rank_found_inf (part 3):
//                                    // every rank steps, or every rank skips
//   scaler.update();                 // update_scale_ (part 4)
//
// Given here, not graded: it is what fp16_training runs.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/process_group.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace lab6 {

class LossScaler {
 public:
  // PyTorch's options (optim::GradScalerOptions); `pg` null: this process alone.
  explicit LossScaler(ddplab::optim::GradScalerOptions options,
                      std::shared_ptr<ddplab::distributed::ProcessGroup> pg = nullptr);

  ddplab::Tensor scale(const ddplab::Tensor& loss) const;
  // Unscales the optimizer's gradients and steps unless some rank found an inf or NaN.
  // Returns whether it stepped (the same on every rank).
  bool step(ddplab::optim::Optimizer& optimizer);
  // Backs off or grows the scale from the last step's (agreed) flag.
  void update();

  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  int64_t get_growth_tracker() const { return growth_tracker_; }

 private:
  ddplab::optim::GradScalerOptions options_;
  std::shared_ptr<ddplab::distributed::ProcessGroup> pg_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool found_inf_ = false;  // of the last step, agreed by every rank
};

}  // namespace lab6
