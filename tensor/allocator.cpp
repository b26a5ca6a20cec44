// The caching host allocator: a BlockPool (tensor/block_pool.h) over aligned malloc and free.
//
// Sizes are rounded up to 512 B steps under 1 MiB and 1 MiB steps above, so that the activations
// of one training step reuse the blocks of the previous step exactly.
#include "tensor/allocator.h"

#include <cstdlib>

#include "tensor/block_pool.h"

namespace ddplab {

namespace {

constexpr size_t kAlignment = 64;  // a cache line; also what AVX-512 loads like

class CachingHostAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override { return pool_.allocate(nbytes); }
  void empty_cache() override { pool_.empty_cache(); }
  AllocatorStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }

 private:
  // Rounded sizes are multiples of 512, so aligned_alloc's rule (size a multiple of the
  // alignment) holds.
  BlockPool pool_{kCPU,
                  size_t{1} << 20,
                  {[](size_t n) { return std::aligned_alloc(kAlignment, n); },
                   [](void* p) { std::free(p); }, nullptr, nullptr, nullptr}};
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors held in static objects may be freed after main() returns.
  static auto* a = new CachingHostAllocator();
  return *a;
}

#if !defined(DDP_CUDA)
DataPtr allocate_pinned(size_t nbytes) {
  return cpu_allocator().allocate(nbytes);
}
#endif

}  // namespace ddplab
