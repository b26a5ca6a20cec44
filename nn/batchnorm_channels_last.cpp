// The forward of batch_norm, batch_norm_relu and batch_norm_add_relu on a channels-last or
// blocked x: the per-channel statistics and the normalization, walked as nn/batchnorm_nhwc_walk.h
// says. Tested equal to the reference kernels (nn/batchnorm_contiguous.cpp) in
// tests/nn/test_batchnorm_channels_last.cpp ("batch_norm channels-last: float32 matches the
// contiguous input", the float64 and bfloat16 cases, "batch_norm channels-last: float32 statistics
// of values far from zero"); the add + relu form equal to add_relu(batch_norm(...)) bit for bit
// ("batch_norm_add_relu: bit for bit add_relu(batch_norm(...)), forward and backward"); blocked x
// equal to channels-last bit for bit (tests/nn/test_blocked_activations.cpp, "batch norm on
// blocked x: the channels-last results, forward and backward").
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nn/batchnorm_internal.h"
#include "nn/batchnorm_nhwc_walk.h"
#include "tensor/dtype.h"
#include "tensor/macros.h"

namespace ddplab::nn::batchnorm_detail {

namespace {

// batch_moments for channels-last x: each block's sum and M2 into part ([blocks][2][C]), then
// the merge in block order.
template <class T, int64_t L>
DDP_CPU_CLONES void moments_lanes(const T* x, const NhwcBlocks& blk, double* mean, double* m2) {
  using P = compute_t<T>;
  const int64_t c = blk.c, lane = L ? L : blk.lane;
  std::vector<double> part(static_cast<size_t>(blk.count() * 2 * c));
#pragma omp parallel if (parallel(blk))
  {
    LaneArray<P, L> acc_lanes(lane), mu_lanes(lane);
    P *acc = acc_lanes.data(), *mu = mu_lanes.data();
    std::vector<double> block_mean(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blk.count(); ++b) {
      const T* xb = x + blk.first_value(b);
      double* sum = &part[static_cast<size_t>(b * 2 * c)];
      const double nb = static_cast<double>(blk.pixels(b));
      // The sum is taken of x - ref, ref = the block's first pixel: values near the mean then
      // add as small deviations, not as offsets that a float sum would round away.
      for (int64_t ch = 0; ch < c; ++ch) mu[ch] = static_cast<P>(xb[ch]);
      repeat_over_lanes(mu, c, lane);
      std::fill(acc, acc + lane, P(0));
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        for_lanes_from(sg.j0, sg.n, lane,
                       [&](int64_t i, int64_t j) { acc[j] += static_cast<P>(px[i]) - mu[j]; });
      }
      fold_lanes(acc, lane, c, sum);
      for (int64_t ch = 0; ch < c; ++ch) {
        block_mean[static_cast<size_t>(ch)] = sum[ch] / nb + static_cast<double>(mu[ch]);
        sum[ch] = block_mean[static_cast<size_t>(ch)] * nb;
      }
      for (int64_t ch = 0; ch < c; ++ch)
        mu[ch] = static_cast<P>(block_mean[static_cast<size_t>(ch)]);
      repeat_over_lanes(mu, c, lane);
      std::fill(acc, acc + lane, P(0));
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
          const P dx = static_cast<P>(px[i]) - mu[j];
          acc[j] += dx * dx;
        });
      }
      fold_lanes(acc, lane, c, sum + c);
      // The squares were taken around mu, the block mean rounded to P: sum((x - mu)^2) =
      // M2_b + n_b * (mean_b - mu)^2, since the deviations from mean_b sum to zero.
      for (int64_t ch = 0; ch < c; ++ch) {
        const double off = block_mean[static_cast<size_t>(ch)] - static_cast<double>(mu[ch]);
        sum[c + ch] -= nb * off * off;
      }
    }
  }
  const int64_t channels = blk.channels();
  std::fill(mean, mean + channels, 0.0);
  std::fill(m2, m2 + channels, 0.0);
  for (int64_t b = 0; b < blk.count(); ++b) {
    double* m = mean + blk.group(b) * c;
    for (int64_t ch = 0; ch < c; ++ch) m[ch] += part[static_cast<size_t>(b * 2 * c + ch)];
  }
  for (int64_t ch = 0; ch < channels; ++ch) mean[ch] /= static_cast<double>(blk.p);
  for (int64_t b = 0; b < blk.count(); ++b) {
    const double nb = static_cast<double>(blk.pixels(b));
    const double* sum = &part[static_cast<size_t>(b * 2 * c)];
    const double* m = mean + blk.group(b) * c;
    double* q = m2 + blk.group(b) * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const double spread = sum[ch] / nb - m[ch];
      q[ch] += sum[c + ch] + nb * spread * spread;
    }
  }
}

}  // namespace

