// Activations in oneDNN's blocked layout (Note [Blocked activations] in tensor/blocked.cpp): the
// storage mark and its conversion for unaware readers, the elementwise ops that keep it, batch
// norm's blocked loops against its channels-last ones, and convolutions that write and read it
// against the same convolutions with the layout off.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "models/resnet.h"
#include "nn/batchnorm_kernels.h"
#include "nn/functional.h"
#include "nn/onednn.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"
#include "tests/skip.h"

using namespace ddplab;
namespace F = nn::functional;
using ops::MemoryFormat;

namespace {

// Restores the blocked-activations switch when a test ends.
struct BlockedSwitch {
  bool was = nn::onednn::blocked_activations();
  explicit BlockedSwitch(bool on) { nn::onednn::set_blocked_activations(on); }
  ~BlockedSwitch() { nn::onednn::set_blocked_activations(was); }
  BlockedSwitch(const BlockedSwitch&) = delete;
  BlockedSwitch& operator=(const BlockedSwitch&) = delete;
};

Tensor channels_last(const Tensor& t) {
  return ops::contiguous(t, MemoryFormat::ChannelsLast);
}

// Every run's results equal the first run's, bit for bit: runs[k][i] == runs[0][i].
template <size_t K>
void check_same_bits(const std::vector<Tensor> (&runs)[K]) {
  for (size_t k = 1; k < K; ++k) {
    REQUIRE(runs[k].size() == runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(k);
      CAPTURE(i);
      CHECK(ops::max_abs_diff(runs[k][i], runs[0][i]) == 0);
    }
  }
}

// The block of the blocked activations this CPU's float32 convolutions write: 16 (nChw16c) on
// AVX-512, 8 (nChw8c) on AVX2, 0 where they write none (Note [Blocked activations]). Asked of a
// real convolution, not of the ISA's name, so the tests follow what the library does.
int64_t conv_block() {
  BlockedSwitch on(true);
  Generator g(3);
  Tensor x = channels_last(ops::randn({2, 32, 6, 6}, kFloat32, &g));
  Tensor y = F::conv2d(x, ops::randn({32, 32, 3, 3}, kFloat32, &g), Tensor(), {1, 1}, {1, 1});
  return ops::blocked_block(y);
}

std::string why_no_blocked_convolutions() {
  return "oneDNN's float32 convolutions work in no blocked layout on this CPU (ISA " +
         nn::onednn::cpu_isa_name() + "): there are no blocked activations to compare";
}

}  // namespace

TEST_CASE("blocked layout: to_blocked puts every value where nChw16c says, raw_data puts it back") {
  Generator g(3);
  for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
    CAPTURE(dtype_name(dtype));
    const Shape s{3, 32, 5, 7};
    Tensor x = channels_last(ops::to(ops::randn(s, kFloat64, &g), dtype));
    Tensor b = ops::to_blocked(x, 16);
    REQUIRE(ops::blocked_block(b) == 16);
    // The bytes as they lie: [n][c / 16][h][w][c % 16].
    const std::vector<double> stored = ops::as_stored(b).to_vector<double>();  // NHWC-strided view
    const std::vector<double> want = x.to_vector<double>();                    // [n][c][h][w]
    // as_stored(b) reads the blocked bytes through NHWC strides: element (n, c, h, w) of that view
    // is the byte at NHWC offset ((n * H + h) * W + w) * C + c.
    auto at_nhwc = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
      return ((n * s[2] + h) * s[3] + w) * s[1] + c;
    };
    std::vector<double> bytes(stored.size());
    for (int64_t n = 0; n < s[0]; ++n)
      for (int64_t c = 0; c < s[1]; ++c)
        for (int64_t h = 0; h < s[2]; ++h)
          for (int64_t w = 0; w < s[3]; ++w)
            bytes[static_cast<size_t>(at_nhwc(n, c, h, w))] =
                stored[static_cast<size_t>(((n * s[1] + c) * s[2] + h) * s[3] + w)];
    int64_t wrong = 0;
    for (int64_t n = 0; n < s[0]; ++n)
      for (int64_t c = 0; c < s[1]; ++c)
        for (int64_t h = 0; h < s[2]; ++h)
          for (int64_t w = 0; w < s[3]; ++w) {
            const int64_t blocked =
                (((n * (s[1] / 16) + c / 16) * s[2] + h) * s[3] + w) * 16 + c % 16;
            if (bytes[static_cast<size_t>(blocked)] !=
                want[static_cast<size_t>(((n * s[1] + c) * s[2] + h) * s[3] + w)])
              ++wrong;
          }
    CHECK(wrong == 0);
    // An unaware reader gets the values back, and the mark is gone for every alias.
    Tensor alias = b.detach();
    CHECK(ops::max_abs_diff(b, x) == 0);
    CHECK(ops::blocked_block(b) == 0);
    CHECK(ops::blocked_block(alias) == 0);
    CHECK(ops::max_abs_diff(alias, x) == 0);
  }
}

