// allreduce_hook and the 16-bit compression hooks.
#include "ddp/comm_hooks/default_hooks.h"

#include "tensor/ops.h"

namespace ddplab::distributed {

FuturePtr allreduce_hook(CommHookState& state, GradBucket& bucket) {
  const Tensor& buffer = bucket.buffer();
  ops::mul_(buffer, 1.0 / state.process_group->size());  // divide before the sum
  return Future::from_work(state.all_reduce(buffer), buffer);
}

namespace {

FuturePtr compress_hook(CommHookState& state, GradBucket& bucket, DType wire_dtype) {
  const Tensor& buffer = bucket.buffer();
  if (buffer.dtype() == wire_dtype) return allreduce_hook(state, bucket);  // nothing to cast
  // Divide in the gradients' own precision, then round once to 16 bits.
  ops::mul_(buffer, 1.0 / state.process_group->size());
  Tensor compressed = ops::to(buffer, wire_dtype);
  return Future::from_work(state.all_reduce(compressed), compressed)
      ->then([buffer](const Tensor& sum) {
        ops::copy_(buffer, sum);  // cast back into the bucket
        return buffer;
      });
}

}  // namespace

FuturePtr fp16_compress_hook(CommHookState& state, GradBucket& bucket) {
  return compress_hook(state, bucket, kFloat16);
}

FuturePtr bf16_compress_hook(CommHookState& state, GradBucket& bucket) {
  return compress_hook(state, bucket, kBFloat16);
}

}  // namespace ddplab::distributed
