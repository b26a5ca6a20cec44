// Dataset: the interface the DataLoader reads samples through, the in-memory image dataset that
// CIFAR, MNIST and ImageFolder all are, and TensorDataset for samples already in tensors.
//
// A sample is (image, label). `get(index)` returns it as a fresh tensor, the way a PyTorch user
// expects. The DataLoader instead calls `get_into`, which writes the transformed float image
// straight into its slot of the preallocated batch buffer: no per-sample tensor, no copy. The
// datasets keep their images as raw uint8 bytes (50000 CIFAR images are 150 MiB as bytes, 600
// MiB as floats) and convert on the fly, fused with augmentation (data/transforms.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sample_rng.h"
#include "data/transforms.h"
#include "tensor/tensor.h"

namespace ddplab::data {

struct Example {
  Tensor image;  // float32 [C, H, W], after the dataset's transform
  int64_t label = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The shape of every sample get_into writes: [C, H, W].
  virtual Shape sample_shape() const = 0;
  // Writes sample `index` (transformed, randomness from `rng`) as float32 [C, H, W] into `dst`
  // and returns its label. Must be safe to call from several threads at once.
  virtual int64_t get_into(int64_t index, float* dst, const SampleRng& rng) const = 0;

  // Sample `index` as a tensor; the randomness is that of (seed, epoch, index).
  Example get(int64_t index, uint64_t seed = 0, uint64_t epoch = 0) const;
};

// Images held in memory as uint8 bytes, all of one shape and layout, with int64 labels.
// Subclasses (CIFAR10, MNIST, ImageFolder, ...) only differ in how they fill it.
class ImageDataset : public Dataset {
 public:
  ImageDataset() = default;
  // Takes ownership of `pixels` (size() * shape.numel() bytes) and `labels`.
  ImageDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels, ImageShape shape,
               Layout layout, std::vector<std::string> classes);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape sample_shape() const override;
  int64_t get_into(int64_t index, float* dst, const SampleRng& rng) const override;

  // The transform applied by get/get_into (default: to-tensor only, values in [0, 1]).
  void set_transform(Transform t) { transform_ = std::move(t); }
  const Transform& transform() const { return transform_; }

  const ImageShape& image_shape() const { return shape_; }  // before the transform
  Layout layout() const { return layout_; }
  const std::vector<int64_t>& labels() const { return labels_; }
  const std::vector<std::string>& classes() const { return classes_; }
  int64_t num_classes() const { return static_cast<int64_t>(classes_.size()); }
  // The raw bytes of image `index` (shape image_shape(), layout layout()).
  const uint8_t* raw_image(int64_t index) const;

 protected:
  // For subclasses that fill the members in their constructor; checks their consistency.
  void finish_loading(const std::string& what);

  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  ImageShape shape_;
  Layout layout_ = Layout::kCHW;
  std::vector<std::string> classes_;
  Transform transform_;
};

// Samples that are already tensors, as PyTorch's TensorDataset(inputs, targets): sample i is
// inputs[i] (float32, any shape after the first dimension) with label targets[i] (int64). No
// transform: what is in the tensor is what the loader batches.
//
//   data::TensorDataset ds(ops::randn({100, 1, 8, 8}), labels);   // labels: int64 [100]
class TensorDataset : public Dataset {
 public:
  // Keeps the tensors (contiguous CPU copies when they are not already); checks the dtypes and
  // that both have the same first dimension.
  TensorDataset(const Tensor& inputs, const Tensor& targets);

  int64_t size() const override { return inputs_.size(0); }
  Shape sample_shape() const override;
  int64_t get_into(int64_t index, float* dst, const SampleRng& rng) const override;

  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  int64_t sample_numel_ = 0;
};

}  // namespace ddplab::data
