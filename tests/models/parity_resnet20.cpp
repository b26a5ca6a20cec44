// One training step of resnet20, recorded for check_resnet20.py to recompute in PyTorch.
//
//   parity_resnet20 OUT.safetensors [--amp] [--init-from STATE.safetensors]
//
// Builds resnet20 (seed 0), a seeded batch of 8 images [8, 3, 32, 32] and labels, runs forward
// in train mode, cross-entropy, backward and one SGD step (lr 0.1, momentum 0.9, weight decay
// 5e-4), and writes: before.<name> (state_dict before), input, target, logits, loss,
// grad.<param> and after.<name> (state_dict after: parameters and BN running statistics).
// --amp runs the forward and the loss under bfloat16 autocast (check_resnet20_amp.py).
// --init-from starts from that state_dict instead of the seeded one (the check moves the first
// run's biases off the ReLU kinks and runs again from there: tests/models/kinks.py).
#include <cstdio>
#include <exception>

#include <optional>
#include <string>

#include "models/resnet.h"
#include "nn/autocast.h"
#include "nn/functional.h"
#include "nn/safetensors.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

int main(int argc, char** argv) {
  bool amp = false, usage = argc < 2;
  std::string init_from;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--amp") {
      amp = true;
    } else if (arg == "--init-from" && i + 1 < argc) {
      init_from = argv[++i];
    } else {
      usage = true;
    }
  }
  if (usage) {
    std::fprintf(
        stderr, "usage: parity_resnet20 OUT.safetensors [--amp] [--init-from STATE.safetensors]\n");
    return 2;
  }
  try {
    manual_seed(0);
    auto model = models::cifar_resnet(20, 10);
    model->train();
    if (!init_from.empty()) model->load_state_dict(nn::load_safetensors(init_from));
    Generator gen(1234);
    Tensor x = ops::randn({8, 3, 32, 32}, {}, &gen);
    Tensor y = ops::randint(0, 10, {8}, &gen);

    std::vector<std::pair<std::string, Tensor>> out;
    // Clones: the step below updates the model's tensors in place.
    for (auto& [n, t] : model->state_dict()) out.emplace_back("before." + n, ops::clone(t));
    out.emplace_back("input", x);
    out.emplace_back("target", y);

    Tensor logits, loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (amp) autocast.emplace(kCPU, kBFloat16);
      logits = (*model)(x);
      loss = F::cross_entropy(logits, y);
    }
    loss.backward();
    optim::SGD opt(model->parameters(), {0.1, 0.9, 0, 5e-4, false});
    opt.step();

    out.emplace_back("logits", logits.detach());
    out.emplace_back("loss", loss.detach());
    for (auto& [n, p] : model->named_parameters()) out.emplace_back("grad." + n, p.grad());
    for (auto& [n, t] : model->state_dict()) out.emplace_back("after." + n, t);
    nn::save_safetensors(argv[1], out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_resnet20: %s\n", e.what());
    return 1;
  }
}
