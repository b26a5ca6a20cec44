// The backward of batch_norm, batch_norm_relu and batch_norm_add_relu on a channels-last or
// blocked x, walked as nn/batchnorm_nhwc_walk.h says, and SyncBatchNorm's two backward steps on
// such an x. Tested equal to the reference kernels (nn/batchnorm_contiguous.cpp) in
// tests/nn/test_batchnorm_channels_last.cpp ("batch_norm channels-last: float32 matches the
// contiguous input" and the float64 and bfloat16 cases compare every gradient, "batch_norm
// channels-last: gradcheck in float64, training and eval, with relu"); the add + relu form equal
// to add_relu(batch_norm(...))'s backward bit for bit ("batch_norm_add_relu: bit for bit
// add_relu(batch_norm(...)), forward and backward"); blocked x equal to channels-last bit for bit
// (tests/nn/test_blocked_activations.cpp, "batch norm on blocked x: the channels-last results,
// forward and backward", "SyncBatchNorm's steps on blocked x: the channels-last bits, results
// blocked").
//
// Backward reads x and dy twice from memory here (once for the sums, once for dx), where the
// reference loops find a small channel still in cache the second time: the sums are over all
// pixels, and every pixel holds every channel. For batch_norm_relu the mask y > 0 is recomputed
// from x with the forward's own scale and shift (the same operations on the same values as
// normalize_nhwc, hence the same mask bit for bit), so y is never read.
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "nn/batchnorm_internal.h"
#include "nn/batchnorm_nhwc_walk.h"
#include "tensor/dtype.h"
#include "tensor/functors.h"
#include "tensor/macros.h"

namespace ddplab::nn::batchnorm_detail {

namespace {

// dy as the backward sees it: for batch_norm_relu (relu: normalize's scale and shift over the
// lanes) zero where the forward's output was not positive. The mask y > 0 is v > 0 for the same
// v = x * scale + shift that normalize_nhwc clamped (NaN: neither), so no y is read. sc, sh: the
// lanes of the block's group.
template <class T, bool kRelu>
DDP_ALWAYS_INLINE compute_t<T> masked_grad(const T* x, const T* dy, const compute_t<T>* sc,
                                           const compute_t<T>* sh, int64_t i, int64_t j) {
  using P = compute_t<T>;
  const P g = static_cast<P>(dy[i]);
  if constexpr (kRelu) {
    const P v = static_cast<P>(x[i]) * sc[j] + sh[j];
    return v > P(0) ? g : P(0);
  }
  return g;
}

// Calls run(L, kRelu) with the lane width as with_lane_width and kRelu = (relu != nullptr).
template <class T, class F>
void with_lanes_and_mask(const NhwcBlocks& blk, const ScaleShiftLanes<compute_t<T>>* relu, F run) {
  with_lane_width(blk, [&](auto L) {
    if (relu) {
      run(L, std::true_type{});
    } else {
      run(L, std::false_type{});
    }
  });
}

// relu's backward, dy_masked = y > 0 ? dy : 0 for n values: ReluBackwardOp itself, applied in P
// and rounded back to T, which is exact (a select on bfloat16 values compiles to scalar code with
// a branch per value: the bfloat16 node took 3.5x as long).
template <class T>
DDP_ALWAYS_INLINE void mask_by_output(const T* dy, const T* y, int64_t n, T* dy_masked) {
  using P = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    dy_masked[i] = static_cast<T>(
        functors::ReluBackwardOp::apply(static_cast<P>(dy[i]), static_cast<P>(y[i]), P(0), P(0)));
  }
}

// grad_sums for channels-last x: sums = [sum_dy (C), sum_dy_xmu (C)], per block, then merged in
// block order. The products are taken around the mean rounded to P (mu) and corrected after the
// merge: sum(dy * (x - mean)) = sum(dy * (x - mu)) + sum(dy) * (mu - mean).
// kMaskY (batch_norm_add_relu): dy is masked by its own output y first, relu's backward, and the
// masked dy is written to dy_masked on the way (the residual's gradient, and what dx is computed
// from), which saves that pass reading its result back.
template <class T, bool kRelu, bool kMaskY, int64_t L>
DDP_CPU_CLONES void grad_sums_lanes(const T* x, const T* dy,
                                    const ScaleShiftLanes<compute_t<T>>* relu, const T* y,
                                    T* dy_masked, const NhwcBlocks& blk, const double* mean,
                                    double* sums) {
  using P = compute_t<T>;
  const int64_t c = blk.c, lane = L ? L : blk.lane;
  const std::vector<P> mu = over_lanes<P>(blk, mean);
  std::vector<double> part(static_cast<size_t>(blk.count() * 2 * c));
#pragma omp parallel if (parallel(blk))
  {
    LaneArray<P, L> dy_lanes(lane), dy_xmu_lanes(lane);
    P *acc_dy = dy_lanes.data(), *acc_dy_xmu = dy_xmu_lanes.data();
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blk.count(); ++b) {
      std::fill(acc_dy, acc_dy + lane, P(0));
      std::fill(acc_dy_xmu, acc_dy_xmu + lane, P(0));
      const int64_t at = blk.group(b) * lane;
      const P* pmu = mu.data() + at;
      const P* rsc = kRelu ? relu->sc.data() + at : nullptr;
      const P* rsh = kRelu ? relu->sh.data() + at : nullptr;
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        const T* pdy = dy + sg.start;
        if constexpr (kMaskY) {
          // Masked into dy_masked first, then summed from there: the segment is still in cache,
          // and each loop stays simple enough to vectorize (writing dy_masked from inside the
          // sums loop made bfloat16's step 30% longer).
          T* masked = dy_masked + sg.start;
          mask_by_output(pdy, y + sg.start, sg.n, masked);
          pdy = masked;
        }
        for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
          const P g = masked_grad<T, kRelu>(px, pdy, rsc, rsh, i, j);
          acc_dy[j] += g;
          acc_dy_xmu[j] += g * (static_cast<P>(px[i]) - pmu[j]);
        });
      }
      double* out = &part[static_cast<size_t>(b * 2 * c)];
      fold_lanes(acc_dy, lane, c, out);
      fold_lanes(acc_dy_xmu, lane, c, out + c);
    }
  }
  merge_blocks(blk, part, 2, sums);
  const int64_t channels = blk.channels();
  for (int64_t ch = 0; ch < channels; ++ch) {
    sums[channels + ch] += sums[ch] * (static_cast<double>(static_cast<P>(mean[ch])) - mean[ch]);
  }
}

