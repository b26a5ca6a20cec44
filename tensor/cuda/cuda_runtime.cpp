// Device discovery, device guards, streams and events (see cuda_runtime.h).
#include "tensor/cuda/cuda_runtime.h"

#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "tensor/backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/error.h"

namespace ddplab {
namespace gpu {

namespace {

struct Probe {
  int count = 0;
  std::string reason;  // empty when CUDA is usable
};

// Asked once per process. Never call CUDA before this says yes: on a machine without a driver the
// first failure is sticky, and the runtime keeps answering error 35 forever.
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;  // cudaGetDeviceCount leaves it unwritten on failure
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      std::ostringstream os;
      os << "cudaGetDeviceCount failed with CUDA error " << static_cast<int>(e) << " ("
         << cudaGetErrorName(e) << ": " << cudaGetErrorString(e) << ")";
      r.reason = os.str();
      r.count = 0;
    } else if (n == 0) {
      r.reason = "cudaGetDeviceCount found no CUDA device";
    } else {
      r.count = n;
    }
    return r;
  }();
  return p;
}

}  // namespace

bool is_available() {
  return probe().count > 0;
}
int device_count() {
  return probe().count;
}
std::pair<int, int> compute_capability(int index) {
  require_device(index);
  int major = 0, minor = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  return {major, minor};
}

const std::string& unavailable_reason() {
  return probe().reason;
}

void require_device(int index) {
  const Probe& p = probe();
  DDP_CHECK(p.count > 0, "cuda:" << index
                                 << " requested, but no usable GPU is present: " << p.reason
                                 << ". Use the CPU (device \"cpu\"), or check the GPU and driver "
                                    "with nvidia-smi.");
  DDP_CHECK(index >= 0 && index < p.count,
            "cuda:" << index << " requested, but this machine has " << p.count
                    << " CUDA device(s) (cuda:0 .. cuda:" << p.count - 1 << ")");
}

// ---- DeviceGuard
// ---------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int index) {
  require_device(index);
  DDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) DDP_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  // A destructor must not throw; restoring is best effort.
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

// ---- Stream
// --------------------------------------------------------------------------------------

Stream Stream::create(int device) {
  DeviceGuard g(device);
  cudaStream_t s = nullptr;
  // Blocking (not cudaStreamNonBlocking): work on a side stream still orders with the default
  // stream, the simple rule a reader expects; explicit events are still needed between side
  // streams.
  DDP_CUDA_CHECK(cudaStreamCreate(&s));
  return Stream(device, s);
}

void Stream::synchronize() const {
  DeviceGuard g(device_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

bool Stream::query() const {
  DeviceGuard g(device_);
  cudaError_t e = cudaStreamQuery(handle_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to leave behind
    return false;
  }
  DDP_CUDA_CHECK(e);
  return true;
}

namespace {
// Per thread, as in PyTorch: a StreamGuard on one thread does not redirect another's work.
thread_local std::unordered_map<int, cudaStream_t> tls_current_stream;
}  // namespace

Stream current_stream(int device) {
  require_device(device);
  auto it = tls_current_stream.find(device);
  return Stream(device, it == tls_current_stream.end() ? nullptr : it->second);
}

void set_current_stream(const Stream& s) {
  require_device(s.device());
  tls_current_stream[s.device()] = s.handle();
}

StreamGuard::StreamGuard(const Stream& s)
    : previous_(current_stream(s.device())), device_guard_(s.device()) {
  set_current_stream(s);
}

StreamGuard::~StreamGuard() {
  tls_current_stream[previous_.device()] = previous_.handle();
}

// ---- Event
// ---------------------------------------------------------------------------------------

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(o.device_), timing_(o.timing_) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(o.event_, nullptr);
    device_ = o.device_;
    timing_ = o.timing_;
  }
  return *this;
}

void Event::record(const Stream& s) {
  DeviceGuard g(s.device());
  if (event_ == nullptr) {
    // Created on first record, on the stream's device: an event belongs to one device.
    DDP_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = s.device();
  }
  DDP_CHECK(device_ == s.device(), "Event::record: event belongs to cuda:"
                                       << device_ << ", stream to cuda:" << s.device());
  DDP_CUDA_CHECK(cudaEventRecord(event_, s.handle()));
}

void Event::wait(const Stream& s) const {
  if (event_ == nullptr) return;  // never recorded: nothing to wait for
  DeviceGuard g(s.device());
  DDP_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), event_, 0));
}

bool Event::query() const {
  if (event_ == nullptr) return true;
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  DDP_CUDA_CHECK(e);
  return true;
}

void Event::synchronize() const {
  if (event_ != nullptr) DDP_CUDA_CHECK(cudaEventSynchronize(event_));
}

float Event::elapsed_time(const Event& end) const {
  DDP_CHECK(timing_ && end.timing_, "Event::elapsed_time: both events need enable_timing=true");
  DDP_CHECK(event_ != nullptr && end.event_ != nullptr,
            "Event::elapsed_time: both events must be recorded first");
  float ms = 0;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

void synchronize(int device) {
  DeviceGuard g(device);
  DDP_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace gpu

// Declared in tensor/backend.h; the CPU-only build defines these as false / 0 instead.
bool cuda_is_available() {
  return gpu::is_available();
}
int cuda_device_count() {
  return gpu::device_count();
}

}  // namespace ddplab
