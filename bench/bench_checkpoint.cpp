// Checkpoint write time: nn::save_checkpoint (safetensors, CRC32 per tensor, temporary file,
// fsync, rename, fsync of the folder) of a model's training state: its state_dict plus one SGD
// momentum buffer per parameter. bench/bench_checkpoint.py times torch.save of the same tensors
// and runs both interleaved (the machine is shared: only ratios measured in one run mean much).
//
//   build/bench/bench_checkpoint --model resnet20 --dir /tmp/ck [--reps 5]
//
// Prints `RESULT model=... megabytes=... save_ms=... load_ms=...` (medians) and leaves the last
// checkpoint in --dir, from which the Python side reads the tensors' names and shapes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/checkpoint.h"
#include "tensor/ops.h"

using namespace ddplab;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string model = "resnet20", dir = "/tmp/ddplab-bench-checkpoint";
  int reps = 5;
  CLI::App app{"checkpoint write time"};
  app.add_option("--model", model)->capture_default_str();
  app.add_option("--dir", dir)->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // resnet18 is the ImageNet network (1000 classes, 3x224x224 inputs); resnet20 is CIFAR's.
  const bool imagenet = model == "resnet18";
  auto net = models::create(model, imagenet ? 1000 : 10, 3, imagenet ? 224 : 32);
  nn::TrainingState st;
  st.step = 1000;
  st.model = net->state_dict();
  int i = 0;
  for (const Tensor& p : net->parameters()) {
    st.parts["optimizer"].tensors.emplace_back("state." + std::to_string(i++) + ".momentum_buffer",
                                               ops::clone(p));
  }
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/ckpt.safetensors";
  std::vector<double> save_ms, load_ms;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    nn::save_checkpoint(path, st);
    save_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    (void)nn::load_checkpoint(path);
    load_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(save_ms.begin(), save_ms.end());
  std::sort(load_ms.begin(), load_ms.end());
  const double mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
  std::printf("RESULT model=%s megabytes=%.2f save_ms=%.2f load_ms=%.2f\n", model.c_str(), mb,
              save_ms[save_ms.size() / 2], load_ms[load_ms.size() / 2]);
  return 0;
}
