// The argument checks of every collective, written once for all backends: each public
// collective checks, then hands its arguments to the backend's do_* method. A mistake such as a
// non-contiguous gradient or a forgotten .to(device) thus reads the same on Gloo and NCCL, and
// is caught on the calling thread, before the collective takes a sequence number (the peers
// never see it).
#include "comm/process_group.h"

#include <sstream>
#include <string>

#include "tensor/error.h"

namespace ddplab::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

namespace {

// "all_reduce on rank 1 (gloo): ", the start of every message below.
std::string where(const ProcessGroup& pg, const char* collective) {
  std::ostringstream os;
  os << collective << " on rank " << pg.rank() << " (" << pg.backend_name() << "): ";
  return os.str();
}

// "the tensor (float32, shape [2, 3])"
std::string describe(const std::string& name, const Tensor& t) {
  return name + " (" + dtype_name(t.dtype()) + ", shape " + shape_str(t.shape()) + ")";
}

// What to do about a tensor on the wrong device.
std::string device_hint(Device group_device, Device tensor_device) {
  if (group_device.is_cpu()) return "use the nccl backend for CUDA tensors";
  if (tensor_device.is_cpu()) return "use the gloo backend for CPU tensors";
  std::ostringstream os;
  os << "move it to " << group_device << ", the GPU this rank's group was created on";
  return os.str();
}

void check_tensor(const ProcessGroup& pg, const char* collective, const std::string& name,
                  const Tensor& t) {
  DDP_CHECK(t.defined(), where(pg, collective) << name << " is undefined (an empty Tensor handle)");
  DDP_CHECK(t.device() == pg.device(), where(pg, collective)
                                           << describe(name, t) << " is on " << t.device()
                                           << ", but this group works on " << pg.device()
                                           << " tensors; " << device_hint(pg.device(), t.device()));
  DDP_CHECK(t.is_contiguous(),
            where(pg, collective) << describe(name, t) << " with strides " << shape_str(t.strides())
                                  << " is not contiguous; pass ops::contiguous(t) and copy the "
                                     "result back");
}

// The dtypes both backends can add, compare and divide (NCCL natively; Gloo natively, or for
// float16 and bfloat16 by widening to float32).
bool is_reducible(DType dt) {
  switch (dt) {
    case DType::Float32:
    case DType::Float64:
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int64:
    case DType::Int32:
    case DType::UInt8:
      return true;
    case DType::Bool:
      return false;
  }
  return false;
}

void check_reducible(const ProcessGroup& pg, const char* collective, const std::string& name,
                     const Tensor& t) {
  DDP_CHECK(is_reducible(t.dtype()),
            where(pg, collective) << describe(name, t) << " cannot be reduced: its dtype is not "
                                  << "one of float32, float64, float16, bfloat16, int64, int32, "
                                     "uint8");
}

// all_gather's outputs and reduce_scatter's inputs: one tensor per rank, each like `like`.
void check_one_per_rank(const ProcessGroup& pg, const char* collective, const char* list_name,
                        const std::vector<Tensor>& list, const std::string& like_name,
                        const Tensor& like) {
  DDP_CHECK(static_cast<int>(list.size()) == pg.size(),
            where(pg, collective) << "expected " << pg.size() << " " << list_name
                                  << " tensors (one per rank), got " << list.size());
  for (size_t r = 0; r < list.size(); ++r) {
    const std::string name = std::string(list_name) + "[" + std::to_string(r) + "]";
    check_tensor(pg, collective, name, list[r]);
    DDP_CHECK(list[r].dtype() == like.dtype() && list[r].numel() == like.numel(),
              where(pg, collective)
                  << describe(name, list[r]) << " does not match " << describe(like_name, like)
                  << ": every " << list_name << " tensor needs its dtype and number of elements");
  }
}

// "8 x [2, 3]": the shape the flight recorder shows for a list of one tensor per rank.
std::string list_sizes(size_t count, const Tensor& each) {
  return std::to_string(count) + " x " + shape_str(each.shape());
}

}  // namespace

void ProcessGroup::init_flight_recorder(const std::string& group_name) {
  recorder_ = std::make_shared<FlightRecorder>(rank(), size(), backend_name(), group_name,
                                               flight_recorder_size_from_environment());
}

std::shared_ptr<Work> ProcessGroup::issue(const char* op, const std::string& dtype,
                                          const std::string& sizes,
                                          const std::function<std::shared_ptr<Work>()>& launch) {
  std::lock_guard<std::mutex> lock(issue_mu_);
  if (!recorder_) return launch();
  const uint64_t seq = sequence_number();
  recorder_->issued(seq, op, dtype, sizes);
  try {
    return launch();
  } catch (const std::exception& e) {
    recorder_->finished(seq, e.what());
    throw;
  }
}

std::shared_ptr<Work> ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  check_tensor(*this, "all_reduce", "the tensor", t);
  check_reducible(*this, "all_reduce", "the tensor", t);
  return issue("all_reduce", dtype_name(t.dtype()), shape_str(t.shape()),
               [&] { return do_all_reduce(t, op); });
}

std::shared_ptr<Work> ProcessGroup::broadcast(const Tensor& t, int root) {
  check_tensor(*this, "broadcast", "the tensor", t);
  DDP_CHECK(root >= 0 && root < size(), where(*this, "broadcast")
                                            << "root " << root << " is outside a group of size "
                                            << size());
  return issue("broadcast", dtype_name(t.dtype()), shape_str(t.shape()),
               [&] { return do_broadcast(t, root); });
}

std::shared_ptr<Work> ProcessGroup::all_gather(const std::vector<Tensor>& outputs,
                                               const Tensor& input) {
  check_tensor(*this, "all_gather", "the input", input);
  check_one_per_rank(*this, "all_gather", "output", outputs, "the input", input);
  return issue("all_gather", dtype_name(input.dtype()), list_sizes(outputs.size(), input),
               [&] { return do_all_gather(outputs, input); });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(const Tensor& output,
                                                   const std::vector<Tensor>& inputs, ReduceOp op) {
  check_tensor(*this, "reduce_scatter", "the output", output);
  check_reducible(*this, "reduce_scatter", "the output", output);
  check_one_per_rank(*this, "reduce_scatter", "input", inputs, "the output", output);
  return issue("reduce_scatter", dtype_name(output.dtype()), list_sizes(inputs.size(), output),
               [&] { return do_reduce_scatter(output, inputs, op); });
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  return issue("barrier", "", "", [&] { return do_barrier(); });
}

}  // namespace ddplab::distributed
