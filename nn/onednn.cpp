// oneDNN convolution primitives, built once per shape and cached (see nn/onednn.h).
//
// Layouts. Our tensors are plain NCHW (activations) and OIHW (weights). oneDNN's fastest AVX-512
// kernels want blocked layouts (nChw16c, OIhw16i16o, ...). We ask oneDNN which layout it wants
// for each argument (format `any`) and, where that differs from ours, reorder on the way in and
// out. The reorders for a shape are primitives too, and are cached with it. Reorder buffers come
// from ddplab's caching host allocator, so a training step does not fault in fresh pages.
//
// Precision. In bfloat16 (autocast) the primitive's operands are bfloat16 while ours stay
// float32: the reorder into the blocked layout converts them on the way (a reorder converts
// types as it moves data), and outputs are float32, so they need no conversion back.
//
// Threads: Debian's oneDNN is built with OpenMP, so it runs on the same pool as every other CPU
// kernel of ddplab (tensor/threads.h).
#include "nn/onednn.h"

#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "tensor/allocator.h"
#include "tensor/error.h"

namespace ddplab::nn::onednn {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// One engine and one stream for the process: both are cheap to share, and primitives created on
// an engine can only run on streams of that engine.
dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

// Turns oneDNN's exceptions (status + message) into ddplab errors that name the convolution.
template <class F>
auto guarded(const Conv2dParams& p, const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    DDP_FAIL("oneDNN " << what << " failed for conv2d " << p.str() << ": " << e.what()
                       << " (status " << static_cast<int>(e.status) << ")");
  }
}

// One argument of a primitive: the layout we hold (`user`), the layout the primitive wants
// (`prim`) and, when they differ, the reorder between them (user -> prim for inputs,
// prim -> user for outputs).
struct Arg {
  memory::desc user, prim;
  std::optional<dnnl::reorder> reorder;
  Arg() = default;
  Arg(const memory::desc& u, const memory::desc& p, bool is_input) : user(u), prim(p) {
    if (u != p) {
      reorder = is_input ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), u, engine(), p))
                         : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p, engine(), u));
    }
  }
};

// Temporary blocked-layout buffers of one call; freed (back to the cache) when the call returns.
struct Scratch {
  std::vector<DataPtr> buffers;
  void* get(size_t nbytes) {
    buffers.push_back(cpu_allocator().allocate(nbytes));
    return buffers.back().get();
  }
};

// A memory object in the primitive's layout holding the input at `ptr` (reordered if needed).
memory stage_input(const Arg& a, const void* ptr, Scratch& s) {
  memory user(a.user, engine(), const_cast<void*>(ptr));
  if (!a.reorder) return user;
  memory prim(a.prim, engine(), s.get(a.prim.get_size()));
  a.reorder->execute(stream(), user, prim);
  return prim;
}

// A memory object the primitive writes into; finish_output copies it back to `ptr` if needed.
memory stage_output(const Arg& a, void* ptr, Scratch& s) {
  if (!a.reorder) return memory(a.user, engine(), ptr);
  return memory(a.prim, engine(), s.get(a.prim.get_size()));
}
void finish_output(const Arg& a, memory prim, void* ptr) {
  if (!a.reorder) return;
  memory user(a.user, engine(), ptr);
  a.reorder->execute(stream(), prim, user);
}

// Activations: plain NCHW is what we hold. `any` lets oneDNN pick its blocked layout (and pays
// two reorders per call); measured on resnet20 shapes the blocked kernels win by more than the
// reorders cost. DDPLAB_ONEDNN_PLAIN=1 forces plain NCHW kernels (for comparison only).
memory::format_tag activation_tag() {
  static const bool plain = [] {
    const char* v = std::getenv("DDPLAB_ONEDNN_PLAIN");
    return v != nullptr && v[0] == '1';
  }();
  return plain ? tag::nchw : tag::any;
}

