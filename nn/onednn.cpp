// oneDNN convolution primitives, built once per shape and cached (see nn/onednn.h).
//
// Layouts. Our tensors are plain NCHW (activations) and OIHW (weights). oneDNN's fastest AVX-512
// kernels want blocked layouts (nChw16c, OIhw16i16o, ...). We ask oneDNN which layout it wants
// for each argument (format `any`) and, where that differs from ours, reorder on the way in and
// out. The reorders for a shape are primitives too, and are cached with it. Reorder buffers come
// from ddplab's caching host allocator, so a training step does not fault in fresh pages.
//
// Precision. In bfloat16 (autocast) the primitive's operands are bfloat16. Where we hold them in
// float32 (the weights, always; the first layer's input images) the reorder into the blocked
// layout converts them on the way (a reorder converts types as it moves data). The activations
// between layers we hold in bfloat16 (ConvTypes): the primitive reads them and writes its output
// and the input gradient in bfloat16, so the reorders only move half as many bytes. Weight and
// bias gradients are written in float32, for the float32 master weights.
//
// Algorithm: direct, or Winograd's minimal filtering where it pays (Note [Winograd] below).
//
// Threads: Debian's oneDNN is built with OpenMP, so it runs on the same pool as every other CPU
// kernel of ddplab (tensor/threads.h).
//
// Versions: Debian 12's oneDNN 2.6.3 (the default) and 3.x (meson -Donednn=pypi: PyPI's 3.2,
// also GNU OpenMP). 3.x dropped the operation descriptors (a primitive descriptor is built from
// the engine and the operation's arguments directly) and renamed memory::desc's getters; the
// `#if DNNL_VERSION_MAJOR >= 3` branches below are the only differences.
#include "nn/onednn.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl_version.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "nn/winograd.h"
#include "tensor/allocator.h"
#include "tensor/env_switch.h"
#include "tensor/error.h"
#include "tensor/threads.h"

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

// memory::desc's dims and type: dims(), data_type() in oneDNN 2.x; get_dims(), get_data_type() in
// 3.x.
memory::dims dims_of(const memory::desc& d) {
#if DNNL_VERSION_MAJOR >= 3
  return d.get_dims();
#else
  return d.dims();
#endif
}
dt type_of(const memory::desc& d) {
#if DNNL_VERSION_MAJOR >= 3
  return d.get_data_type();
#else
  return d.data_type();
#endif
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

// Whether layout `p` puts every element of an NHWC array `u` at the same byte: NHWC itself, or,
// with 16 channels (8 on AVX2), oneDNN's blocked nChw16c (nChw8c), NHWC under another name. Then
// no reorder is needed, only the primitive's name for the layout.
bool same_bytes_as_nhwc(const memory::desc& u, const memory::desc& p) {
  const memory::dims d = dims_of(u);
  const dt t = type_of(u);
  if (d.size() != 4 || u != memory::desc(d, t, tag::nhwc)) return false;
  return p == u || (d[1] == 16 && p == memory::desc(d, t, tag::aBcd16b)) ||
         (d[1] == 8 && p == memory::desc(d, t, tag::aBcd8b));
}

// One argument of a primitive: the layout we hold (`user`), the layout the primitive wants
// (`prim`) and, when they differ, the reorder between them (user -> prim for inputs,
// prim -> user for outputs).
struct Arg {
  memory::desc user, prim;
  std::optional<dnnl::reorder> reorder;
  Arg() = default;
  Arg(const memory::desc& u, const memory::desc& p, bool is_input) : user(u), prim(p) {
    if (u == p || same_bytes_as_nhwc(u, p)) {
      user = p;
    } else {
      reorder = is_input ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), u, engine(), p))
                         : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p, engine(), u));
    }
  }
};

bool isa_is_avx512();

// The block of Note [Blocked activations] (tensor/blocked.cpp): the channels of one vector
// register, as oneDNN's kernels block them: nChw16c on AVX-512, nChw8c below.
int64_t activation_block() {
  static const int64_t block = isa_is_avx512() ? 16 : 8;
  return block;
}
memory::desc blocked_desc(const memory::desc& plain) {
  return {dims_of(plain), type_of(plain), activation_block() == 16 ? tag::aBcd16b : tag::aBcd8b};
}

// The argument `a` for a caller that holds the array blocked instead: no reorder where the
// primitive reads or writes that very layout. Only arrays whose channels fill whole blocks can be
// blocked; for others the twin is never asked for and stays empty.
Arg blocked_twin(const Arg& a, bool is_input) {
  if (dims_of(a.user)[1] % activation_block() != 0) return {};
  return {blocked_desc(a.user), a.prim, is_input};
}

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

// Activations: NCHW or NHWC (channels-last) is what we hold. `any` lets oneDNN pick its blocked
// layout (and pays two reorders per call); measured on resnet20 shapes the blocked kernels win by
// more than the reorders cost. DDPLAB_ONEDNN_PLAIN=1 forces plain NCHW kernels (for comparison
// only).
//
// One exception: a direct convolution with 8 to 16 channels in and out asks for channels-last
// (NHWC). With 16 channels oneDNN's blocked layout nChw16c is byte for byte NHWC, so the
// reorders cost the same, but for an explicit NHWC layout oneDNN 2.6 runs its newer
// GEMM-based kernels (`brgconv`) instead of the older direct ones, which were slower on
// resnet20's first stage: its whole step took 2-4% less time (quiet machine, 2026-12-03,
// interleaved, 1 and 2 threads, float32 and bfloat16; docs/benchmarks.md). Measured with
// AVX-512 only, so only there: AVX2's blocked layout is nChw8c, not NHWC.
//
// In bfloat16 the same holds for wider layers: every direct convolution with >= 8 channels in and
// out asks for NHWC. Its tensors then stay NHWC from one layer to the next (Note [Channels last]
// in tensor/ops_create.cpp), so the 32- and 64-channel layers lose their four reorders per call
// too; resnet20's bfloat16 step took 8-17% less time (3 interleaved rounds, 2 threads,
// 2026-12-03, AMD EPYC with AVX-512). Float32's 32- and 64-channel layers run Winograd, which
// needs the blocked layout.
// oneDNN's ISA values are masks, not an order: AVX-512 is every name starting avx512_core.
bool isa_is_avx512() {
  return cpu_isa_name().rfind("avx512_core", 0) == 0;
}