// y, dy_masked: as kMaskY above, or both nullptr.
template <class T>
void grad_sums_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu, const T* y,
                    T* dy_masked, const NhwcBlocks& blk, const double* mean, double* sums) {
  if (y != nullptr) {
    with_lane_width(blk, [&](auto L) {
      grad_sums_lanes<T, false, true, L.value>(x, dy, nullptr, y, dy_masked, blk, mean, sums);
    });
    return;
  }
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    grad_sums_lanes<T, relu_on.value, false, L.value>(x, dy, relu, nullptr, nullptr, blk, mean,
                                                      sums);
  });
}

// dx for channels-last x. Training (kTraining), from the sums over all pixels, as
// channel_input_grad: dx = k * (dy - mean_dy - (x - mean) * proj); eval: dx = k * dy (the
// statistics are constants). f: k, and for training mean_dy, proj and the mean, over the lanes;
// the per-channel factors are taken in double, the per-value arithmetic in P.
template <class T, bool kRelu, bool kTraining, int64_t L>
DDP_CPU_CLONES void input_grad_lanes(const T* x, const T* dy,
                                     const ScaleShiftLanes<compute_t<T>>* relu,
                                     const NhwcBlocks& blk, const std::vector<compute_t<T>>* f,
                                     T* dx) {
  using P = compute_t<T>;
  const int64_t lane = L ? L : blk.lane;
#pragma omp parallel for schedule(static) if (parallel(blk))
  for (int64_t b = 0; b < blk.count(); ++b) {
    const int64_t at = blk.group(b) * lane;
    const P* pk = f[0].data() + at;
    const P *pmdy = kTraining ? f[1].data() + at : nullptr,
            *pproj = kTraining ? f[2].data() + at : nullptr,
            *pmu = kTraining ? f[3].data() + at : nullptr;
    const P* rsc = kRelu ? relu->sc.data() + at : nullptr;
    const P* rsh = kRelu ? relu->sh.data() + at : nullptr;
    for (Segments sg(blk, b); sg.next();) {
      const T* px = x + sg.start;
      const T* pdy = dy + sg.start;
      T* q = dx + sg.start;
      for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
        const P g = masked_grad<T, kRelu>(px, pdy, rsc, rsh, i, j);
        if constexpr (kTraining) {
          const P xmu = static_cast<P>(px[i]) - pmu[j];
          q[i] = static_cast<T>(pk[j] * (g - pmdy[j] - xmu * pproj[j]));
        } else {
          q[i] = static_cast<T>(g * pk[j]);
        }
      });
    }
  }
}

template <class T>
void input_grad_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu,
                     const NhwcBlocks& blk, const BnShape& d, const double* mean,
                     const double* invstd, const compute_t<T>* weight, const double* sums,
                     double count, T* dx) {
  using P = compute_t<T>;
  const size_t c = static_cast<size_t>(d.c);
  std::vector<double> k(c), mean_dy(c), proj(c);
  for (size_t ch = 0; ch < c; ++ch) {
    const double g = weight ? static_cast<double>(weight[ch]) : 1.0, is = invstd[ch];
    k[ch] = g * is;
    mean_dy[ch] = sums[ch] / count;
    proj[ch] = sums[c + ch] * is * is / count;
  }
  const std::vector<P> f[4] = {over_lanes<P>(blk, k.data()), over_lanes<P>(blk, mean_dy.data()),
                               over_lanes<P>(blk, proj.data()), over_lanes<P>(blk, mean)};
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    input_grad_lanes<T, relu_on.value, true, L.value>(x, dy, relu, blk, f, dx);
  });
}

