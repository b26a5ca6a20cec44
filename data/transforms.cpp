// Image transforms: the fused per-sample pipeline and the step-by-step tensor functions.
#include "data/transforms.h"

#include <algorithm>
#include <cstring>

#include "tensor/ops.h"

namespace ddplab::data {

NormStats cifar10_stats() {
  return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
}
NormStats cifar100_stats() {
  return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
}
NormStats mnist_stats() {
  return {{0.1307f}, {0.3081f}};
}
NormStats fashion_mnist_stats() {
  return {{0.2860f}, {0.3530f}};
}

Transform& Transform::random_crop(int64_t size, int64_t padding) {
  return random_crop(size, size, padding);
}

Transform& Transform::random_crop(int64_t height, int64_t width, int64_t padding) {
  DDP_CHECK(height >= 0 && width >= 0 && padding >= 0,
            "random_crop: size " << height << "x" << width << " and padding " << padding
                                 << " must be non-negative");
  DDP_CHECK((height == 0) == (width == 0), "random_crop: give both height and width, or neither");
  crop_h_ = height;
  crop_w_ = width;
  padding_ = padding;
  return *this;
}

Transform& Transform::random_horizontal_flip(float p) {
  DDP_CHECK(p >= 0 && p <= 1, "random_horizontal_flip: p = " << p << " is not in [0, 1]");
  flip_p_ = p;
  return *this;
}

Transform& Transform::normalize(std::vector<float> mean, std::vector<float> std) {
  DDP_CHECK(!mean.empty() && mean.size() == std.size(),
            "normalize: mean has " << mean.size() << " values and std " << std.size()
                                   << "; give one per channel");
  for (float s : std) DDP_CHECK(s > 0, "normalize: std " << s << " must be positive");
  mean_ = std::move(mean);
  std_ = std::move(std);
  build_table();
  return *this;
}

void Transform::build_table() {
  const size_t channels = mean_.empty() ? 1 : mean_.size();
  table_.resize(channels * 256);
  for (size_t k = 0; k < channels; ++k)
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v) / 255.0f;
      table_[k * 256 + v] = mean_.empty() ? x : (x - mean_[k]) / std_[k];
    }
}

Transform Transform::cifar_train(const NormStats& s) {
  Transform t;
  t.random_crop(32, 4).random_horizontal_flip(0.5f).normalize(s);
  return t;
}

Transform Transform::eval(const NormStats& s) {
  Transform t;
  t.normalize(s);
  return t;
}

ImageShape Transform::output_shape(const ImageShape& in) const {
  ImageShape out = in;
  if (crop_h_ > 0) {
    DDP_CHECK(crop_h_ <= in.height + 2 * padding_ && crop_w_ <= in.width + 2 * padding_,
              "random_crop: a " << crop_h_ << "x" << crop_w_ << " crop does not fit a " << in.height
                                << "x" << in.width << " image padded by " << padding_);
    out.height = crop_h_;
    out.width = crop_w_;
  }
  if (has_normalize()) {
    DDP_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == in.channels,
              "normalize: " << mean_.size() << " mean/std values for an image with " << in.channels
                            << " channels");
  }
  return out;
}

TransformDraw Transform::draw(const ImageShape& in, const SampleRng& rng) const {
  TransformDraw d;
  if (has_crop()) {
    ImageShape out = output_shape(in);
    // Positions 0 .. (padded - crop) inclusive, as torchvision's randint(0, h - th + 1).
    d.top = rng.below(0, static_cast<uint32_t>(in.height + 2 * padding_ - out.height + 1));
    d.left = rng.below(1, static_cast<uint32_t>(in.width + 2 * padding_ - out.width + 1));
  }
  if (has_flip()) d.flip = rng.uniform(2) < flip_p_;
  return d;
}

void Transform::apply(const uint8_t* src, const ImageShape& in, Layout layout, float* dst,
                      const SampleRng& rng) const {
  const ImageShape out = output_shape(in);
  const TransformDraw d = draw(in, rng);
  // Source strides of (channel, row, column) for either layout.
  const int64_t sc = layout == Layout::kCHW ? in.height * in.width : 1;
  const int64_t sy = layout == Layout::kCHW ? in.width : in.width * in.channels;
  const int64_t sx = layout == Layout::kCHW ? 1 : in.channels;
  // Output column x reads source column (flip ? W-1-x : x) + left - padding.
  const int64_t x0 = d.left - padding_;
  for (int64_t c = 0; c < out.channels; ++c) {
    // One table lookup per pixel replaces divide, subtract, divide. A padded pixel is a zero
    // byte before normalization (torchvision pads the raw image), so it becomes table[0].
    const float* table = table_.data() + (table_.size() == 256 ? 0 : c * 256);
    const float zero = table[0];
    const uint8_t* plane = src + c * sc;
    for (int64_t y = 0; y < out.height; ++y) {
      float* row = dst + (c * out.height + y) * out.width;
      const int64_t iy = y + d.top - padding_;
      if (iy < 0 || iy >= in.height) {  // a padding row
        std::fill(row, row + out.width, zero);
        continue;
      }
      const uint8_t* srow = plane + iy * sy;
      for (int64_t x = 0; x < out.width; ++x) {
        const int64_t ix = (d.flip ? out.width - 1 - x : x) + x0;
        row[x] = (ix < 0 || ix >= in.width) ? zero : table[srow[ix * sx]];
      }
    }
  }
}