memory::format_tag activation_tag(const Conv2dParams& p, dt operand, bool winograd) {
  static const bool plain = [] {
    const char* v = std::getenv("DDPLAB_ONEDNN_PLAIN");
    return v != nullptr && v[0] == '1';
  }();
  static const bool avx512 = isa_is_avx512();
  if (plain) return tag::nchw;
  const bool narrow = p.c >= 8 && p.c <= 16 && p.o >= 8 && p.o <= 16;
  const bool bf16_wide = operand == dt::bf16 && p.c >= 8 && p.o >= 8;
  return avx512 && (narrow || bf16_wide) && !winograd ? tag::nhwc : tag::any;
}

// Note [Winograd]
// A direct 3x3 convolution spends 9 multiply-adds per output pixel per (input, output) channel
// pair. Winograd's minimal filtering F(4x4, 3x3) computes a 4x4 tile of outputs from a 6x6 tile
// of inputs with 36 products per channel pair instead of 16 * 9 = 144: the input tile and the
// filter are first transformed into a 6x6 "Winograd domain" (fixed small matrices: B^T d B and
// G g G^T), multiplied there element by element - which, summed over the input channels, is 36
// independent matrix products [tiles x C] x [C x K] - and the 6x6 result is transformed back to
// the 4x4 tile (A^T m A). Backward data is the same with the filter flipped, and backward
// weights transforms the input and the output gradient instead. oneDNN has all three for float32
// on AVX-512 (`jit_wino_4x3`), none for bfloat16.
//
// The products shrink 4x, but the transforms are extra passes over memory, once per channel
// rather than per channel pair, so they pay only when there are enough channels on the other
// side to share them. Measured on resnet20's shapes at batch 128 (2 threads, AVX-512; the table
// is in docs/benchmarks.md): with 32 and 64 channels Winograd takes 0.5-0.9x the direct time in
// all three passes; with 16 channels it is up to 1.3x slower, and with the 3-channel stem 5x
// slower. Hence the rule: Winograd for 3x3, stride 1, undilated, ungrouped float32 convolutions
// with at least 32 channels in and out; direct for the rest. A fixed rule, not a per-process
// timing contest, so every run (and every DDP rank) computes with the same algorithm and a seeded
// run stays bitwise reproducible.
//
// The price is rounding: the transforms' constants (up to 8 and 1/4) amplify float32 rounding,
// so outputs differ from a direct convolution's by a few 1e-7 relative (2-3x the direct error
// against float64 in the resnet20 parity test, far inside its bound). ConvAlgorithm::Direct
// turns it off, e.g. to compare against PyTorch, which always runs direct convolutions on CPUs.
constexpr int64_t kWinogradMinChannels = 32;

// Note [bfloat16 weight gradient in Winograd]
// oneDNN 2.6 has no bfloat16 Winograd, and its bfloat16 weight-gradient kernel (jit_bf16) is the
// slowest of a bfloat16 convolution's three passes: with 64 channels it takes longer than the
// float32 Winograd one (resnet20's 64-channel stage, batch 128, 2 threads: 11.2 vs 7.9 ms per
// step). So from 64 channels in and out the weight gradient of a bfloat16 convolution widens x
// and gy to float32 (the reorders into Winograd's blocked layout convert them, exactly) and runs
// float32 Winograd; the weight gradient is float32 either way. resnet20's bfloat16 step: 0.972x
// (8 interleaved rounds, 2026-12-03, AMD EPYC with AVX-512). With 32 channels it gains nothing
// (1.005x): converting the larger activations costs what the kernel saves; nor does running all
// three passes so (1.016x). Since our Winograd reads bfloat16 (Note [Winograd of our own]) this
// only runs where ours does not: on CPUs with AMX, and beyond 64 channels.
constexpr int64_t kBf16WinogradWeightsMinChannels = 64;

