// Lab 7: checkpoint and resume. The functions the student writes (starter/, graded by
// grader/grader.cpp); solution/ is the course staff's version. Handout: README.md.
//
// The file format is the library's (nn/checkpoint.h: one safetensors file holding a
// TrainingState, with a CRC32 of every tensor); what you write is the logic around it: what a
// checkpoint must hold for a run to continue bit for bit, how to write it so that a crash never
// leaves half a file under the real name, and how to find the one to resume from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "data/dataloader.h"
#include "nn/checkpoint.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace lab7 {

// The lab's code reads as code inside ddplab would (nn::, optim::, data::, distributed::).
using namespace ddplab;

// What changes while a run trains, as the training loop owns it (toy_training.h builds one).
struct Run {
  nn::Module& model;            // the model itself, not its DDP wrapper: PyTorch's names
  optim::Optimizer& optimizer;  // SGD with momentum: it has state of its own
  data::DataLoader& loader;     // state_dict(): the epoch, and how many of its batches were used
  int64_t step = 0;             // optimizer steps so far
  // Also part of the run, though no member: ddplab::default_generator() (tensor/random.h), which
  // the model's Dropout draws from. Every rank seeds it alike, so rank 0's state stands for all.
};

// Part 1. Writes `bytes` to `path` so that a crash at any moment leaves either the previous file
// at `path` or the complete new one, never part of it: write a temporary file next to `path`,
// fsync it, rename it over `path`, fsync the folder. Use only the operations of fileio.h.
void write_atomically(const std::string& path, const std::string& bytes);

// Part 1. A collective: every rank calls it after the same step. Rank 0 (pg null: the only
// process) captures the run and writes it atomically to checkpoint_path(dir, run.step)
// (toy_training.h; encode_checkpoint turns a TrainingState into the file's bytes); the others
// write nothing. No rank returns before the file is complete. Returns the path.
std::string save(const std::string& dir, Run& run, distributed::ProcessGroup* pg);

// Part 2. Everything needed to continue `run` exactly: step, epoch, model, optimizer state, data
// position and the default generator's seed and offset.
nn::TrainingState capture(Run& run);
// Part 2. Puts a captured state back into `run` (built afresh: new weights, an empty optimizer,
// a loader at epoch 0), so that its next steps are those the captured run would have taken.
void restore(Run& run, const nn::TrainingState& state);

struct Checkpoint {
  std::string path;
  nn::TrainingState state;
};
// Part 3. The checkpoint with the highest step in `dir` that loads and verifies (load_checkpoint
// throws ddplab::Error for a truncated or corrupt file: report it on stderr and try the next
// older one). Only names checkpoint_path gives count (step_of_checkpoint); nullopt when none is
// valid.
std::optional<Checkpoint> newest_valid_checkpoint(const std::string& dir);

// Part 4. A collective, called once before training. Rank 0 finds the newest valid checkpoint;
// every rank then restores that same checkpoint (its step travels by broadcast_from_rank0), even
// if another rank would list the folder differently. Returns the step resumed from, or nullopt
// (and `run` untouched) when there is none.
std::optional<int64_t> resume(const std::string& dir, Run& run, distributed::ProcessGroup* pg);

}  // namespace lab7