TEST_CASE("blocked layout: views, in-place writes and aliases see one set of values") {
  Generator g(5);
  Tensor x = channels_last(ops::randn({2, 32, 3, 4}, kFloat32, &g));
  {
    Tensor b = ops::to_blocked(x, 16);
    Tensor part = ops::narrow(b, 1, 16, 16);  // a view: not whole, so it converts the storage
    CHECK(ops::blocked_block(part) == 0);
    CHECK(ops::max_abs_diff(part, ops::narrow(x, 1, 16, 16)) == 0);
    CHECK(ops::blocked_block(b) == 0);
  }
  {
    Tensor b = ops::to_blocked(x, 16);
    Tensor alias = b.detach();
    ops::mul_(alias, 2.0);  // broadcast scalar: unaware, converts first, then writes
    CHECK(ops::max_abs_diff(b, ops::mul(x, 2.0)) == 0);
  }
  {
    // Elementwise ops whose operands are blocked alike keep the layout and the values.
    Tensor a = ops::to_blocked(x, 16),
           b = ops::to_blocked(ops::randn({2, 32, 3, 4}, kFloat32, &g), 16);
    Tensor b_values = ops::clone(b);  // an unaware copy of the values, for the expected results
    Tensor b2 = ops::to_blocked(b_values, 16);
    Tensor sum = ops::add(a, b2);
    CHECK(ops::blocked_block(sum) == 16);
    Tensor r = ops::relu(sum);
    CHECK(ops::blocked_block(r) == 16);
    ops::add_(r, a);
    CHECK(ops::blocked_block(r) == 16);
    Tensor want = ops::add(ops::relu(ops::add(x, b_values)), x);
    CHECK(ops::max_abs_diff(r, want) == 0);
    CHECK(ops::blocked_block(r) == 0);  // max_abs_diff read it
  }
}

