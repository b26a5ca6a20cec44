// Lab 6, the reference. Part 1 works from float16's format rather than converting, so that the
// thresholds are on the page; the grader checks them against the conversion of tensor/half.h.
#include "loss_scaling_lab.h"

#include <cmath>

#include "tensor/ops.h"

namespace lab6 {

namespace {

// float16 keeps 10 fraction bits and exponents down to -14; below 2^-14 it counts in steps of
// 2^-24 (subnormals). A value rounds to the nearest float16, ties to the even neighbour:
//   * to 0 when |v| <= 2^-25, half of the smallest step (the tie at 2^-25 goes to 0, even);
//   * up to the normal 2^-14 from 2^-14 - 2^-25 on (that tie goes to 2^-14, even too);
//   * to inf from 65520 on, halfway between the largest float16, 65504, and the next step,
//     65536, which does not exist (the tie goes to the even 65536, i.e. inf).
constexpr double kUnderflowBelowOrAt = 0x1p-25;
constexpr double kSmallestNormal = 0x1p-14;
constexpr double kOverflowFrom = 65520.0;

}  // namespace

Float16Report check_float16(const float* values, size_t n, float scale) {
  Float16Report report;
  for (size_t i = 0; i < n; ++i) {
    const float v = values[i] * scale;  // rounded to float32 first, as a scaled gradient is
    const double a = std::fabs(static_cast<double>(v));
    if (!std::isfinite(v) || a >= kOverflowFrom)
      ++report.overflow;
    else if (v != 0 && a <= kUnderflowBelowOrAt)
      ++report.underflow;
    else if (v != 0 && a < kSmallestNormal - kUnderflowBelowOrAt)
      ++report.subnormal;
  }
  return report;
}

double largest_safe_scale(const float* values, size_t n) {
  double largest = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) return 0;
    largest = std::fmax(largest, std::fabs(static_cast<double>(values[i])));
  }
  if (largest == 0) return INFINITY;
  // Multiplying by a power of two is exact in double, so these comparisons are exact too.
  double s = 1;
  while (largest * s >= kOverflowFrom) s /= 2;
  while (largest * s * 2 < kOverflowFrom) s *= 2;
  return s;
}

bool unscale_grads_(const std::vector<ddplab::Tensor>& grads, double scale) {
  const double inv_scale = 1.0 / scale;
  bool found_inf = false;
  for (const ddplab::Tensor& g : grads) {
    if (!g.defined()) continue;
    ddplab::ops::mul_(g, inv_scale);
    // An inf or NaN survives the multiplication, so checking afterwards is as good as before.
    if (!ddplab::ops::all_finite(g)) found_inf = true;
  }
  return found_inf;
}

bool any_rank_found_inf(ddplab::distributed::ProcessGroup& pg, bool found_inf) {
  // MAX of 0/1 flags is "any". A float tensor, since every backend reduces float32.
  ddplab::Tensor flag = ddplab::ops::full({1}, found_inf ? 1.0 : 0.0);
  pg.all_reduce(flag, ddplab::distributed::ReduceOp::Max)->wait();
  return flag.item<float>() != 0;
}

void update_scale_(double& scale, int64_t& growth_tracker, bool found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    scale *= backoff_factor;
    growth_tracker = 0;  // growth needs growth_interval clean steps IN A ROW
  } else if (++growth_tracker == growth_interval) {
    scale *= growth_factor;
    growth_tracker = 0;
  }
}

}  // namespace lab6