// Note [Winograd of our own]
// Every float32 3x3, stride-1, padding-1 convolution of up to 64 channels in and out whose
// activations are channels-last or blocked in whole vector registers runs our own F(4x4, 3x3)
// (Note [Winograd F(m x m, 3x3)] in nn/winograd.cpp): where oneDNN 2.6 would run it directly
// (below 32 channels, and on CPUs without AVX-512 every stage) and where it would run its own
// F(4x4, 3x3), which was no faster. So every CPU kind runs the same algorithm, and the AVX-512
// and AVX2 forms give the same bits. An NCHW call, other paddings and strides and
// DDPLAB_CONV_ALGO=onednn keep oneDNN's kernels; its primitives are built in any case, for the
// layouts they choose.
//
// Under autocast (bfloat16 activations in and out) ours runs every pass too, reading and writing
// bfloat16 but computing in float32 (Note [bfloat16 activations] in nn/winograd.cpp), on CPUs
// without AMX. Measured 2026-12-07 on the Zen 4, resnet20, batch 128, 2 threads (bench_train.py
// --driver --variants ddplab+bf16, 6-12 interleaved rounds, medians): ours in both backward
// passes 0.95x the step with oneDNN's only, in backward weights alone 0.97x. The forward first
// stayed with oneDNN's bfloat16 kernels (AVX512-BF16 dot products): ours there, against ours in
// the backward only, took 1.01x; after our kernels kept their scratch memory and prefetched at 16
// channels, 0.93x, 0.97x and (1 thread) 0.98x, and build against build 1.04x, 0.97x (1 thread
// 0.95x): a few percent, in a simpler rule, so ours runs it as well. Per call (batch 128, 2
// threads, ms forward / backward data / backward weights, oneDNN's bfloat16 vs ours; before the
// kept scratch, then with it, before the prefetch):
//   16 channels: 1.44 / 1.42 / 2.14  vs  1.44 / 1.46 / 2.19,  then 1.31 / 1.32 / 1.26
//   32 channels: 1.32 / 1.21 / 1.71  vs  1.33 / 1.22 / 1.41,  then 1.12 / 0.99 / 1.06
//   64 channels: 1.21 / 1.19 / 1.49  vs  1.15 / 1.15 / 1.18,  then 0.97 / 0.88 / 0.93
// With AMX oneDNN's bfloat16 kernels are much faster than float32 arithmetic can be (the
// bfloat16 step 1.92-2.04x float32's there), so they keep every pass.
//
// Measured 2026-12-07 on an AMD EPYC (Zen 4), batch 128, 2 threads, ms per call forward / backward
// data / backward weights, oneDNN vs ours, each best of 12 rounds of 10 calls on the same arrays:
//   AVX-512, 16 channels at 32x32 (oneDNN direct):   2.69 / 2.54 / 2.60  vs  1.39 / 1.42 / 1.47
//   AVX-512, 32 at 16x16 (oneDNN's Winograd):        1.70 / 1.67 / 1.68  vs  1.01 / 1.01 / 1.16
//   AVX-512, 64 at 8x8 (oneDNN's Winograd):          1.11 / 1.12 / 1.32  vs  0.90 / 0.91 / 1.05
//   AVX2 (ONEDNN_MAX_CPU_ISA=AVX2; oneDNN direct):  16: 4.12 / 3.48 / 3.87 vs 1.81 / 1.82 / 1.81;
//     32: 2.92 / 2.79 / 3.25 vs 1.53 / 1.33 / 1.57; 64: 2.67 / 2.51 / 3.14 vs 1.16 / 1.16 / 1.38.
// In a network the activations come from memory rather than cache, and each call takes longer.
// resnet20's step (bench_train, batch 128, 2 threads, 3 interleaved rounds, medians): 129.6 ms
// with oneDNN's kernels only (DDPLAB_CONV_ALGO=onednn), 105.8 with ours (0.82x); with oneDNN
// limited to AVX2, 185.3 vs 130.3 (0.70x).
// Each chunk of tiles multiplies by the weights of every position, 36 * c * o floats, which stay in
// a core's level-2 cache up to 64 channels in and out (576 KiB). Beyond, the products stream them
// from memory: with every layer on ours resnet18 (64 to 512 channels, batch 32) took 663 ms per
// step against 351 with oneDNN's kernels (Zen 4, 2026-12-07), so wider convolutions keep oneDNN's.
constexpr int64_t kOwnWinogradMaxChannelProduct = 64 * 64;

bool own_winograd_pays(const Conv2dParams& p, ConvTypes types, ConvAlgorithm algo) {
  static const bool amx = cpu_isa_name() == "avx512_core_amx";
  const bool float32 = types.prec == Precision::Float32 && types.x == Element::Float32 &&
                       types.y == Element::Float32;
  const bool bf16 = types.prec == Precision::BFloat16 && types.x == Element::BFloat16 &&
                    types.y == Element::BFloat16 && !amx;
  return algo == ConvAlgorithm::Auto && p.c * p.o <= kOwnWinogradMaxChannelProduct &&
         (float32 || bf16) && p.kh == 3 && p.kw == 3 && p.stride_h == 1 && p.stride_w == 1 &&
         p.pad_h == 1 && p.pad_w == 1 && p.dil_h == 1 && p.dil_w == 1 && p.groups == 1;
}

ConvAlgorithm initial_algorithm() {
  const char* v = std::getenv("DDPLAB_CONV_ALGO");
  if (v == nullptr || std::strcmp(v, "auto") == 0) return ConvAlgorithm::Auto;
  if (std::strcmp(v, "onednn") == 0) return ConvAlgorithm::OneDnnOnly;
  if (std::strcmp(v, "direct") == 0) return ConvAlgorithm::Direct;
  DDP_FAIL("DDPLAB_CONV_ALGO=" << v << " is not an algorithm: use auto, onednn or direct");
}

std::atomic<ConvAlgorithm>& algorithm_setting() {
  static std::atomic<ConvAlgorithm> a(initial_algorithm());
  return a;
}

dt element_type(Element e) {
  return e == Element::BFloat16 ? dt::bf16 : dt::f32;
}

bool winograd_pays(const Conv2dParams& p, Precision prec, ConvAlgorithm algo) {
  return algo != ConvAlgorithm::Direct && prec == Precision::Float32 && p.kh == 3 && p.kw == 3 &&
         p.stride_h == 1 && p.stride_w == 1 && p.dil_h == 1 && p.dil_w == 1 && p.groups == 1 &&
         p.c >= kWinogradMinChannels && p.o >= kWinogradMinChannels;
}

// Builds a primitive descriptor with Winograd's algorithm when asked and oneDNN has a kernel for
// it (it may not, e.g. on a CPU without AVX-512), else with the direct one; `*got` (if given)
// says which.
template <class Make>
auto with_algorithm(bool winograd, Make make, bool* got = nullptr)
    -> decltype(make(dnnl::algorithm::convolution_direct)) {
  if (got != nullptr) *got = false;
  if (winograd) {
    try {
      auto pd = make(dnnl::algorithm::convolution_winograd);
      if (got != nullptr) *got = true;
      return pd;
    } catch (const dnnl::error&) {  // unimplemented here: fall through to direct
    }
  }
  return make(dnnl::algorithm::convolution_direct);
}