TEST_CASE("batch norm on blocked x: the channels-last results, forward and backward") {
  // The blocked loops walk the values in the channels-last loops' blocks and lanes, so every
  // result is the same bits (NhwcBlocks in nn/batchnorm_nhwc_walk.h). Shapes: planes (one sample's
  // 16 channels) shorter than a block, a block then spanning several and ending inside one, in a
  // lane group (9x11 planes: 99 pixels, 4 to a group) or at its end; planes longer than a block;
  // one pixel per plane; 48 channels (lanes not a constant width).
  const std::vector<Shape> shapes{
      {6, 32, 9, 11}, {3, 48, 20, 20}, {5, 64, 8, 8}, {9, 32, 1, 1}, {8, 32, 16, 16}};
  Generator g(11);
  for (const int64_t B : {16, 8}) {
    for (DType dtype : {kFloat64, kFloat32}) {
      for (const Shape& s : shapes) {
        Tensor x0 = channels_last(ops::to(ops::add(ops::randn(s, kFloat64, &g), 0.3), dtype));
        Tensor r0 = channels_last(ops::to(ops::randn(s, kFloat64, &g), dtype));
        Tensor w0 = ops::to(ops::randn({s[1]}, kFloat64, &g), dtype);
        Tensor b0 = ops::to(ops::randn({s[1]}, kFloat64, &g), dtype);
        Tensor dy = channels_last(ops::to(ops::randn(s, kFloat64, &g), dtype));
        for (int op = 0; op < 3; ++op) {  // batch_norm, batch_norm_relu, batch_norm_add_relu
          for (int mode = 0; mode < 2; ++mode) {  // training, eval
            const bool training = mode == 0;
            CAPTURE(B);
            CAPTURE(dtype_name(dtype));
            CAPTURE(shape_str(s));
            CAPTURE(op);
            CAPTURE(training);
            std::vector<Tensor> out[2];
            for (int blocked = 0; blocked < 2; ++blocked) {
              Tensor x = blocked ? ops::to_blocked(x0, B) : channels_last(ops::clone(x0));
              Tensor r = blocked ? ops::to_blocked(r0, B) : channels_last(ops::clone(r0));
              Tensor w = ops::clone(w0), b = ops::clone(b0);
              for (Tensor* t : {&x, &r, &w, &b}) t->set_requires_grad(true);
              Tensor rm = ops::full({s[1]}, 0.25, dtype), rv = ops::full({s[1]}, 1.5, dtype);
              Tensor y = op == 0   ? F::batch_norm(x, rm, rv, w, b, training)
                         : op == 1 ? F::batch_norm_relu(x, rm, rv, w, b, training)
                                   : F::batch_norm_add_relu(x, r, rm, rv, w, b, training);
              if (s[2] * s[3] > 1) CHECK(ops::blocked_block(y) == (blocked ? B : 0));
              Tensor g_in = blocked ? ops::to_blocked(dy, B) : dy;
              out[blocked] = op == 2 ? autograd::grad({y}, {x, w, b, r}, {g_in})
                                     : autograd::grad({y}, {x, w, b}, {g_in});
              if (s[2] * s[3] > 1) CHECK(ops::blocked_block(out[blocked][0]) == (blocked ? B : 0));
              for (const Tensor& t : {y, rm, rv}) out[blocked].push_back(t);
            }
            check_same_bits(out);
          }
        }
      }
    }
  }
}

TEST_CASE("resnet20 with blocked activations: the same bits as without them") {
  // One forward and backward at batch 8 with the layout on and off, from the same weights and
  // images: logits, loss and every parameter's gradient are equal exactly (convolutions, batch
  // norm and the gradient sums all compute the same bits in either layout).
  const int64_t B = conv_block();
  DDP_SKIP_IF(B == 0, why_no_blocked_convolutions());
  Generator gen(41);
  const Tensor images = ops::randn({8, 3, 32, 32}, {}, &gen);
  const Tensor labels = ops::randint(0, 10, {8}, &gen);
  std::vector<Tensor> results[2];
  for (int on = 0; on < 2; ++on) {
    BlockedSwitch blocked(on == 1);
    manual_seed(5);  // the same initial weights both times
    auto model = models::cifar_resnet(20, 10);
    Tensor logits = (*model)(images);
    Tensor loss = F::cross_entropy(logits, labels);
    loss.backward();
    results[on] = {logits.detach(), loss.detach()};
    for (auto& [name, p] : model->named_parameters()) results[on].push_back(p.grad());
  }
  check_same_bits(results);
}

