// Lab 3: data parallelism by hand. The three functions the student writes (starter/, graded by
// grader/grader.cpp against one process on the global batch, against the library's bucket rule and
// against DistributedDataParallel); solution/ is the course staff's version. Handout: README.md.
//
// All three are called on every rank, after loss.backward() and before optimizer.step(), with
// `params` = the model's parameters in registration order (module.parameters(), the same list on
// every rank). Parameters that do not require grad (frozen) take part in nothing; every other one
// holds its local .grad (this rank's mini-batch) on entry and the average over all ranks on exit.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace lab3 {

using ddplab::Tensor;
using ddplab::distributed::ProcessGroup;

// Part 1. The simplest correct data parallelism: for each trainable parameter, in registration
// order, one all-reduce of its gradient, divided by the number of ranks so that the result is
// the average (Note [Averaging] in ddp/reducer.cpp says why the average, and why dividing
// before the sum). One collective per trainable parameter, nothing else.
void allreduce_gradients_naive(const std::vector<Tensor>& params, ProcessGroup& pg);

// Part 2. DDP's bucket rule, as a pure function of the parameters' sizes in bytes (indexed in
// registration order): walk the parameters in REVERSE registration order (the order backward
// produces their gradients) and put each into the open bucket while the bucket then holds at most
// `cap_bytes`; otherwise it opens a new bucket. A parameter larger than the cap gets a bucket of
// its own (a bucket is never empty). Returns, per bucket, the parameter indices in the order they
// were added. No parameters: no buckets.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& nbytes,
                                                size_t cap_bytes);

// Part 3. Bucketed averaging: the trainable parameters (in registration order, frozen ones left
// out) are grouped by assign_buckets(their nbytes, cap_bytes); for each bucket, in bucket order,
// copy its gradients back to back into one flat buffer, divide it by the number of ranks, and
// all-reduce it (sum) with ONE collective; then copy each slice back into its parameter's .grad.
// One collective per bucket, nothing else.
void allreduce_gradients_bucketed(const std::vector<Tensor>& params, ProcessGroup& pg,
                                  size_t cap_bytes);

}  // namespace lab3
