// Activations in oneDNN's blocked layout between layers (Note [Blocked activations] in
// tensor/blocked.cpp): how a CPU tensor's bytes can be nChw16c (nChw8c on AVX2) while its strides
// say NHWC, and the few calls the layout-aware kernels use.
#pragma once

#include <cstdint>

#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"

namespace ddplab {

namespace ops {

// B when t is a whole tensor whose bytes are blocked nChw<B>c (4-D, channels-last strides, the
// entire storage), else 0. Kernels that read the blocked layout check this, then read as_stored(t).
int64_t blocked_block(const Tensor& t);
// A CPU tensor of `shape` [N, C, H, W] (C a multiple of `block`) whose bytes are to be written in
// the blocked layout; to everyone else it is channels-last.
Tensor empty_blocked(const Shape& shape, TensorOptions opts, int64_t block);
// t over the same bytes as they lie: no rearranging on raw_data(), and no autograd history.
Tensor as_stored(const Tensor& t);
// A blocked copy of a channels-last (or blocked) t: t itself when already blocked in `block`.
Tensor to_blocked(const Tensor& t, int64_t block);

// The two choices every layout-aware kernel makes, given block = blocked_block(x) of its input:
// what it reads and writes through (as_stored(t) when block != 0, else t itself, whose raw_data()
// rearranges any marked storage first), and what it allocates (blocked in `block`, else in
// `format`).
Tensor in_layout(const Tensor& t, int64_t block);
Tensor empty_in_layout(const Shape& shape, TensorOptions opts, int64_t block, MemoryFormat format);

}  // namespace ops
}  // namespace ddplab
