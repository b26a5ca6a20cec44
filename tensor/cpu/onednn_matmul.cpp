// bfloat16 x bfloat16 -> float32 GEMM through oneDNN's matmul primitive (onednn_matmul.h).
//
// oneDNN's C API has dnnl_sgemm for float32 but no public bfloat16 GEMM; its matmul primitive
// takes any mix of types and strides. Our row-major matrices with leading dimensions (and the
// transposed views GEMM's flags describe) are plain strided memory descriptors: A [m, k] has
// strides (lda, 1), or (1, lda) when transposed. alpha becomes an output scale and beta a "sum"
// post-op (C = alpha * A @ B + beta * C). oneDNN 3.x has no output scales: there alpha is A's
// scale, a runtime argument, which oneDNN applies to the product before the post-ops, as 2.x
// applied the output scale (same result).
#include "tensor/cpu/onednn_matmul.h"

#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <oneapi/dnnl/dnnl_version.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "tensor/error.h"
#include "tensor/threads.h"

namespace ddplab::cpu {

namespace {

using dnnl::memory;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Everything that selects a primitive, and the thread count it is built for (oneDNN keeps the
// work split it chose then: Note [Threads under load] in tensor/adaptive_threads.cpp).
struct Key {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  double alpha, beta;
  int threads;
  auto tie() const {
    return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, threads);
  }
  bool operator==(const Key& o) const { return tie() == o.tie(); }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = (key.trans_a ? 1u : 0u) + (key.trans_b ? 2u : 0u);
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    h = h * 1000003u ^ std::hash<double>()(key.alpha) ^ std::hash<double>()(key.beta) * 31u;
    return h * 31u + static_cast<size_t>(key.threads);
  }
};

struct Matmul {
  memory::desc a, b, c;
  dnnl::matmul prim;
#if DNNL_VERSION_MAJOR >= 3
  float alpha = 1;  // A's scale, passed at execution (DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC)
#endif

  explicit Matmul(const Key& key) {
    // op(A) is m x k; stored transposed, its rows are the columns of what we hold.
    a = memory::desc({key.m, key.k}, dt::bf16,
                     key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
    b = memory::desc({key.k, key.n}, dt::bf16,
                     key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
    c = memory::desc({key.m, key.n}, dt::f32, memory::dims{key.ldc, 1});
    dnnl::primitive_attr attr;
#if DNNL_VERSION_MAJOR >= 3
    alpha = static_cast<float>(key.alpha);
    if (key.alpha != 1) attr.set_scales_mask(DNNL_ARG_SRC, 0);
#else
    if (key.alpha != 1) attr.set_output_scales(0, {static_cast<float>(key.alpha)});
#endif
    if (key.beta != 0) {
      dnnl::post_ops ops;
      ops.append_sum(static_cast<float>(key.beta));
      attr.set_post_ops(ops);
    }
#if DNNL_VERSION_MAJOR >= 3
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(engine(), a, b, c, attr));
#else
    dnnl::matmul::desc d(a, b, c);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, engine()));
#endif
  }
};

std::mutex cache_mutex;
std::unordered_map<Key, std::unique_ptr<Matmul>, KeyHash> cache;

Matmul& matmul_for(const Key& key) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  return *cache.emplace(key, std::make_unique<Matmul>(key)).first->second;
}

}  // namespace

void gemm_bf16_f32(const GemmArgs& g, const void* a, const void* b, float* c) {
  const int threads = get_num_threads();
  const Key key{g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.alpha, g.beta, threads};
  try {
    Matmul& mm = matmul_for(key);
    dnnl::stream s(engine());
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(mm.a, engine(), const_cast<void*>(a))},
        {DNNL_ARG_WEIGHTS, memory(mm.b, engine(), const_cast<void*>(b))},
        {DNNL_ARG_DST, memory(mm.c, engine(), c)}};
#if DNNL_VERSION_MAJOR >= 3
    if (g.alpha != 1) {
      args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC,
                   memory(memory::desc({1}, dt::f32, memory::format_tag::x), engine(), &mm.alpha));
    }
#endif
    mm.prim.execute(s, args);
    s.wait();
  } catch (const dnnl::error& e) {
    DDP_FAIL("oneDNN bfloat16 matmul failed (m=" << g.m << " n=" << g.n << " k=" << g.k
                                                 << "): " << e.what());
  }
}

}  // namespace ddplab::cpu
