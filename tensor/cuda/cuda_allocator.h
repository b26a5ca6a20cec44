// The caching CUDA allocator and the pinned host allocator.
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronizes the whole device), so, like
// PyTorch's CUDACachingAllocator, freed device blocks stay in a per-device cache and are handed out
// again (a larger cached block is split; tensor/block_pool.h). A block is reused only on the
// stream it was allocated on: work queued on that stream runs in order, so the next user cannot
// overtake the previous one; another stream could. A tensor that another stream also uses is
// announced with `gpu::record_stream`: its block then waits for that stream's work when freed.
// `empty_cache()` returns wholly free cached segments to the driver.
//
// Pinned host memory (cudaHostAlloc) makes host<->device copies asynchronous. A freed pinned block
// may still be read by a copy in flight, so it is reused only once the events recorded for those
// copies (`record_pinned_use`) have completed.
#pragma once

#include "tensor/allocator.h"
#include "tensor/cuda/cuda_runtime.h"

namespace ddplab {

class Tensor;

// The caching allocator of cuda:`device` (an Error naming the device when it does not exist).
// tensor/allocator.cpp's allocator_for(Device) calls it for CUDA devices.
Allocator& cuda_allocator(int device);

namespace gpu {
// True when `p` points into a block of pinned host memory from allocate_pinned (or any other
// page-locked memory the CUDA runtime knows of).
bool is_pinned(const void* p);
// Tells the pinned allocator that an asynchronous copy on `s` reads or writes the pinned block
// holding `p`, so the block is not handed out again before that copy has finished.
void record_pinned_use(const void* p, const Stream& s);
// PyTorch's Tensor.record_stream: work queued on `s` (not the stream `t` was allocated on) uses
// `t`, so when its memory is freed, it is handed out again only after that work has finished.
// The stream must stay alive until then.
void record_stream(const Tensor& t, const Stream& s);
}  // namespace gpu

}  // namespace ddplab
