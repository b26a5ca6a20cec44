// Process groups: the collectives every rank of a job calls together.
//
// A ProcessGroup is one communicator over `size()` ranks. Each collective is asynchronous: it
// returns a Work handle at once and runs in the background (Gloo: a worker thread; NCCL: a CUDA
// stream), so DDP can launch a bucket's all-reduce and keep computing gradients. Every rank must
// call the same collectives in the same order; each call gets a sequence number, which timeouts
// and errors report so a hang can be traced to the collective that did not match.
//
// This header is the interface only. The backends are process_group_gloo.h (CPU) and
// process_group_nccl.h (GPU); init_process_group.h picks one and creates the group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ddplab::distributed {

// How all_reduce and reduce_scatter combine the ranks' values, element by element. Avg is the
// sum divided by size(); on integer dtypes the division truncates toward zero, like C++'s `/`
// (the same on Gloo and NCCL: NCCL's integer ncclAvg divides the same way).
enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Default collective timeout: 30 minutes, as in PyTorch. init_process_group also reads
// DDPLAB_COLLECTIVE_TIMEOUT (seconds); see init_process_group.h.
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

// The interface every backend implements. The public collectives are not virtual: each checks
// its arguments here, once for all backends (so Gloo and NCCL reject a bad call with the same
// message, naming the collective, this rank, and the dtype and shape of the offending tensor),
// then calls the backend's do_* method. A rejected call uses no sequence number. The base also
// records every collective in the group's flight recorder (flight_recorder.h).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "gloo", "nccl"
  // Where every tensor given to this group must live: the CPU (Gloo), this rank's GPU (NCCL).
  virtual Device device() const = 0;

  // Every tensor must be contiguous and on device(). all_reduce and reduce_scatter reduce
  // float32, float64, float16, bfloat16, int64, int32 and uint8; broadcast and all_gather copy
  // bytes, so any dtype works.

  // In place on `t`: every rank ends with the reduction of every rank's `t`.
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // In place: every rank's `t` becomes rank `root`'s.
  std::shared_ptr<Work> broadcast(const Tensor& t, int root = 0);
  // outputs[r] receives rank r's `input`; size() outputs, each of the input's dtype and numel.
  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input);
  // `output` receives the reduction of every rank's inputs[rank()]; size() inputs, each of the
  // output's dtype and numel.
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::Sum);
  // Completes once every rank has called it.
  std::shared_ptr<Work> barrier();

  // The number of collectives issued so far (the next one's sequence number).
  virtual uint64_t sequence_number() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // This group's last collectives (null when the backend did not create a recorder).
  std::shared_ptr<FlightRecorder> flight_recorder() const { return recorder_; }

 protected:
  // Called by a backend's constructor once rank(), size() and backend_name() answer: creates
  // the recorder (capacity from DDPLAB_FLIGHT_RECORDER_SIZE). The backend then reports
  // started() and finished() of each sequence number; issuing is recorded here.
  void init_flight_recorder(const std::string& group_name);

  // What a backend implements; called only with arguments the public methods have checked.
  virtual std::shared_ptr<Work> do_all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_broadcast(const Tensor& t, int root) = 0;
  virtual std::shared_ptr<Work> do_all_gather(const std::vector<Tensor>& outputs,
                                              const Tensor& input) = 0;
  virtual std::shared_ptr<Work> do_reduce_scatter(const Tensor& output,
                                                  const std::vector<Tensor>& inputs,
                                                  ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_barrier() = 0;

 private:
  // Runs `launch` (a do_* call) and records it as issued under the sequence number it takes.
  std::shared_ptr<Work> issue(const char* op, const std::string& dtype, const std::string& sizes,
                              const std::function<std::shared_ptr<Work>()>& launch);

  std::shared_ptr<FlightRecorder> recorder_;
  // Held from reading sequence_number() until do_* took it, so the recorded seq is the real one
  // even when two threads issue collectives (which every rank must then order the same way).
  std::mutex issue_mu_;
};

}  // namespace ddplab::distributed
