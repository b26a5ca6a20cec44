// The error-string lookups behind the DDP_*_CHECK macros of cuda_check.h.
//
// Kept in one translation unit so that only this file pays for the cuBLAS, cuDNN and NCCL headers.
#include "tensor/cuda/cuda_check.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <sstream>

namespace ddplab::gpu::detail {

namespace {
[[noreturn]] void throw_library_error(const char* library, int status, const std::string& text,
                                      const char* call, const char* file, int line) {
  std::ostringstream os;
  os << library << " error " << status << " (" << text << ") in " << call << " at " << file << ":"
     << line;
  throw Error(os.str());
}
}  // namespace

void throw_cuda_error(int status, const char* call, const char* file, int line) {
  auto e = static_cast<cudaError_t>(status);
  // Reading the error clears it (when it is not sticky), so a caller that catches the Error can
  // go on using the device.
  cudaGetLastError();
  throw_library_error("CUDA", status,
                      std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), call, file,
                      line);
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  auto s = static_cast<cublasStatus_t>(status);
  throw_library_error("cuBLAS", status,
                      std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s), call,
                      file, line);
}

void throw_cudnn_error(int status, const char* call, const char* file, int line) {
  throw_library_error("cuDNN", status, cudnnGetErrorString(static_cast<cudnnStatus_t>(status)),
                      call, file, line);
}

void throw_nccl_error(int status, const char* call, const char* file, int line) {
  std::string text = ncclGetErrorString(static_cast<ncclResult_t>(status));
  // NCCL keeps the detail (which peer, which system call) in its last-error string.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += "; " + std::string(last);
  throw_library_error("NCCL", status, text, call, file, line);
}

}  // namespace ddplab::gpu::detail
