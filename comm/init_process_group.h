// init_process_group: how a process joins a job. It reads its rank and the job's size from the
// launch environment (ddprun, torchrun, Open MPI's mpirun, a PMI launcher such as MPICH's, or
// Slurm), meets the other ranks through a TCPStore on MASTER_ADDR:MASTER_PORT, checks that they
// agree on the world size, and creates the process group of the chosen backend (Gloo for CPU
// tensors, NCCL for CUDA ones). This is the one file that knows every backend; the interface
// they share is comm/process_group.h.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store/store.h"
#include "tensor/device.h"

namespace ddplab::distributed {

struct InitOptions {
  std::string backend = "auto";  // "gloo", "nccl", or "auto": NCCL when the device is CUDA
  Device device = kCPU;          // where the tensors this group will reduce live
  // How long a collective (and the rendezvous) may wait for the other ranks. Zero: the
  // environment's DDPLAB_COLLECTIVE_TIMEOUT (seconds), else kDefaultCollectiveTimeout (30 min).
  // As in PyTorch, an explicit value wins over the environment, which wins over the default.
  std::chrono::milliseconds timeout{0};
  // Rendezvous: when unset, read from the environment (see launch_env_from_environment).
  int rank = -1;
  int world_size = -1;
  std::shared_ptr<Store> store;  // when given, used instead of MASTER_ADDR:MASTER_PORT
  // While rank 0 waits for the others to arrive, it says which every `wait_report_interval`.
  std::chrono::milliseconds wait_report_interval{5000};
};

// Creates the process group for this process (rank 0 hosts the TCPStore on MASTER_PORT, unless
// torchrun's agent hosts one there: see LaunchEnv).
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// The collective timeout init_process_group uses when InitOptions::timeout is zero:
// DDPLAB_COLLECTIVE_TIMEOUT (seconds, may be fractional), else kDefaultCollectiveTimeout.
std::chrono::milliseconds collective_timeout_from_environment();

// Rank/size facts from the environment. The first launcher found wins, in this order:
//   torchrun / ddprun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI (mpirun)   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   PMI (MPICH, Intel)  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   Slurm (srun)        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, tasks per node
// MPI comes before Slurm because mpirun inside a Slurm allocation inherits the batch script's
// SLURM_PROCID (0 in every process), while its OMPI_* variables are per process.
// MASTER_ADDR and MASTER_PORT (default 29500) give the rendezvous; an MPI job whose processes
// span several machines must set MASTER_ADDR (the error says how), a one-machine job defaults to
// 127.0.0.1.
//
// torchrun's agent already hosts a (PyTorch) TCPStore on MASTER_ADDR:MASTER_PORT and says so
// with TORCHELASTIC_USE_AGENT_STORE=True: then every rank, rank 0 included, joins it as a client
// (TorchTCPStore) under the key prefix agent_store_prefix(restart_count), instead of rank 0
// hosting ddplab's store on a port that is already taken. See docs/launcher.md.
struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;
  bool from_launcher = false;    // false when nothing in the environment described a job
  std::string launcher;          // "torchrun", "mpi", "pmi", "slurm", or "" (none)
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True (torchrun)
};
LaunchEnv launch_env_from_environment();

// "/worker/attempt_<restart_count>": the prefix of a torchrun round's keys in the agent store
// (the one PyTorch's own workers used in earlier versions). The agent's store outlives restarts, and a round
// that read the last round's keys (Gloo addresses of dead processes) would hang or fail.
std::string agent_store_prefix(int restart_count);

// For a fatal error of a worker: writes `message` where the launcher looks for it, so its report
// shows it. Under torchrun that is TORCHELASTIC_ERROR_FILE, in the JSON of PyTorch's
// ErrorHandler; torchrun's "Root Cause" block then shows the message instead of "To enable
// traceback see ...". Returns false (and writes nothing) when no launcher asked for the file;
// never throws, since it runs while a program is already failing.
bool record_error_for_launcher(const std::string& message);

}  // namespace ddplab::distributed
