// Factories and random tensors.
#include <cmath>
#include <cstring>
#include <numeric>

#include "tensor/backend.h"
#include "tensor/ops.h"

namespace ddplab::ops {

Tensor empty(const Shape& shape, TensorOptions opts) {
  for (int64_t s : shape) DDP_CHECK(s >= 0, "empty: negative size in shape " << shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      Storage(static_cast<size_t>(shape_numel(shape)) * element_size(opts.dtype), opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  return Tensor(std::move(impl));
}

// Note [Channels last]
// oneDNN's fastest CPU convolutions for narrow layers (8-16 channels) read and write NHWC: each
// pixel's channels side by side. Handing them NCHW tensors costs a reorder (a full read and write
// of the tensor) on the way in and another on the way out, for every convolution, forward and
// backward; on resnet20 that was a tenth of the step. So a CPU convolution whose kernel works in
// NHWC returns its output in NHWC, as a tensor of the usual shape [N, C, H, W] whose strides say
// where each element lies, and so does one whose input is NHWC (the output follows the input, as
// in PyTorch); the ops that follow keep that layout: elementwise ops allocate their result in
// their input's format (suggest_memory_format) and walk both as one flat array, batch norm has
// NHWC loops, and the next convolution reads the NHWC array as it is. Anything that needs
// row-major data calls contiguous() and gets a copy (on the CPU a tiled transpose); nothing else
// changes for the user, as with PyTorch's channels_last.
bool is_contiguous(const Tensor& t, MemoryFormat format) {
  if (format == MemoryFormat::Contiguous) return t.is_contiguous();
  if (t.dim() != 4) return false;
  // Dims in NHWC order (N, H, W, C), innermost last; size-1 dims may have any stride.
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {
    const int64_t size = t.shape()[static_cast<size_t>(d)];
    if (size == 1) continue;
    if (t.strides()[static_cast<size_t>(d)] != expected) return false;
    expected *= size;
  }
  return true;
}

Tensor empty(const Shape& shape, TensorOptions opts, MemoryFormat format) {
  if (format == MemoryFormat::Contiguous) return empty(shape, opts);
  DDP_CHECK(shape.size() == 4,
            "empty: channels-last needs a 4-D shape [N, C, H, W], got " << shape_str(shape));
  return permute(empty({shape[0], shape[2], shape[3], shape[1]}, opts), {0, 3, 1, 2});
}

MemoryFormat suggest_memory_format(const Tensor& t) {
  return !t.is_contiguous() && is_contiguous(t, MemoryFormat::ChannelsLast)
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  Tensor t = empty(shape, opts);
  fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) {
  return full(shape, 0, opts);
}
Tensor ones(const Shape& shape, TensorOptions opts) {
  return full(shape, 1, opts);
}
Tensor scalar_tensor(double value, TensorOptions opts) {
  return full({}, value, opts);
}
Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), t.options());
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.options());
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), t.options());
}
Tensor full_like(const Tensor& t, double value) {
  return full(t.shape(), value, t.options());
}

Tensor arange(double start, double end, double step, TensorOptions opts) {
  DDP_CHECK(step != 0, "arange: step must be non-zero");
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  if (n < 0) n = 0;
  Tensor host = empty({n}, kFloat64);
  double* p = host.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  return to(to(host, opts.dtype), opts.device);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  DDP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
            "from_vector: " << values.size() << " values do not fill shape " << shape_str(shape));
  Tensor host = empty(shape, dtype_of<T>::value);
  if (!values.empty())
    std::memcpy(host.raw_data(), static_cast<const void*>(values.data()), host.nbytes());
  return to(to(host, opts.dtype), opts.device);
}
template <>
Tensor from_vector(const std::vector<bool>& values, const Shape& shape, TensorOptions opts) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return to(to(from_vector(bytes, shape, kUInt8), kBool), opts.device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, TensorOptions);

Tensor from_blob(void* data, const Shape& shape, TensorOptions opts) {
  auto impl = std::make_shared<TensorImpl>();
  size_t nbytes = static_cast<size_t>(shape_numel(shape)) * element_size(opts.dtype);
  impl->storage = Storage(DataPtr(data, [](void*) {}), nbytes, opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  return Tensor(std::move(impl));
}

// --- random -------------------------------------------------------------------------------------
namespace {
void fill_random(const Tensor& t, RandomKind kind, double a, double b, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = g.consume(random_blocks(kind, static_cast<uint64_t>(t.numel())));
  if (t.is_contiguous()) {
    backend_for(t.device()).random(kind, t, a, b, g.seed(), offset);
  } else {  // generate in order, then scatter into the strided view
    Tensor tmp = empty(t.shape(), t.options());
    backend_for(t.device()).random(kind, tmp, a, b, g.seed(), offset);
    copy_(t, tmp);
  }
}
}  // namespace

void uniform_(const Tensor& t, double lo, double hi, Generator* gen) {
  DDP_CHECK(is_floating(t.dtype()), "uniform_: expected a floating tensor, got " << t.dtype());
  fill_random(t, RandomKind::Uniform, lo, hi, gen);
}
void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  DDP_CHECK(is_floating(t.dtype()), "normal_: expected a floating tensor, got " << t.dtype());
  DDP_CHECK(std >= 0, "normal_: std must be >= 0, got " << std);
  fill_random(t, RandomKind::Normal, mean, std, gen);
}
void bernoulli_(const Tensor& t, double p, Generator* gen) {
  DDP_CHECK(p >= 0 && p <= 1, "bernoulli_: p must be in [0, 1], got " << p);
  if (t.dtype() == kBool) {
    Tensor tmp = empty(t.shape(), {kUInt8, t.device()});
    fill_random(tmp, RandomKind::Bernoulli, p, 0, gen);
    copy_(t, tmp);
    return;
  }
  fill_random(t, RandomKind::Bernoulli, p, 0, gen);
}
Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts);
  uniform_(t, 0, 1, gen);
  return t;
}
Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts);
  normal_(t, 0, 1, gen);
  return t;
}
Tensor randint(int64_t lo, int64_t hi, const Shape& shape, Generator* gen, TensorOptions opts) {
  DDP_CHECK(hi > lo, "randint: empty range [" << lo << ", " << hi << ")");
  Tensor t = empty(shape, opts);
  fill_random(t, RandomKind::UniformInt, static_cast<double>(lo), static_cast<double>(hi), gen);
  return t;
}

// Fisher-Yates on the host, each swap index from the counter-based stream: the permutation depends
// only on (seed, offset), never on threads or devices.
Tensor randperm(int64_t n, Generator* gen, TensorOptions opts) {
  DDP_CHECK(n >= 0, "randperm: n must be >= 0, got " << n);
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = g.consume(static_cast<uint64_t>(n));
  Tensor host = empty({n}, kInt64);
  int64_t* p = host.data_ptr<int64_t>();
  std::iota(p, p + n, int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    Philox4x32 r = philox_block(g.seed(), offset, static_cast<uint64_t>(i));
    uint64_t v = (static_cast<uint64_t>(r.c[0]) << 32) | r.c[1];
    std::swap(p[i], p[static_cast<int64_t>(v % static_cast<uint64_t>(i + 1))]);
  }
  return to(to(host, opts.dtype), opts.device);
}

}  // namespace ddplab::ops