TEST_CASE("conv2d with blocked activations: the same bits as with channels-last ones") {
  // The primitive is the same either way; only the reorders around it differ, so y and every
  // gradient must be equal exactly, whether x and gy come in blocked or channels-last, and y and
  // gx must come out blocked where the kernel works in the blocked layout (32 and 64 channels in
  // nChw16c on AVX-512; 16, 32 and 64 in nChw8c on AVX2).
  const int64_t B = conv_block();
  DDP_SKIP_IF(B == 0, why_no_blocked_convolutions());
  struct Conv {
    int64_t c, o, k, stride, pad;
  };
  const std::vector<Conv> convs{{32, 32, 3, 1, 1}, {32, 64, 3, 2, 1}, {32, 64, 1, 2, 0},
                                {16, 32, 3, 1, 1}, {64, 64, 3, 1, 1}, {48, 32, 3, 1, 1}};
  Generator g(17);
  for (const Conv& cv : convs) {
    CAPTURE(cv.c);
    CAPTURE(cv.o);
    CAPTURE(cv.k);
    CAPTURE(cv.stride);
    // oneDNN 3.x's strided backward-data kernel (brgconv_strided) works in NHWC.
    const bool gx_blocked = cv.stride == 1 || nn::onednn::major_version() < 3;
    const Shape xs{4, cv.c, 12, 12};
    Tensor x0 = channels_last(ops::randn(xs, kFloat32, &g));
    Tensor w0 = ops::randn({cv.o, cv.c, cv.k, cv.k}, kFloat32, &g);
    Tensor b0 = ops::randn({cv.o}, kFloat32, &g);
    const int64_t oh = (12 + 2 * cv.pad - cv.k) / cv.stride + 1;
    Tensor dy = channels_last(ops::randn({4, cv.o, oh, oh}, kFloat32, &g));
    std::vector<Tensor> out[3];
    for (int run = 0; run < 3; ++run) {  // layout off; on with x as given; on with x blocked
      BlockedSwitch blocked(run > 0);
      Tensor x = run == 2 && cv.c % B == 0 ? ops::to_blocked(x0, B) : channels_last(ops::clone(x0));
      Tensor w = ops::clone(w0), b = ops::clone(b0);
      for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
      Tensor y = F::conv2d(x, w, b, {cv.stride, cv.stride}, {cv.pad, cv.pad});
      if (run > 0 && cv.o > B) CHECK(ops::blocked_block(y) == B);
      if (run == 0) CHECK(ops::blocked_block(y) == 0);
      Tensor gy = run > 0 && ops::blocked_block(y) != 0 ? ops::to_blocked(dy, B) : dy;
      out[run] = autograd::grad({y}, {x, w, b}, {gy});
      if (run > 0 && cv.c > B) CHECK(ops::blocked_block(out[run][0]) == (gx_blocked ? B : 0));
      out[run].push_back(y);
    }
    check_same_bits(out);
  }
}

TEST_CASE("two residual blocks with blocked activations: the same bits as without them") {
  // resnet20's 32-channel stage in miniature: x -> conv -> batch_norm_relu -> conv ->
  // batch_norm_add_relu(., x), twice. The block input feeds a convolution and the residual, so
  // its gradient is a sum of two (autograd adds them, blocked); the first block's residual is
  // channels-last, the second's blocked.
  const int64_t B = conv_block();
  DDP_SKIP_IF(B == 0, why_no_blocked_convolutions());
  Generator g(23);
  const Shape s{8, 32, 16, 16};
  Tensor x0 = channels_last(ops::randn(s, kFloat32, &g));
  std::vector<Tensor> w0(4);
  for (Tensor& w : w0) w = ops::mul(ops::randn({32, 32, 3, 3}, kFloat32, &g), 0.1);
  Tensor dy = ops::randn(s, kFloat32, &g);
  std::vector<Tensor> out[2];
  for (int on = 0; on < 2; ++on) {
    BlockedSwitch blocked(on == 1);
    Tensor x = channels_last(ops::clone(x0));
    // Four convolutions, each followed by a batch norm with its own weight and bias.
    std::vector<Tensor> w(4), gamma(4), beta(4), leaves{x};
    for (size_t i = 0; i < 4; ++i) {
      w[i] = ops::clone(w0[i]);
      gamma[i] = ops::ones({32});
      beta[i] = ops::zeros({32});
      for (Tensor* t : {&w[i], &gamma[i], &beta[i]}) leaves.push_back(*t);
    }
    for (Tensor& t : leaves) t.set_requires_grad(true);
    Tensor h = x;
    for (size_t a = 0; a < 4; a += 2) {
      const size_t b = a + 1;
      Tensor u = F::batch_norm_relu(F::conv2d(h, w[a], Tensor(), {1, 1}, {1, 1}), Tensor(),
                                    Tensor(), gamma[a], beta[a], true);
      h = F::batch_norm_add_relu(F::conv2d(u, w[b], Tensor(), {1, 1}, {1, 1}), h, Tensor(),
                                 Tensor(), gamma[b], beta[b], true);
    }
    if (on == 1) CHECK(ops::blocked_block(h) == B);
    out[on] = autograd::grad({h}, leaves, {dy});
    out[on].push_back(h);
  }
  check_same_bits(out);
}

