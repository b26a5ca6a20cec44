// What examples/train builds from its Config before the first epoch: the process group when
// launched as one rank of a job, the datasets, the loader's options, the step counts and the
// learning-rate schedule; and the evaluation after each epoch. main() (train.cpp) calls these in
// the order of its story; each says here what it decides.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "examples/train_config.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace ddplab::train {

// DDP: what a process needs to be one rank of a data-parallel job.
struct Distributed {
  std::shared_ptr<distributed::ProcessGroup> pg;  // null when training alone
  int world = 1;
  bool main_rank = true;  // rank 0 prints and saves
};

// DDP: under ddprun/torchrun (WORLD_SIZE > 1) this process is one rank of a DDP job: it joins the
// process group, on its own GPU when training on CUDA. Alone, it changes nothing.
Distributed setup_distributed(Device& device, double collective_timeout_s);

// --deterministic: the same bits on every run of the same command on the same machine. The
// kernels' reductions (ours and oneDNN's) split work by thread count, so it must not change
// during the run or between a run and its resumption; data order and augmentation are already
// pure functions of (seed, epoch, index) whatever --num-workers is.
void make_deterministic(const Config& c, bool main_rank);

// --amp's autocast dtype (bf16: kBFloat16, fp16: kFloat16); nullopt for float32.
std::optional<DType> autocast_dtype(const std::string& amp);

struct Data {
  std::shared_ptr<data::ImageDataset> train, test;
};
// The training and test sets of --dataset from --data-dir, with the usual augmentation of each
// (none with --no-augment). Exits 2 with a message saying where the files were looked for.
Data load_data(const Config& c);

// Batches of --batch-size, built by --num-workers threads, in the order of `sampler`.
data::DataLoaderOptions loader_options(const Config& c, Device device,
                                       std::shared_ptr<data::Sampler> sampler);

// How the epochs divide into optimizer steps. With --accumulation-steps N a step takes N
// micro-batches; the epoch's last step takes what is left, so no gradient is carried over.
struct StepCounts {
  int64_t micro_per_epoch = 0;  // this rank's batches per epoch
  int64_t accumulation = 1;     // micro-batches per optimizer step
  int64_t per_epoch = 0;        // optimizer steps per epoch
  int64_t total = 0;            // of the run: per_epoch * --epochs, at most --max-steps

  // The size of the accumulation group the epoch's micro-batch `micro` (from 0) belongs to.
  int64_t group_size(int64_t micro) const;
  // Whether micro-batch `micro` is its group's last, after which the optimizer steps.
  bool ends_group(int64_t micro) const;
};
StepCounts count_steps(const Config& c, int64_t micro_per_epoch, int64_t n_train,
                       const Distributed& dist);

// --schedule, stepped once per optimizer step: warm-up (linear from lr/warmup_steps to lr) then
// the schedule over the remaining steps. onecycle has its own warm-up (and cycles the momentum).
std::unique_ptr<optim::LRScheduler> make_schedule(const Config& c, optim::Optimizer& opt,
                                                  const StepCounts& steps);

// Dynamic loss scaling with --grad-scaler, and always under --amp fp16: float16 gradients
// underflow without it (bfloat16 has float32's range and needs none).
optim::GradScalerOptions scaler_options(const Config& c);

// Test accuracy of `net` (the model, not its DDP wrapper) on the first --test-subset examples
// (all by default); with a process group every rank evaluates its share and all get the same
// exact result (ddp/evaluate.h).
double evaluate(nn::Module& net, const std::shared_ptr<data::ImageDataset>& test, const Config& c,
                Device device, distributed::ProcessGroup* pg);

}  // namespace ddplab::train
