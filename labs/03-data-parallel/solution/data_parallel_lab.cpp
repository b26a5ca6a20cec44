// Lab 3, the reference solution (course staff). The library's versions: the per-parameter loop is
// ddp/naive_allreduce_grads.cpp, the bucket rule ddp/bucket_layout.cpp, and the
// bucketed averaging, overlapped with backward, ddp/reducer.cpp.
#include "data_parallel_lab.h"

#include <memory>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace lab3 {

using namespace ddplab;

namespace {

// The parameters that take part: every one that requires grad, in registration order. Each must
// hold a gradient, or the ranks would disagree on what to all-reduce.
std::vector<Tensor> trainable(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad()) continue;
    DDP_CHECK(params[i].grad().defined(),
              "parameter " << i << " has no gradient: call loss.backward() first");
    out.push_back(params[i]);
  }
  return out;
}

}  // namespace

void allreduce_gradients_naive(const std::vector<Tensor>& params, ProcessGroup& pg) {
  for (const Tensor& p : trainable(params)) {
    Tensor g = p.grad();
    ops::mul_(g, 1.0 / pg.size());  // divide first, then sum: the partial sums stay small
    pg.all_reduce(g, distributed::ReduceOp::Sum)->wait();
  }
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& nbytes,
                                                size_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  size_t filled = 0;  // bytes in buckets.back()
  for (size_t k = nbytes.size(); k-- > 0;) {
    if (buckets.empty() || filled + nbytes[k] > cap_bytes) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += nbytes[k];
  }
  return buckets;
}

void allreduce_gradients_bucketed(const std::vector<Tensor>& params, ProcessGroup& pg,
                                  size_t cap_bytes) {
  const std::vector<Tensor> ps = trainable(params);
  std::vector<size_t> nbytes;
  nbytes.reserve(ps.size());
  for (const Tensor& p : ps) nbytes.push_back(p.nbytes());
  const std::vector<std::vector<size_t>> buckets = assign_buckets(nbytes, cap_bytes);

  // Issue every bucket's all-reduce before waiting for any: while the group sums bucket 0, this
  // thread is already flattening bucket 1.
  std::vector<Tensor> flat;
  std::vector<std::shared_ptr<distributed::Work>> work;
  for (const auto& bucket : buckets) {
    std::vector<Tensor> grads;
    grads.reserve(bucket.size());
    for (size_t i : bucket) grads.push_back(ops::reshape(ps[i].grad(), {-1}));
    flat.push_back(ops::cat(grads));  // a new contiguous buffer, the grads back to back
    ops::mul_(flat.back(), 1.0 / pg.size());
    work.push_back(pg.all_reduce(flat.back(), distributed::ReduceOp::Sum));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    work[b]->wait();
    int64_t offset = 0;
    for (size_t i : buckets[b]) {
      const Tensor g = ps[i].grad();
      ops::copy_(g, ops::view(ops::narrow(flat[b], 0, offset, g.numel()), g.shape()));
      offset += g.numel();
    }
  }
}

}  // namespace lab3
