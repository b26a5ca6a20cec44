// ProcessGroupNCCL: the GPU process group (only in builds with DDP_CUDA).
//
// How it works:
//  1. Bootstrap: rank 0 calls ncclGetUniqueId and publishes the id in the store under
//     "<group>/nccl_id"; the others read it; every rank calls ncclCommInitRank on its GPU.
//  2. Each group has its own CUDA stream. A collective first makes that stream wait for an event
//     recorded on the caller's current stream (so it reads the gradients only once the kernels
//     that wrote them are done), then queues the NCCL call and records an end event.
//  3. Work::wait polls the end event (host side) up to the timeout, then makes the caller's
//     current stream wait on it. A timeout aborts the communicator (ncclCommAbort) and throws an
//     Error naming the collective, its sequence number and the group size: the process should
//     exit so the launcher restarts the job (as PyTorch's NCCL watchdog does).
//  4. The group keeps the tensors of unfinished collectives alive, because ddplab's caching
//     allocator reuses a freed block on its allocation stream without knowing our NCCL stream
//     still reads it (PyTorch uses recordStream for the same reason).
// No CUDA or NCCL header is included here (they are slow to compile); see the .cpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace ddplab::distributed {

struct NcclOptions {
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  std::string group_name = "nccl_pg";  // store prefix; every rank must pass the same
  int device = 0;                      // the CUDA device of this rank (usually LOCAL_RANK)
};

class ProcessGroupNCCL : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                   const NcclOptions& options = {});
  ~ProcessGroupNCCL() override;
  ProcessGroupNCCL(const ProcessGroupNCCL&) = delete;
  ProcessGroupNCCL& operator=(const ProcessGroupNCCL&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "nccl"; }
  Device device() const override;

  uint64_t sequence_number() const override;
  std::chrono::milliseconds timeout() const override;

  struct State;  // defined in process_group_nccl.cpp

 protected:
  // Every reducible dtype natively; Avg is ncclAvg (on integers it truncates, as on Gloo).
  std::shared_ptr<Work> do_all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> do_broadcast(const Tensor& t, int root) override;
  // A group of `size` broadcasts, one per root, straight into the outputs (no staging buffer).
  std::shared_ptr<Work> do_all_gather(const std::vector<Tensor>& outputs,
                                      const Tensor& input) override;
  // A group of `size` reduces, rank r's result into its output.
  std::shared_ptr<Work> do_reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                          ReduceOp op) override;
  // A one-element all-reduce on the group's stream, waited for by the host in Work::wait.
  std::shared_ptr<Work> do_barrier() override;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ddplab::distributed