// Note [bf16 strided weight gradient]
// oneDNN 2.6's bfloat16 backward-weights kernel (jit_bf16) splits a strided convolution's work
// between threads so that they meet at barriers and sum partial gradients. On resnet20's strided
// 3x3 convolutions (batch 128) two threads take twice as long as one on a quiet machine
// (16 -> 32 channels at 32x32: 1.7 ms on one thread, 4.1 ms on two; 32 -> 64 at 16x16: 2.0 and
// 4.3 ms), and the strided 1x1 ones gain nothing from the second thread. Worse, the barriers
// spin: when another process holds one of the cores, the waiting thread burns its time slice, and
// the same call took 0.4-1.5 s (a whole float32 step takes 0.2). So these kernels are built for one
// thread; oneDNN sizes a kernel's work split by the OpenMP thread count at creation, which
// ScopedNumThreads lowers for that moment. The float32 kernels and the bfloat16 ones of unstrided
// convolutions keep every thread. So do CPUs with AMX, where oneDNN picks another kernel
// (jit:avx512_core_amx_bf16): built for one thread there it cost resnet20's bfloat16 step 5%
// quiet and 10% loaded (8 interleaved rounds, 2 threads, Xeon with AMX, 2026-12-03). The cap is
// therefore tied to jit_bf16 by its name, not to the data type.
//
// One thread on the whole batch leaves the other cores idle, though: `perf` of resnet20's
// bfloat16 step (2 threads) found the second thread waiting through these calls, about 4 ms of
// a 100 ms step. So the batch is split as oneDNN's own kernels split work that has no shared
// state: each thread runs a one-thread primitive built for its part of the images, into a
// weight gradient of its own, and the parts are summed in a fixed order (so a run repeats its
// bits; with another thread count the sums' order, and so the last bits, differ, as for every
// multi-threaded oneDNN kernel). Each part's scratch memory is its own (oneDNN's "user"
// scratchpad) and so is its stream. Batches that the thread count does not divide keep the one
// thread.

struct ConvPrimitives {
  Conv2dParams p;
  dt operand;                 // what the products read: x, w and gy as the kernels see them
  dt x_type, y_type;          // x and gx, y and gy as the caller holds them
  ConvAlgorithm algo;         // the setting they were built under
  bool winograd;              // asked for (winograd_pays)
  bool fwd_winograd = false;  // what forward got
  bool own_winograd = false;  // ours instead (Note [Winograd of our own])
  bool y_nhwc = false;        // y and gy as the caller holds them: NHWC, else NCHW
  memory::dims strides, dilates, pad_l, pad_r;
  memory::desc x_plain, w_plain, b_plain, y_plain;

  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Arg fwd_x, fwd_w, fwd_y;
  Arg fwd_x_b, fwd_y_b;  // blocked_twin of fwd_x, fwd_y; likewise below

  std::once_flag bwd_data_once, bwd_weights_once;
  dnnl::convolution_backward_data bwd_data;
  Arg bd_gy, bd_w, bd_gx;
  Arg bd_gy_b, bd_gx_b;
  dnnl::convolution_backward_weights bwd_weights;
  Arg bw_x, bw_gy, bw_gw;
  Arg bw_x_b, bw_gy_b;
  // Note [bf16 strided weight gradient]: the batch in `bw_parts` parts, one thread each, each
  // reading its slice of x and gy (the descriptor's src and diff_dst) with scratch of its own.
  int bw_parts = 1;
  dnnl::convolution_backward_weights::primitive_desc bw_part_pd;
  dnnl::convolution_backward_weights bw_part;