// --- the step-by-step form -------------------------------------------------------------------

namespace {

void check_float_chw(const Tensor& t, const char* what) {
  DDP_CHECK(t.dim() == 3 && t.dtype() == kFloat32 && t.is_contiguous() && t.device().is_cpu(),
            what << ": expected a contiguous float32 [C, H, W] CPU tensor, got "
                 << dtype_name(t.dtype()) << " " << shape_str(t.shape()));
}

}  // namespace

Tensor to_tensor(const Tensor& image, Layout layout) {
  DDP_CHECK(image.dtype() == kUInt8 && image.is_contiguous() && image.device().is_cpu() &&
                (image.dim() == 2 || image.dim() == 3),
            "to_tensor: expected a contiguous uint8 [H, W], [H, W, C] or [C, H, W] CPU tensor, got "
                << dtype_name(image.dtype()) << " " << shape_str(image.shape()));
  ImageShape s;
  if (image.dim() == 2) {
    s = {1, image.size(0), image.size(1)};
    layout = Layout::kCHW;  // one channel: both layouts are the same bytes
  } else if (layout == Layout::kHWC) {
    s = {image.size(2), image.size(0), image.size(1)};
  } else {
    s = {image.size(0), image.size(1), image.size(2)};
  }
  Tensor out = ops::empty({s.channels, s.height, s.width}, kFloat32);
  const uint8_t* src = image.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t y = 0; y < s.height; ++y)
      for (int64_t x = 0; x < s.width; ++x) {
        int64_t i = layout == Layout::kCHW ? (c * s.height + y) * s.width + x
                                           : (y * s.width + x) * s.channels + c;
        dst[(c * s.height + y) * s.width + x] = static_cast<float>(src[i]) / 255.0f;
      }
  return out;
}

Tensor pad(const Tensor& image, int64_t padding) {
  check_float_chw(image, "pad");
  const int64_t C = image.size(0), H = image.size(1), W = image.size(2);
  const int64_t PH = H + 2 * padding, PW = W + 2 * padding;
  Tensor out = ops::empty({C, PH, PW}, kFloat32);
  float* dst = out.data_ptr<float>();
  const float* src = image.data_ptr<float>();
  std::fill(dst, dst + C * PH * PW, 0.0f);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      std::memcpy(dst + (c * PH + y + padding) * PW + padding, src + (c * H + y) * W,
                  sizeof(float) * W);
  return out;
}

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_float_chw(image, "crop");
  const int64_t C = image.size(0), H = image.size(1), W = image.size(2);
  DDP_CHECK(top >= 0 && left >= 0 && top + height <= H && left + width <= W,
            "crop: window (" << top << ", " << left << ") " << height << "x" << width
                             << " is outside the " << H << "x" << W << " image");
  Tensor out = ops::empty({C, height, width}, kFloat32);
  float* dst = out.data_ptr<float>();
  const float* src = image.data_ptr<float>();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < height; ++y)
      std::memcpy(dst + (c * height + y) * width, src + (c * H + top + y) * W + left,
                  sizeof(float) * width);
  return out;
}

Tensor hflip(const Tensor& image) {
  check_float_chw(image, "hflip");
  const int64_t C = image.size(0), H = image.size(1), W = image.size(2);
  Tensor out = ops::empty({C, H, W}, kFloat32);
  float* dst = out.data_ptr<float>();
  const float* src = image.data_ptr<float>();
  for (int64_t r = 0; r < C * H; ++r)
    for (int64_t x = 0; x < W; ++x) dst[r * W + x] = src[r * W + (W - 1 - x)];
  return out;
}

Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& std) {
  check_float_chw(image, "normalize");
  const int64_t C = image.size(0), HW = image.size(1) * image.size(2);
  DDP_CHECK(
      mean.size() == std.size() && (mean.size() == 1 || static_cast<int64_t>(mean.size()) == C),
      "normalize: " << mean.size() << " means and " << std.size() << " stds for " << C
                    << " channels");
  Tensor out = ops::empty(image.shape(), kFloat32);
  float* dst = out.data_ptr<float>();
  const float* src = image.data_ptr<float>();
  for (int64_t c = 0; c < C; ++c) {
    size_t k = mean.size() == 1 ? 0 : static_cast<size_t>(c);
    for (int64_t i = 0; i < HW; ++i) dst[c * HW + i] = (src[c * HW + i] - mean[k]) / std[k];
  }
  return out;
}

}  // namespace ddplab::data
