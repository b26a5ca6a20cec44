// Residual networks (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016),
// with torchvision's module layout and parameter names, so checkpoints map one to one:
//   conv1, bn1, layer1..layerN (each a Sequential of blocks "0", "1", ...), fc
//   block: conv1, bn1, conv2, bn2[, conv3, bn3], downsample.0 (1x1 conv), downsample.1 (BN)
//
// Two families, both for small (32x32) images:
//  - CIFAR ResNets resnet20/32/44/56/110 (the paper's section 4.2): three stages of 16/32/64
//    channels with n = (depth - 2) / 6 BasicBlocks each. Where a block changes shape, the
//    shortcut is a 1x1 stride-2 conv + BN projection (the paper's option B, torchvision's
//    `downsample`), which is why resnet20 has 272,474 parameters rather than option A's 0.27M.
//  - ImageNet ResNets resnet18/34/50 as in torchvision, but with the stem adapted to 32x32 inputs
//    (a 3x3 stride-1 conv1 and no max-pool; the usual CIFAR variant).
#pragma once

#include <memory>
#include <vector>

#include "nn/layers.h"

namespace ddplab::models {

// Two 3x3 convs; the first may stride. expansion 1.
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, const nn::ModulePtr& downsample);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  nn::ModulePtr downsample;  // null: identity shortcut
};

// 1x1 reduce, 3x3 (strided, torchvision "v1.5"), 1x1 expand to planes * 4.
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, const nn::ModulePtr& downsample);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Bottleneck"; }

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  nn::ModulePtr downsample;
};

enum class BlockKind { Basic, Bottleneck };

struct ResNetConfig {
  BlockKind block = BlockKind::Basic;
  std::vector<int64_t> blocks;  // blocks per stage
  std::vector<int64_t> widths;  // planes per stage (stage i > 0 strides by 2)
  int64_t stem_width = 16;      // channels of conv1
  int64_t num_classes = 10;
  int64_t in_channels = 3;
};

class ResNet : public nn::Module {
 public:
  explicit ResNet(const ResNetConfig& config);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ResNet"; }

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::vector<std::shared_ptr<nn::Sequential>> layers;  // layer1, layer2, ...
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;
};

// CIFAR ResNet of depth 6n + 2 (20, 32, 44, 56, 110, ...).
std::shared_ptr<ResNet> cifar_resnet(int64_t depth, int64_t num_classes = 10,
                                     int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 10, int64_t in_channels = 3);

}  // namespace ddplab::models
