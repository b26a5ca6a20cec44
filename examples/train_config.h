// The command line of examples/train: every flag's value in a Config, the checks CLI11 cannot make
// alone, and the effective configuration written beside the run's outputs. The flags and their
// defaults are listed in docs/training.md; `train --help` prints them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "examples/train_checkpoint.h"

namespace ddplab::train {

struct Config {
  std::string model = "resnet20";
  std::string dataset = "cifar10";
  std::string data_dir;
  int epochs = 1;
  int64_t max_steps = 0;  // 0: no limit
  int64_t batch_size = 128;
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string schedule = "cosine";
  double warmup_epochs = 0;
  uint64_t seed = 0;
  std::string device = "cpu";
  int threads = 0;
  bool no_augment = false;
  bool no_shuffle = false;
  std::string init_from, save, metrics;
  int num_workers = 2;
  int64_t subset = 0;
  bool any_record_count = false;   // CIFAR files of any size (small files made for tests)
  int64_t test_subset = 0;         // evaluate on the first N test examples (0: all)
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step
  double clip_grad_norm = 0;       // 0: no clipping
  double grad_norm_warn = 10;      // 0: no warning
  bool sync_bn = false;
  bool grad_scaler = false;
  bool zero = false;              // DDP: ZeRO-1, the momentum buffers sharded over the ranks
  double collective_timeout = 0;  // seconds; 0: DDPLAB_COLLECTIVE_TIMEOUT, else 30 min
  std::string amp;  // "" (float32), "bf16" or "fp16": autocast's dtype (nn/autocast.h)
  bool deterministic = false;
  CheckpointOptions checkpoint;  // --checkpoint-*, --resume, --rollback-* (fault tolerance)
  // Monitoring (docs/monitoring.md).
  std::string logdir, trace_dir;     // TensorBoard event files; Chrome traces per rank
  double comm_wait_warn = 0.10;      // warn when waiting on communication exceeds this share
  double allreduce_warn_ms = 100;    // warn when the mean all-reduce takes longer
  std::string comm_hook = "none";    // DDP: how buckets are averaged (ddp/comm_hooks/)
  int64_t powersgd_rank = 1;         // DDP: PowerSGD's matrix_approximation_rank
  int64_t powersgd_start_iter = 10;  // DDP: plain all-reduce for the first N steps (PyTorch: 1000)
  std::string even_shards = "on";    // DDP: off: no padding, uneven shards under a Join
};

// Reads the command line (and `--config FILE`) into `c` and checks it, before anything is loaded,
// so that a typo fails at once. Returns the status to exit with, with its message printed (0
// after --help, 2 for a wrong flag or value, an output folder that does not exist), or nullopt to
// go on; then `effective_config` holds every flag's value, defaults included, as TOML.
std::optional<int> parse_flags(int argc, char** argv, Config& c, std::string& effective_config);

// The checks CLI11 cannot make alone: an error message, empty when all is well.
std::string validate(const Config& c);

// Rank 0, at start: prints the effective config and writes it as `config.toml` into each output
// folder (--checkpoint-dir, --logdir, --trace-dir), so that the run's checkpoints and logs say how
// they were made; `--config FILE` repeats the run.
void report_config(const std::string& toml, const Config& c);

}  // namespace ddplab::train
