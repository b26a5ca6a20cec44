// The CPU's mixed-precision GEMM: bfloat16 operands, float32 result and accumulation, through
// oneDNN's matmul primitive (autocast's linear layers run on it: Note [Autocast] in
// nn/autocast.h).
#pragma once

#include "tensor/backend.h"

namespace ddplab::cpu {

// C (float32) = alpha * op(A) @ op(B) + beta * C for one matrix (g.batch is the caller's loop),
// with A and B bfloat16, laid out as GemmArgs describes. The primitive for each distinct
// (shape, layout, alpha, beta) is built on first use and cached: building one JIT-compiles a
// kernel, which takes far longer than running it on a layer's batch.
void gemm_bf16_f32(const GemmArgs& g, const void* a, const void* b, float* c);

}  // namespace ddplab::cpu
