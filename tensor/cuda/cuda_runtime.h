// The CUDA device runtime of ddplab: is there a GPU, which device is current, streams and events.
//
// (Not to be confused with CUDA's own <cuda_runtime.h>; always include this one by its full path,
// "tensor/cuda/cuda_runtime.h".)
//
// Availability is probed once. Without a GPU, cudaGetDeviceCount fails with error 35 and the error
// is sticky: every later CUDA call fails the same way. So the first answer is cached and, when it
// is "no GPU", ddplab makes no further CUDA call; asking for a CUDA device then throws an Error
// naming the device and the CUDA error (`require_device`).
//
// Streams follow PyTorch: each thread has a current stream per device (the default stream until a
// StreamGuard changes it); kernels, copies and cuBLAS calls of that thread go to it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "tensor/device.h"

namespace ddplab::gpu {

bool is_available();
int device_count();
// Throws ddplab::Error unless cuda:`index` exists ("cuda:1 requested, but ...").
void require_device(int index);
// cuda:`index`'s compute capability as (major, minor), e.g. (9, 0) for Hopper; require_device
// first. Tells which tensor-core types it has (bfloat16 from 8.0, Ampere, on).
std::pair<int, int> compute_capability(int index);
// Why CUDA is unusable ("" when it is usable), e.g. "cudaGetDeviceCount failed: error 35 (...)".
const std::string& unavailable_reason();

// Makes `index` the current CUDA device for its lifetime, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// A queue of work on one device. A cheap value: copying it does not create a new CUDA stream.
class Stream {
 public:
  Stream() = default;
  Stream(int device, cudaStream_t handle) : device_(device), handle_(handle) {}
  // A new stream on `device` (never destroyed: kernels queued on it may outlive any owner).
  static Stream create(int device);
  // The device's default (legacy NULL) stream, which synchronizes with other blocking streams.
  static Stream default_stream(int device) { return Stream(device, nullptr); }

  int device() const { return device_; }
  cudaStream_t handle() const { return handle_; }
  Device device_obj() const { return Device(DeviceType::CUDA, device_); }
  void synchronize() const;  // waits for everything queued so far
  bool query() const;        // true when all queued work has finished
  bool operator==(const Stream& o) const { return device_ == o.device_ && handle_ == o.handle_; }
  bool operator!=(const Stream& o) const { return !(*this == o); }

 private:
  int device_ = 0;
  cudaStream_t handle_ = nullptr;
};

// The calling thread's current stream on `device`.
Stream current_stream(int device);
void set_current_stream(const Stream& s);

// Makes `s` the current stream of its device (and its device current) for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  DeviceGuard device_guard_;
};

// A marker in a stream: record it after some work, then let another stream (or the host) wait.
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;

  void record(const Stream& s);      // marks the work queued on s so far
  void wait(const Stream& s) const;  // s waits (on the GPU) until the marker is reached
  bool query() const;                // true when the marker was reached (or never recorded)
  void synchronize() const;          // host waits for the marker
  float elapsed_time(const Event& end) const;  // ms between this and `end` (both timing events)
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
};

// Waits for all work on `device`.
void synchronize(int device);

}  // namespace ddplab::gpu