struct ConvPrimitives {
  Conv2dParams p;
  dt operand;  // what the products read: x, w and gy as the kernels see them
  memory::dims strides, dilates, pad_l, pad_r;
  memory::desc x_plain, w_plain, b_plain, y_plain;

  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Arg fwd_x, fwd_w, fwd_y;

  std::once_flag bwd_data_once, bwd_weights_once;
  dnnl::convolution_backward_data bwd_data;
  Arg bd_gy, bd_w, bd_gx;
  dnnl::convolution_backward_weights bwd_weights;
  Arg bw_x, bw_gy, bw_gw;

  ConvPrimitives(const Conv2dParams& params, Precision prec)
      : p(params), operand(prec == Precision::BFloat16 ? dt::bf16 : dt::f32) {
    const int64_t oh = p.out_h(), ow = p.out_w();
    strides = {p.stride_h, p.stride_w};
    dilates = {p.dil_h - 1, p.dil_w - 1};  // oneDNN counts the gaps: 0 means dense
    pad_l = {p.pad_h, p.pad_w};
    // Right/bottom padding that makes oneDNN's output size equal PyTorch's floor formula
    // exactly (it can be smaller than the left padding when the stride skips the last pixels).
    pad_r = {(oh - 1) * p.stride_h + p.dil_h * (p.kh - 1) + 1 - p.h - p.pad_h,
             (ow - 1) * p.stride_w + p.dil_w * (p.kw - 1) + 1 - p.w - p.pad_w};
    x_plain = memory::desc({p.n, p.c, p.h, p.w}, dt::f32, tag::nchw);
    y_plain = memory::desc({p.n, p.o, oh, ow}, dt::f32, tag::nchw);
    if (p.groups == 1) {
      w_plain = memory::desc({p.o, p.c, p.kh, p.kw}, dt::f32, tag::oihw);
    } else {
      w_plain =
          memory::desc({p.groups, p.o / p.groups, p.c / p.groups, p.kh, p.kw}, dt::f32, tag::goihw);
    }
    b_plain = memory::desc({p.o}, dt::f32, tag::x);

    memory::desc x_any({p.n, p.c, p.h, p.w}, operand, activation_tag());
    memory::desc y_any({p.n, p.o, oh, ow}, dt::f32, activation_tag());
    memory::desc w_any(w_plain.dims(), operand, tag::any);
    memory::desc b_md = p.has_bias ? b_plain : memory::desc();
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, x_any, w_any, b_md,
                                      y_any, strides, dilates, pad_l, pad_r);
    fwd_pd = dnnl::convolution_forward::primitive_desc(d, engine());
    fwd = dnnl::convolution_forward(fwd_pd);
    fwd_x = Arg(x_plain, fwd_pd.src_desc(), true);
    fwd_w = Arg(w_plain, fwd_pd.weights_desc(), true);
    fwd_y = Arg(y_plain, fwd_pd.dst_desc(), false);
  }

  void build_backward_data() {
    memory::desc gx_any(x_plain.dims(), dt::f32, activation_tag());
    memory::desc gy_any(y_plain.dims(), operand, activation_tag());
    memory::desc w_any(w_plain.dims(), operand, tag::any);
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, gx_any, w_any,
                                            gy_any, strides, dilates, pad_l, pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, engine(), fwd_pd);
    bwd_data = dnnl::convolution_backward_data(pd);
    bd_gy = Arg(y_plain, pd.diff_dst_desc(), true);
    bd_w = Arg(w_plain, pd.weights_desc(), true);
    bd_gx = Arg(x_plain, pd.diff_src_desc(), false);
  }

  void build_backward_weights() {
    memory::desc x_any(x_plain.dims(), operand, activation_tag());
    memory::desc gy_any(y_plain.dims(), operand, activation_tag());
    memory::desc gw_any(w_plain.dims(), dt::f32, tag::any);
    memory::desc gb_md = p.has_bias ? b_plain : memory::desc();
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, x_any, gw_any,
                                               gb_md, gy_any, strides, dilates, pad_l, pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, engine(), fwd_pd);
    bwd_weights = dnnl::convolution_backward_weights(pd);
    bw_x = Arg(x_plain, pd.src_desc(), true);
    bw_gy = Arg(y_plain, pd.diff_dst_desc(), true);
    bw_gw = Arg(w_plain, pd.diff_weights_desc(), false);
  }
};