  // `algorithm`: the setting, read once by the caller that keys the cache with it.
  ConvPrimitives(const Conv2dParams& params, ConvTypes types, ConvAlgorithm algorithm)
      : p(params),
        operand(types.prec == Precision::BFloat16 ? dt::bf16 : dt::f32),
        x_type(element_type(types.x)),
        y_type(element_type(types.y)),
        algo(algorithm),
        winograd(winograd_pays(params, types.prec, algorithm)) {
    const int64_t oh = p.out_h(), ow = p.out_w();
    strides = {p.stride_h, p.stride_w};
    dilates = {p.dil_h - 1, p.dil_w - 1};  // oneDNN counts the gaps: 0 means dense
    pad_l = {p.pad_h, p.pad_w};
    // Right/bottom padding that makes oneDNN's output size equal PyTorch's floor formula
    // exactly (it can be smaller than the left padding when the stride skips the last pixels).
    pad_r = {(oh - 1) * p.stride_h + p.dil_h * (p.kh - 1) + 1 - p.h - p.pad_h,
             (ow - 1) * p.stride_w + p.dil_w * (p.kw - 1) + 1 - p.w - p.pad_w};
    x_plain = memory::desc({p.n, p.c, p.h, p.w}, x_type, types.x_nhwc ? tag::nhwc : tag::nchw);
    if (p.groups == 1) {
      w_plain = memory::desc({p.o, p.c, p.kh, p.kw}, dt::f32, tag::oihw);
    } else {
      w_plain =
          memory::desc({p.groups, p.o / p.groups, p.c / p.groups, p.kh, p.kw}, dt::f32, tag::goihw);
    }
    b_plain = memory::desc({p.o}, dt::f32, tag::x);

    memory::desc x_any({p.n, p.c, p.h, p.w}, operand, activation_tag(p, operand, winograd));
    memory::desc y_any({p.n, p.o, oh, ow}, y_type, activation_tag(p, operand, winograd));
    memory::desc w_any(dims_of(w_plain), operand, tag::any);
    memory::desc b_md = p.has_bias ? b_plain : memory::desc();
    fwd_pd = with_algorithm(
        winograd,
        [&](dnnl::algorithm a) {
#if DNNL_VERSION_MAJOR >= 3
          return dnnl::convolution_forward::primitive_desc(
              engine(), dnnl::prop_kind::forward_training, a, x_any, w_any, b_md, y_any, strides,
              dilates, pad_l, pad_r);
#else
          dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, a, x_any, w_any,
                                            b_md, y_any, strides, dilates, pad_l, pad_r);
          return dnnl::convolution_forward::primitive_desc(d, engine());
#endif
        },
        &fwd_winograd);
    fwd = dnnl::convolution_forward(fwd_pd);
    // y's layout (conv2d_output_nhwc): NHWC where x is NHWC, or where the kernel writes NHWC
    // bytes or whole blocks of nChw16c (nChw8c below AVX-512): held NHWC, blocked activations take
    // the kernel's bytes as they are. Otherwise a network whose stem writes blocks (resnet20's
    // 16 channels below AVX-512, resnet18's 64 on any CPU) would stay NCHW after it, reorder every
    // activation twice per layer and miss our Winograd, which reads no NCHW.
    const memory::desc y_nhwc_desc({p.n, p.o, oh, ow}, y_type, tag::nhwc);
    const bool writes_blocks =
        p.o % activation_block() == 0 && fwd_pd.dst_desc() == blocked_desc(y_nhwc_desc);
    y_nhwc = types.x_nhwc || writes_blocks || same_bytes_as_nhwc(y_nhwc_desc, fwd_pd.dst_desc());
    y_plain = y_nhwc ? y_nhwc_desc : memory::desc({p.n, p.o, oh, ow}, y_type, tag::nchw);
    fwd_x = Arg(x_plain, fwd_pd.src_desc(), true);
    fwd_w = Arg(w_plain, fwd_pd.weights_desc(), true);
    fwd_y = Arg(y_plain, fwd_pd.dst_desc(), false);
    fwd_x_b = blocked_twin(fwd_x, true);
    fwd_y_b = blocked_twin(fwd_y, false);
    own_winograd = own_winograd_pays(p, types, algo);
  }

  void build_backward_data() {
    memory::desc gx_any(dims_of(x_plain), x_type, activation_tag(p, operand, winograd));
    memory::desc gy_any(dims_of(y_plain), operand, activation_tag(p, operand, winograd));
    memory::desc w_any(dims_of(w_plain), operand, tag::any);
    auto pd = with_algorithm(winograd, [&](dnnl::algorithm a) {
#if DNNL_VERSION_MAJOR >= 3
      return dnnl::convolution_backward_data::primitive_desc(
          engine(), a, gx_any, w_any, gy_any, strides, dilates, pad_l, pad_r, fwd_pd);
#else
      dnnl::convolution_backward_data::desc d(a, gx_any, w_any, gy_any, strides, dilates, pad_l,
                                              pad_r);
      return dnnl::convolution_backward_data::primitive_desc(d, engine(), fwd_pd);
#endif
    });
    bwd_data = dnnl::convolution_backward_data(pd);
    bd_gy = Arg(y_plain, pd.diff_dst_desc(), true);
    bd_w = Arg(w_plain, pd.weights_desc(), true);
    bd_gx = Arg(x_plain, pd.diff_src_desc(), false);
    bd_gy_b = blocked_twin(bd_gy, true);
    bd_gx_b = blocked_twin(bd_gx, false);
  }

  void build_backward_weights() {
    // Float32 operands and Winograd's algorithm (Note [bfloat16 weight gradient in Winograd]).
    const bool widen = operand == dt::bf16 && winograd_pays(p, Precision::Float32, algo) &&
                       p.c >= kBf16WinogradWeightsMinChannels &&
                       p.o >= kBf16WinogradWeightsMinChannels;
    const dt t = widen ? dt::f32 : operand;
    const bool wino = winograd || widen;
    memory::desc x_any(dims_of(x_plain), t, activation_tag(p, t, wino));
    memory::desc gy_any(dims_of(y_plain), t, activation_tag(p, t, wino));
    memory::desc gw_any(dims_of(w_plain), dt::f32, tag::any);
    memory::desc gb_md = p.has_bias ? b_plain : memory::desc();
    auto make_pd = [&] {
      return with_algorithm(wino, [&](dnnl::algorithm a) {
#if DNNL_VERSION_MAJOR >= 3
        if (!widen) {
          return dnnl::convolution_backward_weights::primitive_desc(
              engine(), a, x_any, gw_any, gb_md, gy_any, strides, dilates, pad_l, pad_r, fwd_pd);
        }
        // The hint oneDNN asks for: a forward of the same convolution with the same types.
        dnnl::convolution_forward::primitive_desc hint(
            engine(), dnnl::prop_kind::forward_training, a, x_any,
            memory::desc(dims_of(w_plain), dt::f32, tag::any), gb_md, gy_any, strides, dilates,
            pad_l, pad_r);
        return dnnl::convolution_backward_weights::primitive_desc(
            engine(), a, x_any, gw_any, gb_md, gy_any, strides, dilates, pad_l, pad_r, hint);
#else
        dnnl::convolution_backward_weights::desc d(a, x_any, gw_any, gb_md, gy_any, strides,
                                                   dilates, pad_l, pad_r);
        if (!widen) return dnnl::convolution_backward_weights::primitive_desc(d, engine(), fwd_pd);
        // The hint oneDNN asks for: a forward of the same convolution with the same types.
        dnnl::convolution_forward::desc f(dnnl::prop_kind::forward_training, a, x_any,
                                          memory::desc(w_plain.dims(), dt::f32, tag::any), gb_md,
                                          gy_any, strides, dilates, pad_l, pad_r);
        dnnl::convolution_forward::primitive_desc hint(f, engine());
        return dnnl::convolution_backward_weights::primitive_desc(d, engine(), hint);
#endif
      });
    };
    auto pd = make_pd();
    // jit_bf16 fixes its thread count when it is built: for a strided convolution, build it again
    // for one thread, and once more for one part of the batch per thread (Note [bf16 strided
    // weight gradient]).
    if ((p.stride_h > 1 || p.stride_w > 1) &&
        std::strncmp(pd.impl_info_str(), "jit_bf16", 8) == 0) {
      const int threads = get_num_threads();
      ScopedNumThreads one(1);
      pd = make_pd();
      if (threads > 1 && p.n % threads == 0) build_batch_parts(pd, threads);
    }
    bwd_weights = dnnl::convolution_backward_weights(pd);
    bw_x = Arg(x_plain, pd.src_desc(), true);
    bw_gy = Arg(y_plain, pd.diff_dst_desc(), true);
    bw_gw = Arg(w_plain, pd.diff_weights_desc(), false);
    bw_x_b = blocked_twin(bw_x, true);
    bw_gy_b = blocked_twin(bw_gy, true);
  }

  // The one-thread primitive of `parts` equal slices of the batch, for the layouts `whole` reads.
  // Only layouts that hold the images one after another can be sliced by an offset; the part's
  // primitive must be the same kernel (else the whole batch stays on one thread).
  void build_batch_parts(const dnnl::convolution_backward_weights::primitive_desc& whole,
                         int parts) {
    const memory::desc x = whole.src_desc(), gy = whole.diff_dst_desc();
    auto images_in_order = [](const memory::desc& d) {
      const memory::dims dims = dims_of(d);
      const dt t = type_of(d);
      for (tag f : {tag::nchw, tag::nhwc, tag::aBcd8b, tag::aBcd16b})
        if (d == memory::desc(dims, t, f)) return true;
      return false;
    };
    if (!images_in_order(x) || !images_in_order(gy)) return;
    const int64_t n = p.n / parts;
    const memory::dims zero = {0, 0, 0, 0};
    const memory::desc px = x.submemory_desc({n, p.c, p.h, p.w}, zero);
    const memory::desc pgy = gy.submemory_desc({n, p.o, p.out_h(), p.out_w()}, zero);
    const memory::desc gb_md = p.has_bias ? b_plain : memory::desc();
    const memory::desc w_any(dims_of(w_plain), operand, tag::any);
    const auto direct = dnnl::algorithm::convolution_direct;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
    dnnl::convolution_forward::primitive_desc hint(engine(), dnnl::prop_kind::forward_training,
                                                   direct, px, w_any, gb_md, pgy, strides, dilates,
                                                   pad_l, pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(
        engine(), direct, px, whole.diff_weights_desc(), gb_md, pgy, strides, dilates, pad_l, pad_r,
        hint, attr);
#else
    dnnl::convolution_forward::desc f(dnnl::prop_kind::forward_training, direct, px, w_any, gb_md,
                                      pgy, strides, dilates, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc hint(f, engine());
    dnnl::convolution_backward_weights::desc d(direct, px, whole.diff_weights_desc(), gb_md, pgy,
                                               strides, dilates, pad_l, pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, attr, engine(), hint);
#endif
    if (std::strcmp(pd.impl_info_str(), whole.impl_info_str()) != 0 || pd.src_desc() != px ||
        pd.diff_dst_desc() != pgy || pd.diff_weights_desc() != whole.diff_weights_desc()) {
      return;
    }
    bw_part_pd = pd;
    bw_part = dnnl::convolution_backward_weights(pd);
    bw_parts = parts;
  }
};

// The weight gradient of Note [bf16 strided weight gradient]'s split: part i of x and gy on
// thread i, into gw (part 0) or a buffer of its own, then summed into gw in part order; gb
// likewise where the layer has a bias.
void backward_weights_in_parts(const ConvPrimitives& cp, const memory& x, const memory& gy,
                               const memory& gw, float* gb, Scratch& s) {
  const int parts = cp.bw_parts;
  const memory::desc px = cp.bw_part_pd.src_desc(), pgy = cp.bw_part_pd.diff_dst_desc();
  const memory::desc scratch_md = cp.bw_part_pd.scratchpad_desc();
  const size_t gw_bytes = gw.get_desc().get_size(),
               gb_bytes = cp.p.has_bias ? cp.p.o * sizeof(float) : 0;
  std::vector<float*> gws(parts), gbs(parts);
  std::vector<void*> scratch(parts);
  for (int i = 0; i < parts; ++i) {
    gws[i] =
        i == 0 ? static_cast<float*>(gw.get_data_handle()) : static_cast<float*>(s.get(gw_bytes));
    gbs[i] = gb_bytes == 0 ? nullptr : i == 0 ? gb : static_cast<float*>(s.get(gb_bytes));
    scratch[i] = scratch_md.get_size() != 0 ? s.get(scratch_md.get_size()) : nullptr;
  }
  auto* x0 = static_cast<char*>(x.get_data_handle());
  auto* gy0 = static_cast<char*>(gy.get_data_handle());
  const memory::desc& gw_md = gw.get_desc();
  std::vector<std::exception_ptr> failed(parts);
  // A loop, not one part per thread id: where fewer threads come (a nested call), each runs
  // several parts.
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (int i = 0; i < parts; ++i) {
    try {
      dnnl::stream own(engine());
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(px, engine(), x0 + i * px.get_size())},
          {DNNL_ARG_DIFF_DST, memory(pgy, engine(), gy0 + i * pgy.get_size())},
          {DNNL_ARG_DIFF_WEIGHTS, memory(gw_md, engine(), gws[i])}};
      if (gb_bytes != 0) args.emplace(DNNL_ARG_DIFF_BIAS, memory(cp.b_plain, engine(), gbs[i]));
      if (scratch[i] != nullptr)
        args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch_md, engine(), scratch[i]));
      cp.bw_part.execute(own, args);
      own.wait();
    } catch (...) {
      failed[i] = std::current_exception();
    }
  }
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  const size_t w_count = gw_bytes / sizeof(float), b_count = gb_bytes / sizeof(float);
  for (int i = 1; i < parts; ++i) {
    for (size_t k = 0; k < w_count; ++k) gws[0][k] += gws[i][k];
    for (size_t k = 0; k < b_count; ++k) gbs[0][k] += gbs[i][k];
  }
}

