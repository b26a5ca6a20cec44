// ProcessGroupNCCL: NCCL bootstrap through the store, one CUDA stream per group ordered after the
// caller's stream with events, and Work handles that poll with a timeout and abort the
// communicator when a peer never arrives. Compiled only when ddplab is built with CUDA.
#include "comm/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/flight_recorder.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/error.h"

namespace ddplab::distributed {

namespace {

using ms = std::chrono::milliseconds;

// ProcessGroup has checked that the dtype is reducible (process_group.cpp): every one maps.
ncclDataType_t nccl_dtype(DType dt) {
  switch (dt) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Int64:
      return ncclInt64;
    case DType::Int32:
      return ncclInt32;
    case DType::UInt8:
      return ncclUint8;
    default:
      DDP_FAIL("the nccl backend has no reduction for dtype " << dtype_name(dt));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      // NCCL >= 2.10. Floating dtypes: scaled by 1/size in the reduction's own precision.
      // Integers: the sum, then a division that truncates toward zero, as Gloo's Avg.
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  DDP_FAIL("unknown ReduceOp");
}

}  // namespace

struct ProcessGroupNCCL::State {
  int rank = 0, size = 1, device = 0;
  ms timeout{0};
  std::string name;
  ncclComm_t comm = nullptr;
  gpu::Stream stream;  // this group's NCCL stream
  void* barrier_buf = nullptr;
  std::mutex mu;
  uint64_t next_seq = 0;
  std::string broken;  // set once the communicator was aborted
  // Unfinished collectives with their tensors (see the header, point 4).
  std::deque<std::shared_ptr<Work>> in_flight;  // NcclWork objects
  // The ProcessGroup base's recorder: "started" when enqueued on the stream, "completed" when
  // the end event passed.
  std::shared_ptr<FlightRecorder> recorder;

  std::string describe(const std::string& what, uint64_t seq, const std::string& cause) const {
    std::ostringstream os;
    os << "ProcessGroupNCCL '" << name << "': " << what << " (seq " << seq << ") on rank " << rank
       << " of a group of " << size << " ranks (cuda:" << device << ") " << cause
       << ". NCCL cannot tell which ranks did not arrive; merge the ranks' flight-recorder dumps "
          "(tools/flight_merge.py) or look for the rank whose log stops before seq "
       << seq << ".";
    if (recorder) {
      recorder->finished(seq, cause);
      const std::string path = recorder->dump(what + " seq " + std::to_string(seq) + ": " + cause);
      if (!path.empty()) os << " Flight recorder dump: " << path << ".";
    }
    os << " The communicator was aborted: let the error end the process (a non-zero exit makes "
          "ddprun restart the job).";
    write_hang_report(rank, what, seq, {}, os.str());
    return os.str();
  }
  void abort(const std::string& why) {
    // Called with mu held. ncclCommAbort frees the communicator and makes blocked kernels exit.
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    if (broken.empty()) broken = why;
  }
};

namespace {

class NcclWork : public Work {
 public:
  NcclWork(std::string name, uint64_t seq, std::shared_ptr<ProcessGroupNCCL::State> state,
           std::vector<Tensor> tensors)
      : name_(std::move(name)), seq_(seq), state_(std::move(state)), tensors_(std::move(tensors)) {}

  gpu::Event& end() { return end_; }

  void wait(ms timeout) override {
    const ms limit = timeout.count() > 0 ? timeout : state_->timeout;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    // Poll instead of cudaEventSynchronize: a blocking sync on a collective whose peer never
    // comes would never return, and the timeout is the whole point.
    while (!poll()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::lock_guard<std::mutex> lock(state_->mu);
        std::ostringstream cause;
        cause << "did not finish within " << limit.count() << " ms";
        std::string msg = state_->describe(name_, seq_, cause.str());
        state_->abort(msg);
        set_error(msg);
        throw Error(msg);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::string err = error();
    if (!err.empty()) throw Error(err);
    // The caller's stream continues only after the collective (a no-op wait on the GPU by now,
    // but it keeps the order right if wait is ever made non-blocking).
    end_.wait(gpu::current_stream(state_->device));
  }

  bool is_completed() override { return poll(); }
  std::string error() override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  bool poll() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ || !error_.empty()) return true;
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->broken.empty() || state_->comm == nullptr) {
        set_error(state_->broken.empty() ? "communicator aborted" : state_->broken);
        return true;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(state_->comm, &async);
      if (async != ncclSuccess) {
        std::string msg =
            state_->describe(name_, seq_, std::string("failed: ") + ncclGetErrorString(async));
        state_->abort(msg);
        set_error(msg);
        return true;
      }
    }
    return reached_end();
  }

 public:
  // True once the end event passed; then the tensors are released. Takes no group lock, so the
  // group may call it while holding its own.
  bool reached_end() {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    if (!end_.query()) return false;
    done_ = true;
    if (state_->recorder) state_->recorder->finished(seq_);
    tensors_.clear();
    return true;
  }

 private:
  void set_error(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = std::move(e);
  }

