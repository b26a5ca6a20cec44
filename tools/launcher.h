// The ddprun agent: one per node. Hosts (node 0) or joins the job store, agrees with the other
// nodes on each round, runs the local workers, and restarts every node's group together when any
// worker fails, up to max_restarts. See docs/launcher.md for the design.
#pragma once

#include <string>
#include <vector>

namespace ddplab::tools {

struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // the job store's port; 0 = pick a free one (standalone)
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  double rdzv_timeout_s = 300;  // how long nodes wait for each other at every round
  double stop_grace_s = 5;      // SIGTERM -> SIGKILL delay when stopping workers
  std::string log_dir;
  std::string run_id = "none";
  std::vector<std::string> argv;  // the worker program and its arguments
};

// Runs the job on this node; returns ddprun's exit code (0, or the failing worker's code).
int run_launcher(const LaunchConfig& cfg);

// CUDA GPUs visible on this machine, found without linking CUDA: /dev/nvidiaN device files, else
// the lines of `nvidia-smi -L`.
int detect_gpu_count();

}  // namespace ddplab::tools