// The cache key: a convolution and the precision it runs in.
using Key = std::pair<Conv2dParams, Precision>;

struct KeyHash {
  size_t operator()(const Key& key) const {
    const Conv2dParams& p = key.first;
    const int64_t v[] = {p.n,     p.c,     p.h,        p.w,        p.o,
                         p.kh,    p.kw,    p.stride_h, p.stride_w, p.pad_h,
                         p.pad_w, p.dil_h, p.dil_w,    p.groups,   p.has_bias ? 1 : 0};
    size_t h = static_cast<size_t>(key.second);
    for (int64_t x : v) h = h * 1000003u ^ std::hash<int64_t>()(x);
    return h;
  }
};

std::mutex cache_mutex;
std::unordered_map<Key, std::unique_ptr<ConvPrimitives>, KeyHash> cache;

// The cached primitives of `p` in `prec`, built on first use. Entries are never removed, so the
// reference stays valid while other threads insert.
ConvPrimitives& primitives_for(const Conv2dParams& p, Precision prec) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find({p, prec});
  if (it != cache.end()) return *it->second;
  auto made = guarded(p, "forward primitive creation",
                      [&] { return std::make_unique<ConvPrimitives>(p, prec); });
  return *cache.emplace(Key{p, prec}, std::move(made)).first->second;
}

}  // namespace

bool Conv2dParams::operator==(const Conv2dParams& q) const {
  return n == q.n && c == q.c && h == q.h && w == q.w && o == q.o && kh == q.kh && kw == q.kw &&
         stride_h == q.stride_h && stride_w == q.stride_w && pad_h == q.pad_h && pad_w == q.pad_w &&
         dil_h == q.dil_h && dil_w == q.dil_w && groups == q.groups && has_bias == q.has_bias;
}

std::string Conv2dParams::str() const {
  std::ostringstream os;
  os << "(input [" << n << ", " << c << ", " << h << ", " << w << "], weight [" << o << ", "
     << c / groups << ", " << kh << ", " << kw << "], stride [" << stride_h << ", " << stride_w
     << "], padding [" << pad_h << ", " << pad_w << "], dilation [" << dil_h << ", " << dil_w
     << "], groups " << groups << (has_bias ? ", bias)" : ")");
  return os.str();
}

size_t conv2d_saved_input_bytes(const Conv2dParams& p, Precision prec) {
  ConvPrimitives& cp = primitives_for(p, prec);
  return guarded(p, "backward weights primitive creation", [&]() -> size_t {
    std::call_once(cp.bwd_weights_once, [&] { cp.build_backward_weights(); });
    // Worth keeping only when forward reorders x anyway and backward would redo the same reorder.
    const bool same = cp.fwd_x.reorder && cp.bw_x.reorder && cp.fwd_x.prim == cp.bw_x.prim;
    return same ? cp.fwd_x.prim.get_size() : 0;
  });
}

void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                    Precision prec, void* x_saved) {
  ConvPrimitives& cp = primitives_for(p, prec);
  guarded(p, "forward", [&] {
    Scratch s;
    memory xm;
    if (x_saved != nullptr) {  // the reorder writes where backward will find it
      memory user(cp.fwd_x.user, engine(), const_cast<float*>(x));
      xm = memory(cp.fwd_x.prim, engine(), x_saved);
      cp.fwd_x.reorder->execute(stream(), user, xm);
    } else {
      xm = stage_input(cp.fwd_x, x, s);
    }
    memory wm = stage_input(cp.fwd_w, w, s);
    memory ym = stage_output(cp.fwd_y, y, s);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
    if (p.has_bias) {
      args.emplace(DNNL_ARG_BIAS, memory(cp.b_plain, engine(), const_cast<float*>(b)));
    }
    cp.fwd.execute(stream(), args);
    finish_output(cp.fwd_y, ym, y);
    stream().wait();
  });
}

