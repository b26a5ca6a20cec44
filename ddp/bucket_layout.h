// Bucket assignment: which parameters share a bucket, as a pure function of their sizes, dtypes
// and the order their gradients are expected in. No tensors, no process group: the Reducer
// (ddp/reducer.cpp) calls it at construction (reverse registration order) and again when
// it rebuilds its buckets in the order gradients actually arrived, and tests call it directly.
#pragma once

#include <cstddef>
#include <vector>

#include "tensor/dtype.h"

namespace ddplab::distributed {

// Fills buckets greedily in `order` (parameter indices, the first expected-ready first): bucket 0
// takes parameters until the next one would push it past `first_cap_bytes`, every later bucket
// until `cap_bytes`. A parameter larger than the cap gets a bucket of its own (a bucket is never
// empty), and a change of dtype starts a new bucket (a bucket is one flat buffer of one dtype).
// Returns, per bucket, the parameter indices in slot order. `nbytes` and `dtypes` are indexed by
// parameter; every index in `order` must be valid, and `order` may list a subset.
std::vector<std::vector<size_t>> compute_bucket_layout(const std::vector<size_t>& nbytes,
                                                       const std::vector<DType>& dtypes,
                                                       const std::vector<size_t>& order,
                                                       size_t first_cap_bytes, size_t cap_bytes);

}  // namespace ddplab::distributed
