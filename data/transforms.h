// Image transforms: to-tensor, random crop with padding, random horizontal flip, normalize.
//
// Two forms live here, and the tests check they agree:
//  - `Transform`, the fast path the DataLoader uses: one fused pass that reads the raw uint8
//    image and writes the final float32 [C, H, W] sample straight into its slot of the batch
//    buffer (no intermediate tensors, nothing allocated per sample).
//  - free functions on Tensors (`to_tensor`, `pad`, `crop`, `hflip`, `normalize`), the
//    step-by-step form, as torchvision composes them. Readable, and the tests' oracle.
//
// The pipeline order is fixed to torchvision's CIFAR recipe whatever order the builder methods
// are called in: ToTensor -> RandomCrop(size, padding) -> RandomHorizontalFlip -> Normalize.
// As in torchvision, padding is applied to the raw image (zeros), so a padded pixel becomes
// (0 - mean) / std after normalization.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sample_rng.h"
#include "tensor/tensor.h"

namespace ddplab::data {

// How a raw uint8 image is laid out in memory.
enum class Layout {
  kCHW,  // planar: all of channel 0, then channel 1, ... (CIFAR binary files; gray images)
  kHWC,  // interleaved: R G B R G B ... (decoded PNG/JPEG)
};

struct ImageShape {
  int64_t channels = 0, height = 0, width = 0;
  int64_t numel() const { return channels * height * width; }
  bool operator==(const ImageShape& o) const {
    return channels == o.channels && height == o.height && width == o.width;
  }
};

// Per-channel normalization constants of the standard datasets (as used by torchvision recipes).
struct NormStats {
  std::vector<float> mean, std;
};
NormStats cifar10_stats();        // mean 0.4914 0.4822 0.4465, std 0.2470 0.2435 0.2616
NormStats cifar100_stats();       // mean 0.5071 0.4865 0.4409, std 0.2673 0.2564 0.2762
NormStats mnist_stats();          // mean 0.1307, std 0.3081
NormStats fashion_mnist_stats();  // mean 0.2860, std 0.3530

// The random choices a Transform makes for one sample (exposed so tests can predict them).
struct TransformDraw {
  int64_t top = 0, left = 0;  // crop origin in the padded image
  bool flip = false;
};

class Transform {
 public:
  Transform() { build_table(); }
  // RandomCrop(size, padding): pad `padding` zeros on every side, then take a size x size window
  // at a uniformly random position. size 0 keeps the input size (padding then only shifts).
  Transform& random_crop(int64_t size, int64_t padding = 0);
  Transform& random_crop(int64_t height, int64_t width, int64_t padding);
  // RandomHorizontalFlip(p): mirror left-right with probability p.
  Transform& random_horizontal_flip(float p = 0.5f);
  // Normalize(mean, std), one value per channel (or one value for every channel).
  Transform& normalize(std::vector<float> mean, std::vector<float> std);
  Transform& normalize(const NormStats& s) { return normalize(s.mean, s.std); }

  // Common recipes: training (crop 32 pad 4, flip, normalize) and evaluation (normalize only).
  static Transform cifar_train(const NormStats& s);
  static Transform eval(const NormStats& s);

  bool has_crop() const { return crop_h_ > 0 || padding_ > 0; }
  bool has_flip() const { return flip_p_ > 0; }
  bool has_normalize() const { return !mean_.empty(); }

  ImageShape output_shape(const ImageShape& in) const;
  // Which crop/flip sample `rng` gets. Uses words 0 (top), 1 (left), 2 (flip) of its stream.
  TransformDraw draw(const ImageShape& in, const SampleRng& rng) const;
  // The fused pipeline: `src` is one uint8 image of shape `in` in `layout`; `dst` receives
  // output_shape(in).numel() floats, [C, H, W] row-major.
  void apply(const uint8_t* src, const ImageShape& in, Layout layout, float* dst,
             const SampleRng& rng) const;

 private:
  int64_t crop_h_ = 0, crop_w_ = 0, padding_ = 0;
  float flip_p_ = 0;
  std::vector<float> mean_, std_;
  // table_[k * 256 + v]: the output value of byte v in channel k, computed exactly as the
  // step-by-step form computes it ((v / 255 - mean) / std), so the two agree bit for bit.
  std::vector<float> table_;
  void build_table();
};

// --- the step-by-step form, on tensors -------------------------------------------------------

// uint8 [H, W, C] (kHWC), [C, H, W] (kCHW) or [H, W] (either) -> float32 [C, H, W] in [0, 1].
Tensor to_tensor(const Tensor& image, Layout layout);
// Zero padding of a float [C, H, W] image on every side.
Tensor pad(const Tensor& image, int64_t padding);
// The [C, height, width] window at (top, left).
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
// Mirror left-right.
Tensor hflip(const Tensor& image);
// (x - mean[c]) / std[c] per channel.
Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& std);

}  // namespace ddplab::data
