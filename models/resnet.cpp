// Residual networks (see models/resnet.h).
#include "models/resnet.h"

#include "autograd/functions.h"
#include "nn/init.h"

namespace ddplab::models {

namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, 3, stride, /*padding=*/1, /*bias=*/false);
}
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, 1, stride, /*padding=*/0, /*bias=*/false);
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, const nn::ModulePtr& ds) {
  register_module("conv1", conv1, conv3x3(inplanes, planes, stride));
  register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(planes));
  register_module("conv2", conv2, conv3x3(planes, planes, 1));
  register_module("bn2", bn2, std::make_shared<nn::BatchNorm2d>(planes));
  if (ds) register_module("downsample", downsample, ds);
}

// Each relu is fused into the op before it (batch norm; the last batch norm with the residual
// add): the same numbers as the separate calls, with fewer passes over memory (nn/functional.h).
Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = (*conv2)(bn1->forward_relu((*conv1)(x)));
  Tensor identity = downsample ? (*downsample)(x) : x;
  return bn2->forward_add_relu(out, identity);
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, const nn::ModulePtr& ds) {
  register_module("conv1", conv1, conv1x1(inplanes, planes, 1));
  register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(planes));
  register_module("conv2", conv2, conv3x3(planes, planes, stride));
  register_module("bn2", bn2, std::make_shared<nn::BatchNorm2d>(planes));
  register_module("conv3", conv3, conv1x1(planes, planes * kExpansion, 1));
  register_module("bn3", bn3, std::make_shared<nn::BatchNorm2d>(planes * kExpansion));
  if (ds) register_module("downsample", downsample, ds);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu((*conv1)(x));
  out = bn2->forward_relu((*conv2)(out));
  out = (*conv3)(out);
  Tensor identity = downsample ? (*downsample)(x) : x;
  return bn3->forward_add_relu(out, identity);
}

ResNet::ResNet(const ResNetConfig& c) {
  DDP_CHECK(!c.blocks.empty() && c.blocks.size() == c.widths.size(),
            "ResNet: blocks and widths must have one entry per stage");
  const int64_t expansion =
      c.block == BlockKind::Basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  // 32x32 stem: 3x3 stride 1, no max-pool (the 7x7/2 + pool stem would leave 8x8 after it).
  register_module("conv1", conv1, conv3x3(c.in_channels, c.stem_width, 1));
  register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(c.stem_width));
  int64_t inplanes = c.stem_width;
  // Sized up front: each element is bound to its registry entry, so it must not move.
  layers.resize(c.blocks.size());
  for (size_t s = 0; s < c.blocks.size(); ++s) {
    auto layer = std::make_shared<nn::Sequential>();
    const int64_t planes = c.widths[s];
    for (int64_t b = 0; b < c.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      nn::ModulePtr ds;
      if (stride != 1 || inplanes != planes * expansion) {
        ds = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
            conv1x1(inplanes, planes * expansion, stride),
            std::make_shared<nn::BatchNorm2d>(planes * expansion)});
      }
      if (c.block == BlockKind::Basic) {
        layer->push_back(std::make_shared<BasicBlock>(inplanes, planes, stride, ds));
      } else {
        layer->push_back(std::make_shared<Bottleneck>(inplanes, planes, stride, ds));
      }
      inplanes = planes * expansion;
    }
    register_module("layer" + std::to_string(s + 1), layers[s], layer);
  }
  register_module("avgpool", avgpool, std::make_shared<nn::AdaptiveAvgPool2d>(1));
  register_module("fc", fc, std::make_shared<nn::Linear>(inplanes, c.num_classes));

  // torchvision's init: He-normal (fan_out, relu) convs, BN weight 1 and bias 0; fc keeps
  // Linear's default.
  apply([](nn::Module& m) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(&m)) {
      nn::init::kaiming_normal_(conv->weight, 0, nn::init::FanMode::FanOut, "relu");
    } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  });
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu((*conv1)(x));
  for (auto& layer : layers) out = (*layer)(out);
  out = ddplab::flatten((*avgpool)(out), 1);
  return (*fc)(out);
}

std::shared_ptr<ResNet> cifar_resnet(int64_t depth, int64_t num_classes, int64_t in_channels) {
  DDP_CHECK(depth >= 8 && (depth - 2) % 6 == 0,
            "cifar_resnet: depth must be 6n + 2 (20, 32, 44, 56, 110), got " << depth);
  const int64_t n = (depth - 2) / 6;
  return std::make_shared<ResNet>(
      ResNetConfig{BlockKind::Basic, {n, n, n}, {16, 32, 64}, 16, num_classes, in_channels});
}

std::shared_ptr<ResNet> resnet18(int64_t num_classes, int64_t in_channels) {
  return std::make_shared<ResNet>(ResNetConfig{
      BlockKind::Basic, {2, 2, 2, 2}, {64, 128, 256, 512}, 64, num_classes, in_channels});
}

std::shared_ptr<ResNet> resnet34(int64_t num_classes, int64_t in_channels) {
  return std::make_shared<ResNet>(ResNetConfig{
      BlockKind::Basic, {3, 4, 6, 3}, {64, 128, 256, 512}, 64, num_classes, in_channels});
}

std::shared_ptr<ResNet> resnet50(int64_t num_classes, int64_t in_channels) {
  return std::make_shared<ResNet>(ResNetConfig{
      BlockKind::Bottleneck, {3, 4, 6, 3}, {64, 128, 256, 512}, 64, num_classes, in_channels});
}

}  // namespace ddplab::models