// The cache key: a convolution, its types, the algorithm setting (set_conv_algorithm can change
// it between calls) and the thread count of the calling thread:
// oneDNN splits many kernels' work for the count they are built with and keeps that split, so a
// primitive built for 2 threads runs on 2 after set_num_threads(1) (Note [Threads under load] in
// tensor/adaptive_threads.cpp).
struct Key {
  Conv2dParams p;
  ConvTypes types;
  ConvAlgorithm algo;
  int threads;
  bool operator==(const Key& k) const {
    return p == k.p && types == k.types && algo == k.algo && threads == k.threads;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    const Conv2dParams& p = key.p;
    const int64_t v[] = {p.n,     p.c,     p.h,        p.w,        p.o,
                         p.kh,    p.kw,    p.stride_h, p.stride_w, p.pad_h,
                         p.pad_w, p.dil_h, p.dil_w,    p.groups,   p.has_bias ? 1 : 0};
    const ConvTypes& t = key.types;
    size_t h = static_cast<size_t>(t.prec);
    for (size_t bit :
         {static_cast<size_t>(t.x), static_cast<size_t>(t.y), static_cast<size_t>(t.x_nhwc)}) {
      h = h * 2 + bit;
    }
    h = h * 3 + static_cast<size_t>(key.algo);
    for (int64_t x : v) h = h * 1000003u ^ std::hash<int64_t>()(x);
    return h * 31u + static_cast<size_t>(key.threads);
  }
};

