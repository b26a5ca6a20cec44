// Small models for 28x28 images (see models/simple.h).
#include "models/simple.h"

#include "autograd/functions.h"

namespace ddplab::models {

SmallCNN::SmallCNN(int64_t num_classes, int64_t in_channels, int64_t image_size) {
  DDP_CHECK(image_size % 4 == 0,
            "SmallCNN: image size must be a multiple of 4, got " << image_size);
  register_module("conv1", conv1, std::make_shared<nn::Conv2d>(in_channels, 32, 3, 1, 1));
  register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(32));
  register_module("conv2", conv2, std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1));
  register_module("bn2", bn2, std::make_shared<nn::BatchNorm2d>(64));
  const int64_t s = image_size / 4;  // two 2x2 max-pools
  register_module("fc1", fc1, std::make_shared<nn::Linear>(64 * s * s, 128));
  register_module("fc2", fc2, std::make_shared<nn::Linear>(128, num_classes));
}

Tensor SmallCNN::forward(const Tensor& x) {
  Tensor h = F::max_pool2d(bn1->forward_relu((*conv1)(x)), {2, 2});
  h = F::max_pool2d(bn2->forward_relu((*conv2)(h)), {2, 2});
  h = F::relu((*fc1)(ddplab::flatten(h, 1)));
  return (*fc2)(h);
}

MLP::MLP(int64_t num_classes, int64_t in_channels, int64_t image_size) {
  register_module("fc1", fc1,
                  std::make_shared<nn::Linear>(in_channels * image_size * image_size, 256));
  register_module("fc2", fc2, std::make_shared<nn::Linear>(256, 128));
  register_module("fc3", fc3, std::make_shared<nn::Linear>(128, num_classes));
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = F::relu((*fc1)(ddplab::flatten(x, 1)));
  h = F::relu((*fc2)(h));
  return (*fc3)(h);
}

}  // namespace ddplab::models
