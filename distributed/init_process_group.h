// init_process_group: how a process joins a job. It reads its rank and the job's size from the
// launch environment (ddprun, torchrun or Slurm), meets the other ranks through a TCPStore on
// MASTER_ADDR:MASTER_PORT, and creates the process group of the chosen backend (Gloo for CPU
// tensors, NCCL for CUDA ones). This is the one file that knows every backend; the interface
// they share is distributed/process_group.h.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "distributed/process_group.h"
#include "distributed/store/store.h"
#include "tensor/device.h"

namespace ddplab::distributed {

struct InitOptions {
  std::string backend = "auto";  // "gloo", "nccl", or "auto": NCCL when the device is CUDA
  Device device = kCPU;          // where the tensors this group will reduce live
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // Rendezvous: when unset, read from the environment (RANK, WORLD_SIZE, MASTER_ADDR,
  // MASTER_PORT as torchrun/ddprun set them; or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID).
  int rank = -1;
  int world_size = -1;
  std::shared_ptr<Store> store;  // when given, used instead of MASTER_ADDR:MASTER_PORT
};

// Creates the process group for this process (rank 0 hosts the TCPStore on MASTER_PORT).
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// Rank/size facts from the environment, as set by ddprun, torchrun or Slurm.
struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;
  bool from_launcher = false;  // false when nothing in the environment described a job
};
LaunchEnv launch_env_from_environment();

}  // namespace ddplab::distributed