// block: 0 for channels-last x, else the blocked layout's (nhwc_blocks); likewise below.
template <class T>
void batch_moments_nhwc(const T* x, const BnShape& d, double* mean, double* m2, int64_t block) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  with_lane_width(blk, [&](auto L) { moments_lanes<T, L.value>(x, blk, mean, m2); });
}

namespace {

// normalize for channels-last x: the same scale and shift per channel, the same clamp. With a
// residual r (batch_norm_add_relu): y = relu(normalized + r), rounded and clamped exactly as
// add_relu does it after a separate batch_norm, without writing and reading back the normalized
// tensor.
template <class T, bool kRelu, bool kAdd, int64_t L>
DDP_CPU_CLONES void normalize_lanes(const T* x, const T* residual, const NhwcBlocks& blk,
                                    const ScaleShiftLanes<compute_t<T>>& lanes, T* y) {
  using P = compute_t<T>;
  const int64_t lane = L ? L : blk.lane;
#pragma omp parallel for schedule(static) if (parallel(blk))
  for (int64_t b = 0; b < blk.count(); ++b) {
    const P* psc = lanes.sc.data() + blk.group(b) * lane;
    const P* psh = lanes.sh.data() + blk.group(b) * lane;
    for (Segments sg(blk, b); sg.next();) {
      const T* p = x + sg.start;
      const T* r = kAdd ? residual + sg.start : nullptr;
      T* q = y + sg.start;
      for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
        const P v = static_cast<P>(p[i]) * psc[j] + psh[j];
        if constexpr (kAdd) {
          // The normalized value rounded to T, as batch_norm stores it; the sum rounded to T
          // once, after the clamp, which is the same number (rounding keeps the sign; NaN stays
          // NaN) and lets the loop vectorize.
          const P sum = static_cast<P>(static_cast<T>(v)) + static_cast<P>(r[i]);
          q[i] = static_cast<T>(relu_clamp(sum));
        } else {
          q[i] = static_cast<T>(kRelu ? relu_clamp(v) : v);
        }
      });
    }
  }
}

}  // namespace

template <class T, bool kRelu>
void normalize_nhwc(const T* x, const BnShape& d, const double* mean, const double* invstd,
                    const compute_t<T>* weight, const compute_t<T>* bias, T* y, int64_t block) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  const ScaleShiftLanes<compute_t<T>> lanes(blk, mean, invstd, weight, bias);
  with_lane_width(
      blk, [&](auto L) { normalize_lanes<T, kRelu, false, L.value>(x, nullptr, blk, lanes, y); });
}

template <class T>
void normalize_add_relu_nhwc(const T* x, const T* residual, const BnShape& d, const double* mean,
                             const double* invstd, const compute_t<T>* weight,
                             const compute_t<T>* bias, T* y, int64_t block) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  const ScaleShiftLanes<compute_t<T>> lanes(blk, mean, invstd, weight, bias);
  with_lane_width(
      blk, [&](auto L) { normalize_lanes<T, true, true, L.value>(x, residual, blk, lanes, y); });
}

#define DDP_BN_INSTANTIATE(T)                                                                    \
  template void batch_moments_nhwc<T>(const T*, const BnShape&, double*, double*, int64_t);      \
  template void normalize_nhwc<T, false>(const T*, const BnShape&, const double*, const double*, \
                                         const compute_t<T>*, const compute_t<T>*, T*, int64_t); \
  template void normalize_nhwc<T, true>(const T*, const BnShape&, const double*, const double*,  \
                                        const compute_t<T>*, const compute_t<T>*, T*, int64_t);  \
  template void normalize_add_relu_nhwc<T>(const T*, const T*, const BnShape&, const double*,    \
                                           const double*, const compute_t<T>*,                   \
                                           const compute_t<T>*, T*, int64_t);
DDP_BN_INSTANTIATE(float)
DDP_BN_INSTANTIATE(double)
DDP_BN_INSTANTIATE(BFloat16)
#undef DDP_BN_INSTANTIATE

}  // namespace ddplab::nn::batchnorm_detail
