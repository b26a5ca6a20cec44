// Training checkpoints: everything needed to continue a run bit for bit, written so that a crash
// at any moment leaves a loadable checkpoint behind, and read so that a damaged file is named
// and skipped rather than trusted. The format and its guarantees: docs/checkpoints.md.
//
//   nn::CheckpointManager ckpts("runs/a", /*keep=*/3);    // removes *.tmp left by a crash
//   if (auto resumed = ckpts.load_latest()) { ... restore each part of resumed->state ... }
//   ...
//   nn::TrainingState st;                                  // after the ranks agreed on the step
//   st.step = step; st.epoch = epoch; st.model = model->state_dict();
//   st.parts["optimizer"] = {opt_state.meta, opt_state.tensors};
//   st.parts["scheduler"].meta = scheduler.state_dict();
//   if (rank == 0) ckpts.save(st);                         // ckpt-step000123.safetensors
//
// One file per checkpoint, so a single rename commits all of it: model tensors under their
// PyTorch names, every other tensor as "<part>.<name>" (e.g. "optimizer.state.3.momentum_buffer"),
// and the JSON of each part, the step, the epoch and a CRC32 of every tensor in the safetensors
// `__metadata__`. `torch` loading the file sees the model's keys as they are.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace ddplab::nn {

// One component's contribution (optimizer, LR scheduler, GradScaler, RNGs, data position, ...):
// named tensors and a JSON object, the shape of PyTorch's state_dict() for that component.
// optim::OptimizerState converts as {state.meta, state.tensors}.
struct CheckpointPart {
  nlohmann::json meta = nlohmann::json::object();
  std::vector<std::pair<std::string, Tensor>> tensors;
};

struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;
  StateDict model;                              // Module::state_dict(): stored unprefixed
  std::map<std::string, CheckpointPart> parts;  // stored as "<part name>.<tensor name>"

  // The part named `name`; throws naming the part and what the checkpoint holds when absent.
  const CheckpointPart& part(const std::string& name) const;
};

// Writes `state` to `path` atomically (nn/safetensors.h: write_file_atomic) with a CRC32 of
// every tensor. Part names must be non-empty, without '.'; model keys must not start with a
// part's name followed by '.'.
void save_checkpoint(const std::string& path, const TrainingState& state);
// Reads and verifies a checkpoint: the safetensors structure (errors name the file and the
// offset), the format tag, every tensor's CRC32 (a mismatch names the tensor and the file).
// Throws ddplab::Error, never anything else, whatever the file holds.
TrainingState load_checkpoint(const std::string& path);

// A folder of rolling checkpoints `ckpt-stepNNNNNN.safetensors` plus `best.safetensors`.
// Only rank 0 should write; every rank may read.
class CheckpointManager {
 public:
  // Checks that `dir` is a writable folder (creating its last level if missing), removes the
  // temporary files a crashed save left behind. keep: rolling checkpoints to keep (>= 1).
  explicit CheckpointManager(std::string dir, int keep = 3);

  const std::string& dir() const { return dir_; }
  // Writes a checkpoint for state.step, then (only once it is safely on disk) removes the oldest
  // beyond `keep`. A failure (disk full, folder gone) throws naming the path and the system's
  // reason, and leaves the earlier checkpoints and no temporary file. Returns the path.
  std::string save(const TrainingState& state);
  // The best checkpoint (for rollback), kept apart from the rolling ones and never rotated.
  std::string save_best(const TrainingState& state);

  struct Loaded {
    std::string path;
    TrainingState state;
  };
  // The newest checkpoint that loads and verifies. Each newer one that fails is reported on
  // stderr and in skipped() ("<file>: <which check failed>"); none at all gives nullopt (a fresh
  // start).
  std::optional<Loaded> load_latest();
  // The path load_latest() would load, verified the same way.
  std::optional<std::string> latest_valid();
  std::optional<Loaded> load_best();
  const std::vector<std::string>& skipped() const { return skipped_; }

  // Rolling checkpoints present, oldest first (by step, not by file time).
  std::vector<std::string> list() const;
  // Removes `*.tmp` files in dir (a save interrupted by a crash); returns how many.
  int clean_stale();
  std::string path_for_step(int64_t step) const;
  std::string best_path() const { return dir_ + "/best.safetensors"; }

 private:
  std::string dir_;
  int keep_;
  std::vector<std::string> skipped_;
};

// Checks for the train app to run before training starts, so a bad flag fails at once instead
// of after an hour of training. `what` names the flag (e.g. "--checkpoint-dir").
// check_output_dir: `path` exists (with `create`, its last component may be missing and is
// created), is a folder, and a file can be created in it. check_output_file: its folder passes
// check_output_dir and `path` is not a folder.
void check_output_dir(const std::string& path, const std::string& what, bool create = false);
void check_output_file(const std::string& path, const std::string& what);

}  // namespace ddplab::nn
