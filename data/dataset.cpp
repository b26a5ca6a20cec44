// Dataset::get, the in-memory image dataset and TensorDataset.
#include "data/dataset.h"

#include <algorithm>

#include "tensor/ops.h"

namespace ddplab::data {

Example Dataset::get(int64_t index, uint64_t seed, uint64_t epoch) const {
  DDP_CHECK(index >= 0 && index < size(),
            "Dataset::get: index " << index << " is out of range for a dataset of " << size());
  Example ex;
  ex.image = ops::empty(sample_shape(), kFloat32);
  ex.label = get_into(index, ex.image.data_ptr<float>(),
                      SampleRng(seed, epoch, static_cast<uint64_t>(index)));
  return ex;
}

ImageDataset::ImageDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels,
                           ImageShape shape, Layout layout, std::vector<std::string> classes)
    : pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      shape_(shape),
      layout_(layout),
      classes_(std::move(classes)) {
  finish_loading("ImageDataset");
}

void ImageDataset::finish_loading(const std::string& what) {
  DDP_CHECK(shape_.channels > 0 && shape_.height > 0 && shape_.width > 0,
            what << ": image shape " << shape_.channels << "x" << shape_.height << "x"
                 << shape_.width << " is empty");
  DDP_CHECK(pixels_.size() == labels_.size() * static_cast<size_t>(shape_.numel()),
            what << ": " << pixels_.size() << " pixel bytes for " << labels_.size() << " labels of "
                 << shape_.numel() << " bytes each");
  for (size_t i = 0; i < labels_.size(); ++i)
    DDP_CHECK(labels_[i] >= 0 && (classes_.empty() || labels_[i] < num_classes()),
              what << ": label " << labels_[i] << " of sample " << i << " is outside [0, "
                   << num_classes() << ")");
}

Shape ImageDataset::sample_shape() const {
  ImageShape out = transform_.output_shape(shape_);
  return {out.channels, out.height, out.width};
}

const uint8_t* ImageDataset::raw_image(int64_t index) const {
  DDP_CHECK(index >= 0 && index < size(),
            "index " << index << " is out of range for a dataset of " << size());
  return pixels_.data() + static_cast<size_t>(index) * static_cast<size_t>(shape_.numel());
}

int64_t ImageDataset::get_into(int64_t index, float* dst, const SampleRng& rng) const {
  transform_.apply(raw_image(index), shape_, layout_, dst, rng);
  return labels_[static_cast<size_t>(index)];
}

TensorDataset::TensorDataset(const Tensor& inputs, const Tensor& targets) {
  DDP_CHECK(inputs.defined() && targets.defined(), "TensorDataset: an undefined tensor");
  DDP_CHECK(inputs.dim() >= 1 && inputs.dtype() == kFloat32,
            "TensorDataset: inputs must be float32 with a first (sample) dimension, got "
                << dtype_name(inputs.dtype()) << " of " << inputs.dim() << " dimensions");
  DDP_CHECK(targets.dim() == 1 && targets.dtype() == kInt64,
            "TensorDataset: targets must be a 1-d int64 tensor of labels, got "
                << dtype_name(targets.dtype()) << " of " << targets.dim() << " dimensions");
  DDP_CHECK(inputs.size(0) == targets.size(0),
            "TensorDataset: " << inputs.size(0) << " inputs but " << targets.size(0) << " targets");
  // Contiguous CPU copies: get_into reads sample i as one run of floats, from any thread.
  inputs_ = ops::contiguous(ops::to(inputs, kCPU));
  targets_ = ops::contiguous(ops::to(targets, kCPU));
  sample_numel_ = inputs.size(0) > 0 ? inputs_.numel() / inputs.size(0) : 0;
}

Shape TensorDataset::sample_shape() const {
  return Shape(inputs_.shape().begin() + 1, inputs_.shape().end());
}

int64_t TensorDataset::get_into(int64_t index, float* dst, const SampleRng& /*rng*/) const {
  DDP_CHECK(index >= 0 && index < size(),
            "TensorDataset: index " << index << " is out of range for " << size() << " samples");
  const float* src = inputs_.data_ptr<float>() + index * sample_numel_;
  std::copy(src, src + sample_numel_, dst);
  return targets_.data_ptr<int64_t>()[index];
}

}  // namespace ddplab::data
