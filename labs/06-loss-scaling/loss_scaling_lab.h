// Lab 6: mixed precision and loss scaling. The four functions the student writes (starter/,
// graded by grader/grader.cpp against ddplab's float16 conversion (tensor/half.h), its
// optim::GradScaler and PyTorch's documented update rule); solution/ is the course staff's
// version. loss_scaler.h puts the four together into a GradScaler. Handout: README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace lab6 {

// Part 1. What rounding `values[i] * scale` (the product taken in float32) to float16 does to
// each value: how many are lost, how many keep fewer bits, how many blow up.
struct Float16Report {
  int64_t underflow = 0;  // nonzero in float32, exactly zero in float16: the gradient is gone
  int64_t subnormal = 0;  // nonzero in float16 but below its smallest normal number, 2^-14:
                          // kept with fewer than float16's 11 significant bits
  int64_t overflow = 0;   // inf or NaN in float16 (inf or NaN already in float32 counts too)
};
Float16Report check_float16(const float* values, size_t n, float scale = 1.0f);

// Part 1. The largest power of two S (possibly below 1) such that no values[i] * S rounds to
// inf in float16: the largest loss scale these gradients survive. +inf when every value is
// zero (no scale overflows them); 0 when some value is already inf or NaN (none helps).
double largest_safe_scale(const float* values, size_t n);

// Part 2. GradScaler's unscale_: multiplies every defined gradient by 1 / scale, in place (the
// inverse computed in double, as optim::GradScaler does; exact when scale is a power of two),
// and returns whether any element of any gradient is inf or NaN: this rank's found_inf.
// Undefined tensors (parameters without a gradient) are skipped.
bool unscale_grads_(const std::vector<ddplab::Tensor>& grads, double scale);

// Part 3. Every rank calls this with its own found_inf; every rank gets back the same answer:
// true when ANY rank found an inf or NaN. One collective over `pg`.
bool any_rank_found_inf(ddplab::distributed::ProcessGroup& pg, bool found_inf);

// Part 4. PyTorch's update rule for the scale (torch.amp.GradScaler.update), in place:
//   found_inf:  scale *= backoff_factor, growth_tracker = 0;
//   otherwise:  growth_tracker += 1, and when it reaches growth_interval,
//               scale *= growth_factor, growth_tracker = 0.
void update_scale_(double& scale, int64_t& growth_tracker, bool found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval);

}  // namespace lab6
