// Bucket assignment (see bucket_layout.h and Note [Bucket order] in reducer.cpp).
#include "ddp/bucket_layout.h"

#include "tensor/error.h"

namespace ddplab::distributed {

std::vector<std::vector<size_t>> compute_bucket_layout(const std::vector<size_t>& nbytes,
                                                       const std::vector<DType>& dtypes,
                                                       const std::vector<size_t>& order,
                                                       size_t first_cap_bytes, size_t cap_bytes) {
  DDP_CHECK(
      nbytes.size() == dtypes.size(),
      "compute_bucket_layout: " << nbytes.size() << " sizes but " << dtypes.size() << " dtypes");
  std::vector<std::vector<size_t>> buckets;
  size_t filled = 0;  // bytes in the open bucket, buckets.back()
  for (size_t i : order) {
    DDP_CHECK(i < nbytes.size(), "compute_bucket_layout: parameter index "
                                     << i << " out of range (" << nbytes.size() << " parameters)");
    const size_t open_cap = buckets.size() == 1 ? first_cap_bytes : cap_bytes;  // bucket 0 is small
    const bool start_new = buckets.empty() || dtypes[i] != dtypes[buckets.back().front()] ||
                           filled + nbytes[i] > open_cap;
    if (start_new) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += nbytes[i];
  }
  return buckets;
}

}  // namespace ddplab::distributed
