// The flags of examples/train, their checks and the effective config (see train_config.h).
#include "examples/train_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "examples/cli_config.h"
#include "models/models.h"
#include "nn/checkpoint.h"
#include "tensor/error.h"

namespace ddplab::train {

namespace {

// --logdir, --trace-dir and the thresholds of the epoch summary's warnings.
void add_monitoring_flags(CLI::App& app, Config& c) {
  app.add_option("--logdir", c.logdir, "write TensorBoard event files here (docs/monitoring.md)");
  app.add_option("--trace-dir", c.trace_dir,
                 "write a Chrome trace per rank here (DIR/rank<r>.json; tools/merge-traces)");
  app.add_option("--comm-wait-warn", c.comm_wait_warn,
                 "DDP: warn when this share of step time waits on communication (0: never)")
      ->capture_default_str();
  app.add_option("--allreduce-warn-ms", c.allreduce_warn_ms,
                 "DDP: warn when the mean all-reduce takes longer (ms; 0: never)")
      ->capture_default_str();
}

// In the order --help lists them.
void add_flags(CLI::App& app, Config& c) {
  app.option_defaults()->always_capture_default();  // --help and the effective config show them
  std::string models_list;
  for (const auto& m : models::available()) models_list += " " + m;
  app.add_option("--model", c.model, "model name:" + models_list)->capture_default_str();
  app.add_option("--dataset", c.dataset, "cifar10|cifar100|fmnist|mnist|folder")
      ->check(CLI::IsMember({"cifar10", "cifar100", "fmnist", "mnist", "folder"}))
      ->capture_default_str();
  app.add_option("--data-dir", c.data_dir,
                 "dataset folder (default: data/<dataset>; fmnist: Debian's location)");
  app.add_option("--epochs", c.epochs, "epochs")->capture_default_str();
  app.add_option("--max-steps", c.max_steps, "stop after this many steps (0: no limit)");
  app.add_option("--batch-size", c.batch_size, "batch size")->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "L2 weight decay")->capture_default_str();
  app.add_option("--schedule", c.schedule, "constant|step|multistep|cosine|onecycle")
      ->check(CLI::IsMember({"constant", "step", "multistep", "cosine", "onecycle"}))
      ->capture_default_str();
  app.add_option("--warmup-epochs", c.warmup_epochs, "linear warm-up (fractions allowed)");
  app.add_option("--seed", c.seed, "seed of init, shuffle and augmentation")->capture_default_str();
  app.add_option("--device", c.device, "cpu|cuda[:N]")->capture_default_str();
  app.add_option("--threads", c.threads, "CPU threads (0: library default)");
  app.add_flag("--no-augment", c.no_augment, "no random crop/flip");
  app.add_flag("--no-shuffle", c.no_shuffle, "visit examples in file order");
  app.add_option("--init-from", c.init_from, "start from a safetensors state_dict");
  app.add_option("--save", c.save, "write the final state_dict (safetensors) here");
  app.add_option("--metrics", c.metrics,
                 "append one row per epoch to this file: JSON lines, or CSV if it ends in .csv");
  app.add_option("--num-workers", c.num_workers, "data loading threads")->capture_default_str();
  app.add_option("--subset", c.subset, "train on the first N examples only (quick runs)");
  app.add_flag("--any-record-count", c.any_record_count,
               "CIFAR: accept files with other than the official record counts (test files)");
  app.add_option("--test-subset", c.test_subset,
                 "evaluate on the first N test examples only (quick runs, tests)");
  app.add_option("--accumulation-steps", c.accumulation_steps,
                 "micro-batches of --batch-size per optimizer step (DDP: one all-reduce per step)")
      ->capture_default_str();
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "clip the gradients' total 2-norm to this (0: no clipping)");
  app.add_option("--grad-norm-warn", c.grad_norm_warn,
                 "warn when the gradient norm exceeds this (0: never)")
      ->capture_default_str();
  app.add_flag("--sync-bn", c.sync_bn,
               "DDP: BatchNorm2d -> SyncBatchNorm (statistics over all ranks)");
  app.add_flag("--grad-scaler", c.grad_scaler,
               "dynamic loss scaling (GradScaler; overflowing steps are skipped)");
  app.add_flag("--zero", c.zero,
               "DDP: ZeRO-1, each rank keeps the SGD momentum of its shard only (docs/zero.md)");
  app.add_option("--collective-timeout", c.collective_timeout,
                 "DDP: seconds a collective waits for the other ranks (default 1800)");
  app.add_option("--amp", c.amp, "mixed precision: conv and linear in bf16|fp16 (docs/training.md)")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--comm-hook", c.comm_hook, "DDP: gradient communication none|fp16|bf16|powersgd")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd"}))
      ->capture_default_str();
  app.add_option("--powersgd-rank", c.powersgd_rank, "DDP: PowerSGD rank")->capture_default_str();
  app.add_option("--powersgd-start-iter", c.powersgd_start_iter,
                 "DDP: steps of plain all-reduce before PowerSGD starts")
      ->capture_default_str();
  app.add_option("--even-shards", c.even_shards,
                 "DDP: on: pad so every rank has the same batches; off: each rank exactly its "
                 "share, uneven ends handled by distributed::Join")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_monitoring_flags(app, c);
  app.add_flag("--deterministic", c.deterministic,
               "bitwise reproducible CPU training (fixed thread count; docs/checkpoints.md)");
  add_checkpoint_flags(app, c.checkpoint);
  cli::add_config_option(app);  // --config FILE: the same keys in JSON or TOML
}

