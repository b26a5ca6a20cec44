// ddprun: launches N worker processes per node with torchrun's environment, restarts the whole
// job when a worker fails (up to --max-restarts), and never leaves a worker behind.
//
//   ddprun [flags] PROGRAM [ARGS...]        (see docs/launcher.md)
#include <CLI/CLI.hpp>
#include <iostream>

#include "tensor/error.h"
#include "tools/launcher.h"

using ddplab::tools::LaunchConfig;

namespace {

int parse_nproc(const std::string& s) {
  if (s == "gpu" || s == "auto") {
    int gpus = ddplab::tools::detect_gpu_count();
    if (gpus > 0) return gpus;
    DDP_CHECK(s == "auto",
              "ddprun: --nproc-per-node gpu, but no CUDA GPU was found (no "
              "/dev/nvidiaN and no nvidia-smi); use a number or 'auto'");
    return 1;  // auto without GPUs: one CPU worker
  }
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(s, &used);
  } catch (const std::exception&) {
  }
  DDP_CHECK(
      used == s.size() && n >= 1,
      "ddprun: --nproc-per-node expects a positive number, 'gpu' or 'auto', got '" << s << "'");
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddprun: launch data-parallel workers (torchrun-compatible environment)"};
  LaunchConfig cfg;
  std::string nproc = "1";
  bool standalone = false;
  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "workers on this node: a number, 'gpu' (one per CUDA GPU) or 'auto'");
  app.add_option("--nnodes", cfg.nnodes, "number of nodes")->check(CLI::PositiveNumber);
  app.add_option("--node-rank,--node_rank", cfg.node_rank, "this node's rank in [0, nnodes)");
  app.add_option("--master-addr,--master_addr", cfg.master_addr,
                 "address of node 0, where the job store listens");
  app.add_option("--master-port,--master_port", cfg.master_port, "port of the job store");
  app.add_flag("--standalone", standalone, "single node; the job store takes a free port");
  app.add_option("--max-restarts,--max_restarts", cfg.max_restarts,
                 "restarts of the whole job after a worker fails")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--monitor-interval,--monitor_interval", cfg.monitor_interval_s,
                 "seconds between checks of the workers")
      ->check(CLI::PositiveNumber);
  app.add_option("--rdzv-timeout", cfg.rdzv_timeout_s, "seconds to wait for all nodes each round");
  app.add_option("--stop-grace", cfg.stop_grace_s, "seconds between SIGTERM and SIGKILL");
  app.add_option("--log-dir,--log_dir", cfg.log_dir, "write each rank's output to DIR/rankN.log");
  app.add_option("--run-id,--run_id", cfg.run_id, "job id shared by all nodes");
  // Everything from the program name on belongs to the program, flags included.
  app.prefix_command();
  app.footer("Everything after PROGRAM is passed to it unchanged.");
  CLI11_PARSE(app, argc, argv);
  cfg.argv = app.remaining();
  try {
    DDP_CHECK(!cfg.argv.empty(), "ddprun: missing the PROGRAM to run (see --help)");
    DDP_CHECK(cfg.argv[0].rfind('-', 0) != 0, "ddprun: unknown flag '" << cfg.argv[0] << "'");
    cfg.nproc_per_node = parse_nproc(nproc);
    if (standalone) {
      DDP_CHECK(cfg.nnodes == 1,
                "ddprun: --standalone runs a single node, got --nnodes " << cfg.nnodes);
      cfg.node_rank = 0;
      cfg.master_addr = "127.0.0.1";
      cfg.master_port = 0;
    }
    return ddplab::tools::run_launcher(cfg);
  } catch (const ddplab::Error& e) {
    std::string msg = e.what();
    std::cerr << (msg.rfind("ddprun:", 0) == 0 ? "" : "ddprun: ") << msg << std::endl;
    return 1;
  }
}