template <class T>
void eval_input_grad_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu,
                          const NhwcBlocks& blk, const BnShape& d, const double* invstd,
                          const compute_t<T>* weight, T* dx) {
  using P = compute_t<T>;
  std::vector<double> k(static_cast<size_t>(d.c));
  for (int64_t ch = 0; ch < d.c; ++ch) {
    k[static_cast<size_t>(ch)] = (weight ? static_cast<double>(weight[ch]) : 1.0) * invstd[ch];
  }
  const std::vector<P> f[1] = {over_lanes<P>(blk, k.data())};
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    input_grad_lanes<T, relu_on.value, false, L.value>(x, dy, relu, blk, f, dx);
  });
}

}  // namespace

// backward for channels-last x: the sums in one pass over x and dy, dx in a second. relu: for
// batch_norm_relu, whose mask is recomputed from x with the forward's weight and bias (bias: may
// be nullptr, as in the forward). y: for batch_norm_add_relu, its output, whose sign masks dy;
// the masked dy (relu's backward, the residual's gradient) goes to dy_masked, in the sums pass
// when there is one, and batch norm's own backward is the plain one from it.
template <class T>
void backward_nhwc(const T* x, const T* dy, bool relu, const compute_t<T>* bias, const T* y,
                   T* dy_masked, const BnShape& d, const double* mean, const double* invstd,
                   const compute_t<T>* weight, bool training, T* dx, compute_t<T>* dweight,
                   compute_t<T>* dbias, int64_t block) {
  using P = compute_t<T>;
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  std::unique_ptr<ScaleShiftLanes<P>> lanes;
  if (relu) lanes = std::make_unique<ScaleShiftLanes<P>>(blk, mean, invstd, weight, bias);
  const ScaleShiftLanes<P>* r = lanes.get();
  std::vector<double> sums(static_cast<size_t>(2 * d.c));
  if (dweight || dbias || (dx && training)) {
    grad_sums_nhwc(x, dy, r, y, dy_masked, blk, mean, sums.data());
  } else if (y != nullptr) {
#pragma omp parallel for schedule(static) if (parallel(blk))
    for (int64_t b = 0; b < blk.count(); ++b) {
      for (Segments sg(blk, b); sg.next();) {
        mask_by_output(dy + sg.start, y + sg.start, sg.n, dy_masked + sg.start);
      }
    }
  }
  if (y != nullptr) dy = dy_masked;
  for (int64_t c = 0; c < d.c; ++c) {
    if (dweight) dweight[c] = static_cast<P>(sums[static_cast<size_t>(d.c + c)] * invstd[c]);
    if (dbias) dbias[c] = static_cast<P>(sums[static_cast<size_t>(c)]);
  }
  if (!dx) return;
  if (training) {
    input_grad_nhwc(x, dy, r, blk, d, mean, invstd, weight, sums.data(),
                    static_cast<double>(d.count()), dx);
  } else {
    eval_input_grad_nhwc(x, dy, r, blk, d, invstd, weight, dx);
  }
}

// SyncBatchNorm's steps (nn/batchnorm_steps.cpp): backward_nhwc's two passes one at a time, with
// no relu, as the reference's grad_sums and input_grad.
template <class T>
void grad_sums_nhwc(const T* x, const T* dy, const BnShape& d, const double* mean, double* sums,
                    int64_t block) {
  grad_sums_nhwc<T>(x, dy, nullptr, nullptr, nullptr, nhwc_blocks<T>(d, block), mean, sums);
}

template <class T>
void input_grad_nhwc(const T* x, const T* dy, const BnShape& d, const double* mean,
                     const double* invstd, const T* weight, const double* sums, double count, T* dx,
                     int64_t block) {
  input_grad_nhwc<T>(x, dy, nullptr, nhwc_blocks<T>(d, block), d, mean, invstd, weight, sums, count,
                     dx);
}

#define DDP_BN_INSTANTIATE(T)                                                                     \
  template void backward_nhwc<T>(                                                                 \
      const T*, const T*, bool, const compute_t<T>*, const T*, T*, const BnShape&, const double*, \
      const double*, const compute_t<T>*, bool, T*, compute_t<T>*, compute_t<T>*, int64_t);
DDP_BN_INSTANTIATE(float)
DDP_BN_INSTANTIATE(double)
DDP_BN_INSTANTIATE(BFloat16)
#undef DDP_BN_INSTANTIATE

#define DDP_BN_INSTANTIATE_STEPS(T)                                                           \
  template void grad_sums_nhwc<T>(const T*, const T*, const BnShape&, const double*, double*, \
                                  int64_t);                                                   \
  template void input_grad_nhwc<T>(const T*, const T*, const BnShape&, const double*,         \
                                   const double*, const T*, const double*, double, T*, int64_t);
DDP_BN_INSTANTIATE_STEPS(float)
DDP_BN_INSTANTIATE_STEPS(double)
#undef DDP_BN_INSTANTIATE_STEPS

}  // namespace ddplab::nn::batchnorm_detail
