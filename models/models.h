// The model zoo: build a model by name (the train example's --model flag).
//
//   resnet20 resnet32 resnet44 resnet56 resnet110   CIFAR ResNets (models/resnet.h)
//   resnet18 resnet34 resnet50                      torchvision ResNets with a 32x32 stem
//   cnn                                             SmallCNN for 28x28 images (models/simple.h)
//   mlp                                             MLP for 28x28 images
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/resnet.h"
#include "models/simple.h"
#include "nn/module.h"

namespace ddplab::models {

// image_size is used by cnn and mlp (0: 28); the ResNets accept any size (global pooling).
std::shared_ptr<nn::Module> create(const std::string& name, int64_t num_classes = 10,
                                   int64_t in_channels = 3, int64_t image_size = 0);
std::vector<std::string> available();

}  // namespace ddplab::models