TEST_CASE("max_pool2d 2x2 on blocked x: the channels-last results, blocked") {
  // The channels-last kernel run on the blocked bytes as N * C/B images of B channels (its
  // 16-channel loops are compiled apart), for blocks of 16 (AVX-512) and 8 (AVX2): y, the gradient
  // and their layouts; odd sizes leave a row and a column in no window; ties and a NaN check the
  // winner rule in the blocked order too.
  Generator g(31);
  for (const int64_t B : {16, 8}) {
    for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
      for (const Shape& s : {Shape{3, 32, 9, 7}, Shape{2, 48, 8, 8}}) {
        CAPTURE(B);
        CAPTURE(dtype_name(dtype));
        CAPTURE(shape_str(s));
        // Values in steps of 0.5 (ties are common), one NaN.
        Tensor x0 = ops::mul(ops::to(ops::randint(-4, 5, s, &g), kFloat64), 0.5);
        ops::fill_(
            ops::narrow(ops::narrow(ops::narrow(ops::narrow(x0, 0, 1, 1), 1, 17, 1), 2, 3, 1), 3, 2,
                        1),
            std::nan(""));
        x0 = channels_last(ops::to(x0, dtype));
        const Shape ys{s[0], s[1], s[2] / 2, s[3] / 2};
        Tensor dy = channels_last(ops::to(ops::randn(ys, kFloat64, &g), dtype));
        std::vector<Tensor> out[2];
        for (int blocked = 0; blocked < 2; ++blocked) {
          Tensor x = blocked ? ops::to_blocked(x0, B) : channels_last(ops::clone(x0));
          x.set_requires_grad(true);
          Tensor y = F::max_pool2d(x, {2, 2}, {2, 2}, {0, 0});
          CHECK(ops::blocked_block(y) == (blocked ? B : 0));
          out[blocked] = autograd::grad({y}, {x}, {blocked ? ops::to_blocked(dy, B) : dy});
          CHECK(ops::blocked_block(out[blocked][0]) == (blocked ? B : 0));
          out[blocked].push_back(y);
        }
        for (size_t i = 0; i < 2; ++i) {
          CAPTURE(i);
          // Bit for bit, NaN included: compare the bytes in a common (channels-last) layout.
          const std::vector<double> a = out[1][i].to_vector<double>(),
                                    b = out[0][i].to_vector<double>();
          REQUIRE(a.size() == b.size());
          int64_t differ = 0;
          for (size_t k = 0; k < a.size(); ++k) {
            if (!(a[k] == b[k] || (std::isnan(a[k]) && std::isnan(b[k])))) ++differ;
          }
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("adaptive_avg_pool2d to 1x1 on blocked and channels-last x: the row-major bits") {
  // The channels-last and blocked pool sums each plane in double in the same pixel order as the
  // row-major kernel, so y and the gradient are the same bits; the gradient keeps x's layout.
  Generator g(37);
  for (DType dtype : {kFloat32, kFloat64}) {
    const Shape s{5, 32, 7, 6};
    Tensor x0 = ops::to(ops::randn(s, kFloat64, &g), dtype);
    Tensor dy = ops::to(ops::randn({5, 32, 1, 1}, kFloat64, &g), dtype);
    std::vector<Tensor> out[3];
    for (int layout = 0; layout < 3; ++layout) {  // row-major, channels-last, blocked
      CAPTURE(dtype_name(dtype));
      CAPTURE(layout);
      Tensor x = layout == 0   ? ops::clone(x0)
                 : layout == 1 ? channels_last(ops::clone(x0))
                               : ops::to_blocked(channels_last(x0), 16);
      x.set_requires_grad(true);
      Tensor y = F::adaptive_avg_pool2d(x, {1, 1});
      out[layout] = autograd::grad({y}, {x}, {dy});
      CHECK(ops::blocked_block(out[layout][0]) == (layout == 2 ? 16 : 0));
      if (layout == 1)
        CHECK(ops::suggest_memory_format(out[layout][0]) == MemoryFormat::ChannelsLast);
      out[layout].push_back(y);
    }
    check_same_bits(out);
  }
}

TEST_CASE("SyncBatchNorm's steps on blocked x: the channels-last bits, results blocked") {
  // batch_norm_moments / normalize / grad_sums / input_grad (nn/batchnorm_steps.cpp), what
  // SyncBatchNorm runs around its all-reduces, on a blocked x (and dy channels-last or blocked).
  Generator g(43);
  const Shape s{6, 32, 9, 11};
  Tensor x0 = channels_last(ops::randn(s, kFloat32, &g));
  Tensor dy0 = channels_last(ops::randn(s, kFloat32, &g));
  Tensor w = ops::randn({32}, kFloat32, &g), b = ops::randn({32}, kFloat32, &g);
  std::vector<Tensor> out[3];
  for (int layout = 0; layout < 3; ++layout) {  // channels-last; blocked x; blocked x and dy
    CAPTURE(layout);
    Tensor x = layout == 0 ? x0 : ops::to_blocked(x0, 16);
    Tensor dy = layout == 2 ? ops::to_blocked(dy0, 16) : dy0;
    const F::BatchNormMoments m = F::batch_norm_moments(x);
    Tensor invstd = ops::rsqrt(ops::add(ops::div(m.m2, 594.0), 1e-5));
    Tensor y = F::batch_norm_normalize(x, m.mean, invstd, w, b);
    Tensor sums = F::batch_norm_grad_sums(x, dy, m.mean);
    Tensor dx = F::batch_norm_input_grad(x, dy, m.mean, invstd, w, sums, 594.0);
    CHECK(ops::blocked_block(y) == (layout == 0 ? 0 : 16));
    CHECK(ops::blocked_block(dx) == (layout == 0 ? 0 : 16));
    out[layout] = {m.mean, m.m2, y, sums, dx};
  }
  check_same_bits(out);
}

TEST_CASE("add_relu and relu on blocked x: the channels-last bits, blocked results and gradients") {
  // What SyncBatchNorm's blocks run after it (relu(y), add_relu(y, residual)), with the residual
  // blocked or channels-last and the incoming gradient channels-last.
  Generator g(47);
  const Shape s{4, 32, 5, 6};
  Tensor a0 = channels_last(ops::randn(s, kFloat32, &g));
  Tensor b0 = channels_last(ops::randn(s, kFloat32, &g));
  Tensor dy = channels_last(ops::randn(s, kFloat32, &g));
  std::vector<Tensor> out[3];
  for (int layout = 0; layout < 3; ++layout) {  // channels-last; a blocked; a and b blocked
    CAPTURE(layout);
    Tensor a = layout == 0 ? channels_last(ops::clone(a0)) : ops::to_blocked(a0, 16);
    Tensor b = layout == 2 ? ops::to_blocked(b0, 16) : channels_last(ops::clone(b0));
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor y = F::add_relu(a, b), r = F::relu(a);
    CHECK(ops::blocked_block(y) == (layout == 0 ? 0 : 16));
    CHECK(ops::blocked_block(r) == (layout == 0 ? 0 : 16));
    out[layout] = autograd::grad({y, r}, {a, b}, {dy, dy});
    CHECK(ops::blocked_block(out[layout][0]) == (layout == 0 ? 0 : 16));
    out[layout].push_back(y);
    out[layout].push_back(r);
  }
  check_same_bits(out);
}