std::mutex cache_mutex;
std::unordered_map<Key, std::unique_ptr<ConvPrimitives>, KeyHash> cache;

// The cached primitives of `p` with `types`, built on first use. Entries are never removed, so
// the reference stays valid while other threads insert.
ConvPrimitives& primitives_for(const Conv2dParams& p, ConvTypes types) {
  DDP_CHECK(types.prec == Precision::BFloat16 ||
                (types.x == Element::Float32 && types.y == Element::Float32),
            "conv2d " << p.str() << ": bfloat16 activations need bfloat16 precision");
  const Key key{p, types, algorithm_setting().load(), get_num_threads()};
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto made = guarded(p, "forward primitive creation",
                      [&] { return std::make_unique<ConvPrimitives>(p, types, key.algo); });
  return *cache.emplace(key, std::move(made)).first->second;
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

bool conv2d_output_nhwc(const Conv2dParams& p, ConvTypes types) {
  // Where the kernel writes NHWC bytes, NHWC costs nothing. Elsewhere (Winograd's and the other
  // blocked layouts) y is reordered out either way, into NCHW or NHWC at about the same price,
  // and y follows x, as in PyTorch: once a network is channels-last it stays so, and batch norm's
  // NHWC loops are faster than its NCHW ones. resnet20 (channels-last from its first layer on),
  // float32, 2 threads, 6 interleaved rounds: median step 157 ms with every layer NHWC, 173 ms
  // with only the 16-channel ones (2026-12-03, AMD EPYC with AVX-512). A network that starts NCHW
  // stays NCHW until a layer writes NHWC bytes or whole blocks (Note [Blocked activations]); a
  // one-channel input counts as channels-last
  // (conv.cpp, counts_as_channels_last), so the small CNN runs channels-last too, pooling included.
  // The rule is applied where the primitives are built (ConvPrimitives::y_nhwc), which also lay out
  // y so.
  return primitives_for(p, types).y_nhwc;
}

namespace {

std::atomic<bool>& blocked_setting() {
  static std::atomic<bool> on(env_switch_on("DDPLAB_BLOCKED"));
  return on;
}

// Whether an activation array of `channels` held by the caller as `plain` may be blocked, and the
// primitive works in the blocked layout (nChw16c, nChw8c below AVX-512) on it (`prim`).
int64_t block_for(const memory::desc& plain, const memory::desc& prim, int64_t channels,
                  bool channels_last) {
  const int64_t block = activation_block();
  const bool wants = blocked_setting().load() && channels_last && channels > block &&
                     channels % block == 0 && prim == blocked_desc(plain);
  return wants ? block : 0;
}

}  // namespace

namespace {

// Our Winograd's view of one call (Note [Winograd of our own]), or nothing where it does
// not run: the setting or the shape rule it out, or an array is NCHW (block 0, not NHWC). `x_block`
// and `y_block` are the blocks the call was handed (0: laid out as `x_nhwc` and cp.y_nhwc say).
std::optional<winograd::Problem> own_winograd_problem(const ConvPrimitives& cp, int64_t x_block,
                                                      bool x_nhwc, int64_t y_block) {
  if (!cp.own_winograd) return std::nullopt;
  const Conv2dParams& p = cp.p;
  const int64_t xb = x_block != 0 ? x_block : x_nhwc ? p.c : 0;
  const int64_t yb = y_block != 0 ? y_block : cp.y_nhwc ? p.o : 0;
  const winograd::Problem q{
      p.n, p.c, p.h, p.w, p.o, xb, yb, activation_block(), 4, cp.operand == dt::bf16};
  if (!winograd::fits(q)) return std::nullopt;
  return q;
}

}  // namespace

void set_blocked_activations(bool on) {
  blocked_setting().store(on);
}

bool blocked_activations() {
  return blocked_setting().load();
}

int64_t conv2d_output_block(const Conv2dParams& p, ConvTypes types) {
  ConvPrimitives& cp = primitives_for(p, types);
  return block_for(cp.y_plain, cp.fwd_pd.dst_desc(), p.o, cp.y_nhwc);
}

int64_t conv2d_input_grad_block(const Conv2dParams& p, ConvTypes types) {
  ConvPrimitives& cp = primitives_for(p, types);
  return guarded(p, "backward data primitive creation", [&] {
    std::call_once(cp.bwd_data_once, [&] { cp.build_backward_data(); });
    return block_for(cp.x_plain, cp.bd_gx.prim, p.c, types.x_nhwc);
  });
}

size_t conv2d_saved_input_bytes(const Conv2dParams& p, ConvTypes types, int64_t x_block) {
  ConvPrimitives& cp = primitives_for(p, types);
  return guarded(p, "backward weights primitive creation", [&]() -> size_t {
    if (cp.own_winograd) return 0;  // ours reads x as the caller holds it
    std::call_once(cp.bwd_weights_once, [&] { cp.build_backward_weights(); });
    const Arg& fx = x_block != 0 ? cp.fwd_x_b : cp.fwd_x;
    const Arg& bx = x_block != 0 ? cp.bw_x_b : cp.bw_x;
    // Worth keeping only when forward reorders x anyway and backward would redo the same reorder.
    const bool same = fx.reorder && bx.reorder && fx.prim == bx.prim;
    return same ? fx.prim.get_size() : 0;
  });
}

void conv2d_forward(const Conv2dParams& p, const void* x, const float* w, const float* b, void* y,
                    ConvTypes types, void* x_saved, Blocks blocks) {
  ConvPrimitives& cp = primitives_for(p, types);
  if (auto q = own_winograd_problem(cp, blocks.x, types.x_nhwc, blocks.y)) {
    winograd::forward(*q, x, w, p.has_bias ? b : nullptr, y);
    return;
  }
  guarded(p, "forward", [&] {
    const Arg& ax = blocks.x != 0 ? cp.fwd_x_b : cp.fwd_x;
    const Arg& ay = blocks.y != 0 ? cp.fwd_y_b : cp.fwd_y;
    Scratch s;
    memory xm;
    if (x_saved != nullptr) {  // the reorder writes where backward will find it
      memory user(ax.user, engine(), const_cast<void*>(x));
      xm = memory(ax.prim, engine(), x_saved);
      ax.reorder->execute(stream(), user, xm);
    } else {
      xm = stage_input(ax, x, s);
    }
    memory wm = stage_input(cp.fwd_w, w, s);
    memory ym = stage_output(ay, y, s);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
    if (p.has_bias) {
      args.emplace(DNNL_ARG_BIAS, memory(cp.b_plain, engine(), const_cast<float*>(b)));
    }
    cp.fwd.execute(stream(), args);
    finish_output(ay, ym, y);
    stream().wait();
  });
}

void conv2d_backward(const Conv2dParams& p, const void* x, const void* x_saved, const void* gy,
                     const float* w, void* gx, float* gw, float* gb, ConvTypes types,
                     Blocks blocks) {
  ConvPrimitives& cp = primitives_for(p, types);
  if (gx != nullptr) {
    if (auto q = own_winograd_problem(cp, blocks.gx, types.x_nhwc, blocks.gy)) {
      winograd::backward_data(*q, gy, w, gx);
      gx = nullptr;  // done
    }
  }
  if (gw != nullptr && x != nullptr) {
    if (auto q = own_winograd_problem(cp, blocks.x, types.x_nhwc, blocks.gy)) {
      winograd::backward_weights(*q, x, gy, gw, p.has_bias ? gb : nullptr);
      gw = nullptr;
    }
  }
  if (gx == nullptr && gw == nullptr) return;
  guarded(p, "backward", [&] {
    Scratch s;
    // gy in the layout of the backward-data primitive; backward weights usually reads the same
    // one, and then reuses it instead of reordering gy a second time.
    std::optional<memory> gy_data;
    if (gx != nullptr) {
      std::call_once(cp.bwd_data_once, [&] { cp.build_backward_data(); });
      const Arg& agy = blocks.gy != 0 ? cp.bd_gy_b : cp.bd_gy;
      const Arg& agx = blocks.gx != 0 ? cp.bd_gx_b : cp.bd_gx;
      gy_data = stage_input(agy, gy, s);
      memory wm = stage_input(cp.bd_w, w, s);
      memory gxm = stage_output(agx, gx, s);
      cp.bwd_data.execute(
          stream(),
          {{DNNL_ARG_DIFF_DST, *gy_data}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, gxm}});
      finish_output(agx, gxm, gx);
    }
    if (gw != nullptr) {
      std::call_once(cp.bwd_weights_once, [&] { cp.build_backward_weights(); });
      const Arg& ax = blocks.x != 0 ? cp.bw_x_b : cp.bw_x;
      const Arg& agy = blocks.gy != 0 ? cp.bw_gy_b : cp.bw_gy;
      memory xm = x_saved != nullptr ? memory(ax.prim, engine(), const_cast<void*>(x_saved))
                                     : stage_input(ax, x, s);
      memory gym = gy_data && cp.bd_gy.prim == cp.bw_gy.prim ? *gy_data : stage_input(agy, gy, s);
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
      if (cp.bw_parts > 1) {
        backward_weights_in_parts(cp, xm, gym, gwm, gb, s);
      } else {
        cp.bwd_weights.execute(stream(), args);
      }
      finish_output(cp.bw_gw, gwm, gw);
    }
    stream().wait();
  });
}