// Every output path, checked before any data is loaded so that a typo fails at once, not after
// an epoch (or never: an ofstream on a missing folder writes nothing). The error names the flag;
// empty when all is well.
std::string check_output_paths(const Config& c) {
  try {
    if (!c.save.empty()) nn::check_output_file(c.save, "--save");
    if (!c.metrics.empty()) nn::check_output_file(c.metrics, "--metrics");
    if (!c.checkpoint.dir.empty()) {
      nn::check_output_dir(c.checkpoint.dir, "--checkpoint-dir", /*create=*/true);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::optional<int> parse_flags(int argc, char** argv, Config& c, std::string& effective_config) {
  CLI::App app{"ddplab: train an image classifier"};
  add_flags(app, c);
  // CLI11 would only list an unknown flag; name the nearest known one too.
  if (const auto unknown = cli::unknown_flags(app, argc, argv); !unknown.empty()) {
    for (const auto& m : unknown) std::cerr << "error: " << m << "\n";
    std::cerr << "Run with --help for the list of flags.\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help, or the error
    return rc == 0 ? 0 : 2;      // a bad command line: 2, as every other flag error
  }
  if (const std::string err = validate(c); !err.empty()) {
    std::cerr << "error: " << err << "\n";
    return 2;
  }
  effective_config = cli::effective_config(app);
  if (const std::string err = check_output_paths(c); !err.empty()) {
    std::cerr << "error: " << err << "\n";
    return 2;
  }
  return std::nullopt;
}

std::string validate(const Config& c) {
  std::ostringstream err;
  const std::vector<std::string> models = models::available();
  if (std::find(models.begin(), models.end(), c.model) == models.end()) {
    err << "--model: unknown model '" << c.model << "'; the models are:";
    for (const auto& m : models) err << " " << m;
  } else if (c.epochs < 1) {
    err << "--epochs must be at least 1 (got " << c.epochs << ")";
  } else if (c.batch_size < 1) {
    err << "--batch-size must be at least 1 (got " << c.batch_size << ")";
  } else if (c.subset < 0) {
    err << "--subset must be >= 0 (got " << c.subset << "); 0 trains on the whole training set";
  } else if (c.threads < 0) {
    err << "--threads must be >= 0 (got " << c.threads << "); 0 takes the library's default";
  } else if (c.num_workers < 0) {
    err << "--num-workers must be >= 0 (got " << c.num_workers
        << "); 0 loads data on the training thread";
  } else if (c.max_steps < 0) {
    err << "--max-steps must be >= 0 (got " << c.max_steps << "); 0 means no limit";
  } else if (c.accumulation_steps < 1) {
    err << "--accumulation-steps must be at least 1 (got " << c.accumulation_steps
        << "): it is the number of micro-batches whose gradients are summed before each "
           "optimizer step (1: no accumulation)";
  } else if (!(c.clip_grad_norm >= 0) || std::isinf(c.clip_grad_norm)) {  // also NaN
    err << "--clip-grad-norm must be a finite number >= 0 (got " << c.clip_grad_norm
        << "); 0 turns clipping off";
  } else if (!(c.grad_norm_warn >= 0)) {
    err << "--grad-norm-warn must be >= 0 (got " << c.grad_norm_warn
        << "); 0 turns the warning off";
  } else if (!(c.comm_wait_warn >= 0) || !(c.allreduce_warn_ms >= 0)) {
    err << "--comm-wait-warn and --allreduce-warn-ms must be >= 0 (got " << c.comm_wait_warn
        << " and " << c.allreduce_warn_ms << "); 0 turns the warning off";
  } else if (!(c.collective_timeout >= 0)) {
    err << "--collective-timeout must be >= 0 seconds (got " << c.collective_timeout
        << "); 0 takes DDPLAB_COLLECTIVE_TIMEOUT, else 30 minutes";
  } else if (c.powersgd_rank < 1 || c.powersgd_start_iter < 0) {
    err << "--powersgd-rank must be >= 1 and --powersgd-start-iter >= 0 (got " << c.powersgd_rank
        << " and " << c.powersgd_start_iter << ")";
  } else if (c.even_shards == "off" && c.accumulation_steps > 1) {
    // Join shadows whole iterations: a rank one batch short would close its last accumulation
    // group (and all-reduce) while the others still accumulate under no_sync.
    err << "--even-shards off cannot be combined with --accumulation-steps > 1: a rank with one "
           "batch fewer ends its last accumulation group at another batch than the others";
  } else if (c.even_shards == "off" && c.checkpoint.every_steps > 0) {
    err << "--even-shards off cannot be combined with --checkpoint-every-steps: a rank that has "
           "run "
           "out of batches is not at a step where the others save (use --checkpoint-every-epochs)";
  } else {
    return validate(c.checkpoint);
  }
  return err.str();
}

// The folders were checked at start; a failure here is reported, not fatal: the run itself does
// not depend on the copy.
void report_config(const std::string& toml, const Config& c) {
  std::printf("effective config:\n%s", toml.c_str());
  for (const std::string& dir : {c.checkpoint.dir, c.logdir, c.trace_dir}) {
    if (dir.empty()) continue;
    const std::string path = dir + "/config.toml";
    std::ofstream f(path);
    f << toml;
    f.close();
    if (!f) std::fprintf(stderr, "warning: could not write %s\n", path.c_str());
  }
}

}  // namespace ddplab::train