  std::string name_;
  uint64_t seq_;
  std::shared_ptr<ProcessGroupNCCL::State> state_;
  std::vector<Tensor> tensors_;
  gpu::Event end_;
  std::mutex mu_;
  bool done_ = false;
  std::string error_;
};

}  // namespace

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                                   const NcclOptions& options)
    : state_(std::make_shared<State>()) {
  DDP_CHECK(store != nullptr, "ProcessGroupNCCL: a store is required");
  DDP_CHECK(size >= 1 && rank >= 0 && rank < size,
            "ProcessGroupNCCL: rank " << rank << " is outside a group of size " << size);
  gpu::require_device(options.device);
  State& st = *state_;
  st.rank = rank;
  st.size = size;
  st.device = options.device;
  st.timeout = options.timeout;
  st.name = options.group_name;
  PrefixStore pstore(st.name, std::move(store));

  // Bootstrap: the unique id is 128 opaque bytes naming rank 0's listening socket.
  ncclUniqueId id;
  if (rank == 0) {
    DDP_NCCL_CHECK(ncclGetUniqueId(&id));
    pstore.set("nccl_id", std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id),
                                               reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    std::vector<uint8_t> bytes = pstore.get("nccl_id");
    DDP_CHECK(bytes.size() == sizeof(id), "ProcessGroupNCCL: the store's nccl_id has "
                                              << bytes.size() << " bytes, expected " << sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  gpu::DeviceGuard guard(options.device);
  DDP_NCCL_CHECK(ncclCommInitRank(&st.comm, size, id, rank));
  st.stream = gpu::Stream::create(options.device);
  DDP_CUDA_CHECK(cudaMalloc(&st.barrier_buf, sizeof(float)));
  init_flight_recorder(st.name);
  st.recorder = flight_recorder();
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.comm != nullptr) {
    // Finish queued work first; ncclCommDestroy must not run under in-flight collectives.
    cudaStreamSynchronize(st.stream.handle());
    ncclCommDestroy(st.comm);
    st.comm = nullptr;
  }
  if (st.barrier_buf != nullptr) cudaFree(st.barrier_buf);
}

int ProcessGroupNCCL::rank() const {
  return state_->rank;
}
int ProcessGroupNCCL::size() const {
  return state_->size;
}
Device ProcessGroupNCCL::device() const {
  return cuda(state_->device);
}
std::chrono::milliseconds ProcessGroupNCCL::timeout() const {
  return state_->timeout;
}
uint64_t ProcessGroupNCCL::sequence_number() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->next_seq;
}

namespace {

// The common frame of every collective: order after the caller's stream, run `body` on the
// group's stream, record the end event, remember the tensors until done.
template <class Body>
std::shared_ptr<Work> launch(const std::shared_ptr<ProcessGroupNCCL::State>& state,
                             const char* what, std::vector<Tensor> tensors, Body body) {
  ProcessGroupNCCL::State& st = *state;
  std::lock_guard<std::mutex> lock(st.mu);
  const uint64_t seq = st.next_seq++;
  DDP_CHECK(
      st.broken.empty() && st.comm != nullptr,
      what << " (seq " << seq << ") cannot run: the communicator was aborted after: " << st.broken);
  // Forget the finished collectives (and release their tensors).
  while (!st.in_flight.empty() && static_cast<NcclWork&>(*st.in_flight.front()).reached_end())
    st.in_flight.pop_front();

  gpu::DeviceGuard guard(st.device);
  auto work = std::make_shared<NcclWork>(what, seq, state, std::move(tensors));
  gpu::Event ready;
  ready.record(gpu::current_stream(st.device));
  ready.wait(st.stream);
  body(st.comm, static_cast<cudaStream_t>(st.stream.handle()));
  work->end().record(st.stream);
  if (st.recorder) st.recorder->started(seq, what);
  st.in_flight.push_back(work);
  return work;
}

}  // namespace

// ProcessGroup's public methods checked the arguments (process_group.cpp) before calling these.

std::shared_ptr<Work> ProcessGroupNCCL::do_all_reduce(const Tensor& t, ReduceOp op) {
  const ncclDataType_t dt = nccl_dtype(t.dtype());
  const ncclRedOp_t rop = nccl_op(op);
  return launch(state_, "all_reduce", {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    DDP_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), dt,
                                 rop, comm, s));
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::do_broadcast(const Tensor& t, int root) {
  return launch(state_, "broadcast", {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.nbytes() == 0) return;
    DDP_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, comm, s));
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::do_all_gather(const std::vector<Tensor>& outputs,
                                                      const Tensor& input) {
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  const int me = rank();
  return launch(state_, "all_gather", keep, [&](ncclComm_t comm, cudaStream_t s) {
    if (input.nbytes() == 0) return;
    DDP_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
      const void* src = r == me ? input.raw_data() : outputs[r].raw_data();
      DDP_NCCL_CHECK(
          ncclBroadcast(src, outputs[r].raw_data(), input.nbytes(), ncclUint8, r, comm, s));
    }
    DDP_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::do_reduce_scatter(const Tensor& output,
                                                          const std::vector<Tensor>& inputs,
                                                          ReduceOp op) {
  const ncclDataType_t dt = nccl_dtype(output.dtype());
  const ncclRedOp_t rop = nccl_op(op);
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  const int me = rank();
  return launch(state_, "reduce_scatter", keep, [&](ncclComm_t comm, cudaStream_t s) {
    if (output.numel() == 0) return;
    DDP_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < static_cast<int>(inputs.size()); ++r) {
      // recvbuff is only written on the root; elsewhere any valid pointer does.
      void* recv = r == me ? output.raw_data() : inputs[r].raw_data();
      DDP_NCCL_CHECK(ncclReduce(inputs[r].raw_data(), recv, static_cast<size_t>(output.numel()), dt,
                                rop, r, comm, s));
    }
    DDP_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::do_barrier() {
  void* buf = state_->barrier_buf;
  return launch(state_, "barrier", {}, [&](ncclComm_t comm, cudaStream_t s) {
    DDP_NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s));
  });
}

}  // namespace ddplab::distributed
