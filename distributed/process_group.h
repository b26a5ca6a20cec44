// Process groups: the collectives every rank of a job calls together.
//
// A ProcessGroup is one communicator over `size()` ranks. Each collective is asynchronous: it
// returns a Work handle at once and runs in the background (Gloo: a worker thread; NCCL: a CUDA
// stream), so DDP can launch a bucket's all-reduce and keep computing gradients. Every rank must
// call the same collectives in the same order; each call gets a sequence number, which timeouts
// and errors report so a hang can be traced to the collective that did not match.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/store/store.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Default collective timeout: 30 minutes, as in PyTorch.
constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{30 * 60 * 1000};

// A running collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done. Throws ddplab::Error if the collective failed or did not finish within
  // `timeout` (default: the group's timeout); the message names the collective, its sequence
  // number, the group size and, where known, the ranks that did not arrive.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) = 0;
  virtual bool is_completed() = 0;
  // The failure, empty when none (yet).
  virtual std::string error() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "gloo", "nccl"

  // In place on `t` (contiguous). Avg divides by size() after the sum.
  virtual std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  virtual std::shared_ptr<Work> broadcast(const Tensor& t, int root = 0) = 0;
  // outputs[r] receives rank r's `input` (all the same shape).
  virtual std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs,
                                           const Tensor& input) = 0;
  // `output` receives the reduction of every rank's inputs[rank()].
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output,
                                               const std::vector<Tensor>& inputs,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // The number of collectives issued so far (the next one's sequence number).
  virtual uint64_t sequence_number() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

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
