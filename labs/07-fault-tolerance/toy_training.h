// Lab 7's training job, small enough that a whole run takes a fraction of a second: a two-layer
// network with Dropout learns which of four Gaussian blobs an 8-D point comes from, with SGD and
// momentum, under DDP when there is a process group. Used by the lab's program (train.cpp) and
// the grader; plus the helpers the checkpoint code needs that are not the lab's subject.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ddp/ddp.h"
#include "fault_lab.h"
#include "optim/sgd.h"

namespace lab7 {

class ToyTraining {
 public:
  // Seeds the default generator with `seed` (on every rank alike), then builds the model (its
  // initial weights come from that generator), the data (96 points, the same on every rank), the
  // loader (8 samples per rank and step: 12 steps per epoch alone, 6 on 2 ranks) and the optimizer.
  explicit ToyTraining(std::shared_ptr<distributed::ProcessGroup> pg, uint64_t seed = 7);

  Run& run() { return run_; }
  // One optimizer step on the next batch; the next epoch begins when this one is used up.
  // Returns the loss of the step (this rank's batch).
  double train_step();

 private:
  std::shared_ptr<nn::Module> net_;
  std::shared_ptr<distributed::DDP> ddp_;  // null without a process group
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<optim::SGD> opt_;
  Run run_;
};

// Where the checkpoint of `step` goes: DIR/step-000012.safetensors.
std::string checkpoint_path(const std::string& dir, int64_t step);
// The step of a file name checkpoint_path gives ("step-000012.safetensors" -> 12), nullopt for
// any other name (a leftover "step-000012.safetensors.tmp" among them).
std::optional<int64_t> step_of_checkpoint(const std::string& file_name);

// The bytes of the checkpoint file of `state`: what nn::save_checkpoint would write (a
// safetensors file with a CRC32 of every tensor; nn::load_checkpoint reads it back).
std::string encode_checkpoint(const nn::TrainingState& state);

// Rank 0's `value` on every rank (a broadcast); `value` itself without a group.
int64_t broadcast_from_rank0(distributed::ProcessGroup* pg, int64_t value);

// The model's weights as one byte string (names, shapes and data), for comparing runs bit for
// bit.
std::string weight_bytes(nn::Module& model);

}  // namespace lab7
