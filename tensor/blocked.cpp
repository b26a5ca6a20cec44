// Note [Blocked activations]
// oneDNN's fastest float32 convolutions on AVX-512 (Winograd's, and the direct ones it picks for
// 32 and 64 channels) read and write nChw16c: the channels cut into groups of 16, and within a
// group the 16 values of one pixel side by side ([N][C/16][H][W][16]). A convolution handed NHWC
// tensors pays a reorder on the way in and another on the way out, forward and backward; on
// resnet20 they took 15 ms of a 127 ms float32 step (docs/benchmarks.md, 2026-12-03, Intel Xeon
// with AMX). Strides cannot describe nChw16c, so the layout is a mark on the storage instead: the
// tensor keeps the shape [N, C, H, W] and channels-last strides, and its storage says "my bytes are
// blocked".
//
// Who writes and reads it: the oneDNN convolution writes y (and, backward, the input gradient)
// blocked where its kernel works in nChw16c, and reads blocked x and gy as they are; batch norm
// and its fused forms (nn/batchnorm_kernels.cpp), and elementwise ops whose operands are all
// blocked alike (a flat walk does not care about the order of the values), read and write
// blocked too. So in resnet20's 32- and 64-channel stages the activations and their gradients
// stay blocked from one convolution to the next.
//
// Everyone else is unaware, and safe: Tensor::raw_data() first rearranges the storage's bytes,
// in place, into the NHWC order the strides describe (Storage::ensure_strided) and drops the
// mark. Views share the storage and so the mark; whichever of them first asks for a pointer
// converts it for all. Only whole tensors are read blocked (blocked_block): a view of part of one
// converts it first. The mark lives with the memory, not with one TensorImpl, so a detached
// alias or a saved tensor never sees stale bytes.
//
// Below AVX-512 (AVX2) oneDNN's kernels work in nChw8c, the 8 channels of a 256-bit register,
// and the block is 8 (nn/onednn.cpp, activation_block). There even the 16-channel layers write
// no NHWC bytes, so resnet20 would stay NCHW after its stem and reorder every activation on the
// way into and out of every convolution: 82 reorders per step, 18% of oneDNN's time on an AVX2
// EPYC (DNNL_VERBOSE=1, 2026-12-06). Holding the convolutions' outputs channels-last and blocked
// in 8 removes all of them (docs/benchmarks.md).
#include "tensor/blocked.h"

#include <cstring>

#include "tensor/allocator.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

namespace ddplab {

namespace {

// Copies between NHWC and nChw<B>c, one pixel's group of B values at a time; `to_nhwc` picks the
// direction. Parallel over the (sample, group) planes, which are independent.
void rearrange(const BlockedDims& d, const char* src, char* dst, bool to_nhwc) {
  const int64_t groups = d.c / d.block, plane = d.h * d.w;
  const size_t e = d.element_size, run = static_cast<size_t>(d.block) * e;
#pragma omp parallel for if (d.n * d.c * plane > kParallelGrain)
  for (int64_t ng = 0; ng < d.n * groups; ++ng) {
    const int64_t n = ng / groups, g = ng % groups;
    for (int64_t p = 0; p < plane; ++p) {
      const size_t blocked = static_cast<size_t>(ng * plane + p) * run;
      const size_t nhwc = static_cast<size_t>((n * plane + p) * d.c + g * d.block) * e;
      if (to_nhwc) {
        std::memcpy(dst + nhwc, src + blocked, run);
      } else {
        std::memcpy(dst + blocked, src + nhwc, run);
      }
    }
  }
}

size_t total_bytes(const BlockedDims& d) {
  return static_cast<size_t>(d.n * d.c * d.h * d.w) * d.element_size;
}

}  // namespace

void blocked_to_nhwc_in_place(const BlockedDims& dims, void* data) {
  const size_t nbytes = total_bytes(dims);
  DataPtr copy = cpu_allocator().allocate(nbytes);
  std::memcpy(copy.get(), data, nbytes);
  rearrange(dims, static_cast<const char*>(copy.get()), static_cast<char*>(data), true);
}

namespace ops {

int64_t blocked_block(const Tensor& t) {
  if (!t.defined()) return 0;
  const BlockedDims* d = t.storage().blocked();
  if (d == nullptr || t.dim() != 4 || t.storage_offset() != 0) return 0;
  if (t.shape() != Shape{d->n, d->c, d->h, d->w} || element_size(t.dtype()) != d->element_size) {
    return 0;
  }
  return is_contiguous(t, MemoryFormat::ChannelsLast) ? d->block : 0;
}

Tensor empty_blocked(const Shape& shape, TensorOptions opts, int64_t block) {
  DDP_CHECK(shape.size() == 4 && block > 0 && shape[1] % block == 0,
            "empty_blocked: need [N, C, H, W] with C a multiple of " << block << ", got "
                                                                     << shape_str(shape));
  Tensor t = empty(shape, opts, MemoryFormat::ChannelsLast);
  t.impl().storage.mark_blocked(
      {shape[0], shape[1], shape[2], shape[3], block, element_size(opts.dtype)});
  return t;
}

Tensor as_stored(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage().as_stored();
  impl->offset = t.storage_offset();
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Tensor in_layout(const Tensor& t, int64_t block) {
  return block != 0 ? as_stored(t) : t;
}

Tensor empty_in_layout(const Shape& shape, TensorOptions opts, int64_t block, MemoryFormat format) {
  return block != 0 ? empty_blocked(shape, opts, block) : empty(shape, opts, format);
}

Tensor to_blocked(const Tensor& t, int64_t block) {
  if (blocked_block(t) == block) return t;
  Tensor src = contiguous(t, MemoryFormat::ChannelsLast);
  Tensor out = empty_blocked(t.shape(), t.options(), block);
  rearrange(*out.storage().blocked(), static_cast<const char*>(src.raw_data()),
            static_cast<char*>(as_stored(out).raw_data()), false);
  return out;
}

}  // namespace ops
}  // namespace ddplab
