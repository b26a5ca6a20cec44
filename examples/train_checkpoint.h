// Fault tolerance for examples/train: the checkpoint flags, resuming (also automatically after a
// launcher's restart), periodic checkpoints written by rank 0 once the ranks agree on the step,
// and rollback to the best checkpoint when the test accuracy drops. The checkpoint format and its
// guarantees are nn/checkpoint.h's; the flags and what they do: docs/checkpoints.md.
//
// Kept apart from train.cpp so that the training loop shows only the few places it calls in:
//
//   Checkpointing ckpt(options, pg);                 // before any data is loaded
//   auto resumed = ckpt.find_resume();               // the same file on every rank, or none
//   ... build the model: if (resumed) Checkpointing::restore_model(*net, resumed->state);
//   ... build optimizer, schedule, scaler, loader:   if (resumed) ckpt.restore(t, loop, ...);
//   every optimizer step:  ckpt.after_step(t, loop);
//   every epoch's end:     ckpt.after_epoch(t, loop, test_acc);   // may roll back
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "data/dataloader.h"
#include "nn/checkpoint.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace ddplab::train {

struct CheckpointOptions {
  std::string dir;  // "": no checkpoints
  int64_t every_steps = 0;
  int64_t every_epochs = 0;
  int keep = 3;
  // "auto" (newest valid checkpoint), "none", or a checkpoint file. Empty: "auto" after a
  // launcher's restart (TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT > 0), else "none".
  std::string resume;
  bool stop_on_save_error = false;
  double rollback_on_drop = 0;  // 0: no rollback
  double rollback_lr_factor = 1;
};

void add_checkpoint_flags(CLI::App& app, CheckpointOptions& o);
// The checks CLI11 cannot make alone; an error message, empty when all is well.
std::string validate(const CheckpointOptions& o);

// The training loop's own counters. A checkpoint carries them next to the components' states, so
// that a resumed epoch reports the loss and accuracy an uninterrupted one would.
struct LoopState {
  int64_t step = 0;  // optimizer steps so far
  int64_t epoch = 0;
  // The epoch in progress.
  int64_t micro = 0;  // micro-batches consumed (the data loader's position)
  int64_t epoch_steps = 0;
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  // The whole run.
  int64_t skipped_steps = 0;  // GradScaler overflows
  double grad_norm = 0;
  double best_acc = -1;  // rank 0: best test accuracy so far (--rollback-on-drop)
  int64_t best_epoch = -1;
  bool evaluated = false;  // this epoch's evaluation is done (an end-of-epoch checkpoint)

  // Starts `epoch` with zeroed counters, unless a checkpoint restored this epoch's counters.
  void begin_epoch(int64_t e);
  bool resume_pending = false;
};

// The pieces whose state a checkpoint holds, as the loop owns them.
struct Trainables {
  nn::Module& net;  // the model itself, not its DDP wrapper: PyTorch's names
  optim::Optimizer& opt;
  optim::LRScheduler& sched;
  optim::GradScaler& scaler;
  data::DataLoader& loader;
};

class Checkpointing {
 public:
  // Checks --checkpoint-dir (creating its last level) and removes the temporary files of a save
  // a crash interrupted, reporting them. pg: null when training alone.
  Checkpointing(CheckpointOptions options, std::shared_ptr<distributed::ProcessGroup> pg);

  bool enabled() const { return manager_ != nullptr; }

  // The checkpoint to resume from, the same file on every rank (rank 0 chooses, the others load
  // what it chose), or nullopt for a fresh start. Collective under DDP.
  std::optional<nn::CheckpointManager::Loaded> find_resume();
  // Before the DDP wrapper exists (its constructor broadcasts rank 0's weights).
  static void restore_model(nn::Module& net, const nn::TrainingState& st);
  // Optimizer, schedule, scaler, data position, generators and loop counters.
  void restore(Trainables& t, LoopState& loop, const nn::TrainingState& st) const;

  // Every rank, after each optimizer step: a checkpoint when --checkpoint-every-steps says so.
  void after_step(Trainables& t, const LoopState& loop);
  // Every rank, after the epoch's evaluation (test_acc is meaningful on rank 0 only): rollback
  // when the accuracy dropped, the best checkpoint when it rose, the epoch's checkpoint when
  // --checkpoint-every-epochs says so. Returns whether it rolled back.
  bool after_epoch(Trainables& t, LoopState& loop, double test_acc);

 private:
  // Collective: gathers every rank's generator state, so this is also where the ranks agree on
  // the step (all of them must reach it).
  nn::TrainingState capture(Trainables& t, const LoopState& loop) const;
  void save(const nn::TrainingState& st);  // rank 0 writes; all ranks learn whether to stop
  int64_t broadcast_from_rank0(int64_t value) const;
  bool main_rank() const { return !pg_ || pg_->rank() == 0; }

  CheckpointOptions options_;
  std::shared_ptr<distributed::ProcessGroup> pg_;
  std::unique_ptr<nn::CheckpointManager> manager_;
  int restart_count_ = 0;
};

// Test hooks, read from the environment; only for the tests in tests/distributed (documented in
// docs/checkpoints.md as test-only). planted_accuracy: DDPLAB_TEST_PLANT_ACCURACY_DROP=EPOCH makes
// that epoch's evaluation report 0.
double planted_accuracy(int64_t epoch, double test_acc);

}  // namespace ddplab::train