void conv2d_backward_data(const Conv2dParams& p, const void* gy, const float* w, void* gx,
                          ConvTypes types) {
  conv2d_backward(p, nullptr, nullptr, gy, w, gx, nullptr, nullptr, types);
}

void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* gy, float* gw,
                             float* gb, ConvTypes types) {
  conv2d_backward(p, x, nullptr, gy, nullptr, nullptr, gw, gb, types);
}

void set_conv_algorithm(ConvAlgorithm a) {
  algorithm_setting().store(a);
}

ConvAlgorithm conv_algorithm() {
  return algorithm_setting().load();
}

bool conv_uses_winograd(const Conv2dParams& p, ConvTypes types) {
  const ConvPrimitives& cp = primitives_for(p, types);
  return cp.fwd_winograd || own_winograd_problem(cp, 0, types.x_nhwc, 0).has_value();
}

size_t conv_cache_size() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache.size();
}

std::string conv_forward_impl_name(const Conv2dParams& p, ConvTypes types) {
  return primitives_for(p, types).fwd_pd.impl_info_str();
}

int conv_backward_weights_parts(const Conv2dParams& p, ConvTypes types) {
  ConvPrimitives& cp = primitives_for(p, types);
  std::call_once(cp.bwd_weights_once, [&] { cp.build_backward_weights(); });
  return cp.bw_parts;
}

int major_version() {
  return dnnl_version()->major;
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
  return isa_is_avx512();
}

}  // namespace ddplab::nn::onednn
