// Matrix multiply on the GPU through cuBLAS, and the per-device cuBLAS handles.
//
// ddplab's GemmArgs are row-major, cuBLAS is column-major. A row-major m x n matrix is the same
// bytes as a column-major n x m matrix (its transpose), so C = op(A) op(B) becomes
// C^T = op(B)^T op(A)^T: call cuBLAS with A and B swapped, and m and n swapped; the leading
// dimensions and the transpose flags carry over unchanged.
#include <cublas_v2.h>

#include <climits>
#include <unordered_map>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_runtime.h"

namespace ddplab::gpu {

namespace {

// One handle per (thread, device): a cuBLAS handle must not be used by two threads at once.
// Handles are never destroyed: destroying them at thread or process exit can run after the CUDA
// context is gone.
cublasHandle_t cublas_handle(int device) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  cublasHandle_t& h = handles[device];
  if (h == nullptr) {
    DeviceGuard g(device);
    DDP_CUBLAS_CHECK(cublasCreate(&h));
    // Keep float32 GEMMs in full precision (no TF32), so results match the CPU's to float
    // rounding; TF32 would be a deliberate, documented switch.
    DDP_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  }
  // Bound to the current stream before every call, so GEMMs order with the caller's other work.
  DDP_CUBLAS_CHECK(cublasSetStream(h, current_stream(device).handle()));
  return h;
}

int to_int(int64_t v, const char* what) {
  DDP_CHECK(v >= 0 && v <= INT_MAX,
            "gemm: " << what << " = " << v << " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

}  // namespace

void gemm(int device, const GemmArgs& g) {
  DDP_CHECK(!g.float32_c || g.dtype == DType::Float16 || g.dtype == DType::BFloat16,
            "gemm on CUDA: a float32 result needs 16-bit operands, got " << dtype_name(g.dtype));
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  cublasHandle_t h = cublas_handle(device);
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = to_int(g.n, "n"), n = to_int(g.m, "m"), k = to_int(g.k, "k");
  const int lda = to_int(g.ldb, "ldb"), ldb = to_int(g.lda, "lda"), ldc = to_int(g.ldc, "ldc");
  const int batch = to_int(g.batch, "batch");
  // k == 0 is legal (C = beta * C); cuBLAS still wants leading dimensions of at least 1.
  const int lda1 = lda > 0 ? lda : 1, ldb1 = ldb > 0 ? ldb : 1;
  switch (g.dtype) {
    case DType::Float32: {
      const auto alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
      DDP_CUBLAS_CHECK(cublasSgemmStridedBatched(
          h, op_b, op_a, m, n, k, &alpha, static_cast<const float*>(g.b), lda1, g.stride_b,
          static_cast<const float*>(g.a), ldb1, g.stride_a, &beta, static_cast<float*>(g.c), ldc,
          g.stride_c, batch));
      break;
    }
    case DType::Float64: {
      const double alpha = g.alpha, beta = g.beta;
      DDP_CUBLAS_CHECK(cublasDgemmStridedBatched(
          h, op_b, op_a, m, n, k, &alpha, static_cast<const double*>(g.b), lda1, g.stride_b,
          static_cast<const double*>(g.a), ldb1, g.stride_a, &beta, static_cast<double*>(g.c), ldc,
          g.stride_c, batch));
      break;
    }
    case DType::Float16:
    case DType::BFloat16: {
      // 16-bit storage, float32 accumulation: the same "compute in float" rule as every other op.
      // Under autocast C is float32 (float32_c): the tensor cores read the 16-bit operands and
      // the float32 sums are written as they are, never rounded to 16 bits.
      const cudaDataType_t t = g.dtype == DType::Float16 ? CUDA_R_16F : CUDA_R_16BF;
      const cudaDataType_t tc = g.float32_c ? CUDA_R_32F : t;
      const auto alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
      DDP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          h, op_b, op_a, m, n, k, &alpha, g.b, t, lda1, g.stride_b, g.a, t, ldb1, g.stride_a, &beta,
          g.c, tc, ldc, g.stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      DDP_FAIL("gemm on CUDA supports float32, float64, float16 and bfloat16, got "
               << dtype_name(g.dtype));
  }
}

}  // namespace ddplab::gpu