void conv2d_backward(const Conv2dParams& p, const float* x, const void* x_saved, const float* gy,
                     const float* w, float* gx, float* gw, float* gb, Precision prec) {
  ConvPrimitives& cp = primitives_for(p, prec);
  guarded(p, "backward", [&] {
    Scratch s;
    // gy in the layout of the backward-data primitive; backward weights usually reads the same
    // one, and then reuses it instead of reordering gy a second time.
    std::optional<memory> gy_data;
    if (gx != nullptr) {
      std::call_once(cp.bwd_data_once, [&] { cp.build_backward_data(); });
      gy_data = stage_input(cp.bd_gy, gy, s);
      memory wm = stage_input(cp.bd_w, w, s);
      memory gxm = stage_output(cp.bd_gx, gx, s);
      cp.bwd_data.execute(
          stream(),
          {{DNNL_ARG_DIFF_DST, *gy_data}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, gxm}});
      finish_output(cp.bd_gx, gxm, gx);
    }
    if (gw != nullptr) {
      std::call_once(cp.bwd_weights_once, [&] { cp.build_backward_weights(); });
      memory xm = x_saved != nullptr ? memory(cp.bw_x.prim, engine(), const_cast<void*>(x_saved))
                                     : stage_input(cp.bw_x, x, s);
      memory gym =
          gy_data && cp.bd_gy.prim == cp.bw_gy.prim ? *gy_data : stage_input(cp.bw_gy, gy, s);
      memory gwm = stage_output(cp.bw_gw, gw, s);
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_DST, gym}, {DNNL_ARG_DIFF_WEIGHTS, gwm}};
      // The primitive was built with a bias gradient when the layer has a bias; oneDNN needs a
      // buffer for it even if the caller does not want it.
      std::vector<float> gb_unused;
      if (p.has_bias) {
        if (gb == nullptr) {
          gb_unused.resize(static_cast<size_t>(p.o));
          gb = gb_unused.data();
        }
        args.emplace(DNNL_ARG_DIFF_BIAS, memory(cp.b_plain, engine(), gb));
      }
      cp.bwd_weights.execute(stream(), args);
      finish_output(cp.bw_gw, gwm, gw);
    }
    stream().wait();
  });
}

void conv2d_backward_data(const Conv2dParams& p, const float* gy, const float* w, float* gx,
                          Precision prec) {
  conv2d_backward(p, nullptr, nullptr, gy, w, gx, nullptr, nullptr, prec);
}

void conv2d_backward_weights(const Conv2dParams& p, const float* x, const float* gy, float* gw,
                             float* gb, Precision prec) {
  conv2d_backward(p, x, nullptr, gy, nullptr, nullptr, gw, gb, prec);
}

size_t conv_cache_size() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache.size();
}

std::string conv_forward_impl_name(const Conv2dParams& p, Precision prec) {
  return primitives_for(p, prec).fwd_pd.impl_info_str();
}

std::string cpu_isa_name() {
  using isa = dnnl::cpu_isa;
  const std::pair<isa, const char*> names[] = {{isa::sse41, "sse41"},
                                               {isa::avx, "avx"},
                                               {isa::avx2, "avx2"},
                                               {isa::avx2_vnni, "avx2_vnni"},
                                               {isa::avx512_core, "avx512_core"},
                                               {isa::avx512_core_vnni, "avx512_core_vnni"},
                                               {isa::avx512_core_bf16, "avx512_core_bf16"},
                                               {isa::avx512_core_amx, "avx512_core_amx"}};
  const isa current = dnnl::get_effective_cpu_isa();
  for (const auto& [i, name] : names) {
    if (i == current) return name;
  }
  return "other";
}

bool cpu_has_bf16_kernels() {
  return cpu_isa_name().rfind("avx512_core", 0) == 0;  // the ISA values are masks, not an order
}

}  // namespace ddplab::nn::onednn
