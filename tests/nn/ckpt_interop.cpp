// Helper for check_checkpoint_interop.py: `write DIR` trains a small Sequential one SGD step,
// saves a training checkpoint through CheckpointManager, and writes `reference.safetensors`: the
// model's state dict alone, a fixed input and the model's output on it (eval mode).
#include <cstdio>
#include <exception>
#include <string>

#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

int main(int argc, char** argv) {
  try {
    if (argc != 3 || std::string(argv[1]) != "write") {
      std::fprintf(stderr, "usage: %s write DIR\n", argv[0]);
      return 2;
    }
    const std::string dir = argv[2];
    manual_seed(3);
    // The layout of torch.nn.Sequential(Flatten, Linear, ReLU, Dropout, Linear): keys 1.* and 4.*
    auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(12, 5),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.5),
        std::make_shared<nn::Linear>(5, 3)});
    optim::SGDOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    optim::SGD opt(model->parameters(), o);
    Tensor x = ops::randn({4, 3, 2, 2});
    Tensor y = ops::randint(0, 3, {4});
    F::cross_entropy(model->forward(x), y).backward();
    opt.step();

    nn::CheckpointManager ckpts(dir);
    nn::TrainingState st;
    st.step = 1;
    st.model = model->state_dict();
    optim::OptimizerState os = opt.state_dict();
    st.parts["optimizer"] = {os.meta, os.tensors};
    ckpts.save(st);

    model->eval();
    std::vector<std::pair<std::string, Tensor>> ref(st.model.begin(), st.model.end());
    ref.emplace_back("input", x);
    ref.emplace_back("output", model->forward(x));
    nn::save_safetensors(dir + "/reference.safetensors", ref);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_interop: %s\n", e.what());
    return 1;
  }
}
