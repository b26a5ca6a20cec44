// batch_norm and batch_norm_relu on channels-last input (the NHWC loops of
// nn/batchnorm_channels_last.cpp and nn/batchnorm_channels_last_backward.cpp): the same values as
// on the contiguous input, which runs the reference kernels (nn/batchnorm_contiguous.cpp), in every
// dtype, forward and backward, training and eval; results stay channels-last; the sums are the
// same bits on any number of threads.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "nn/batchnorm_kernels.h"
#include "nn/functional.h"
#include "nn/sync_batchnorm.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

using namespace ddplab;
using ops::MemoryFormat;

namespace {

bool channels_last(const Tensor& t) {
  return ops::suggest_memory_format(t) == MemoryFormat::ChannelsLast;
}

// What one batch norm call produces: y, the gradients of x, weight and bias, running statistics.
struct Results {
  Tensor y, dx, dw, db, rm, rv;
  std::vector<Tensor> all() const { return {y, dx, dw, db, rm, rv}; }
};

struct Case {
  bool relu, training, running;
};

// Runs batch norm (with relu when c.relu) on x laid out in `format`, with fresh leaves for x,
// weight and bias and fresh running statistics, and backward with dy (in the layout it comes in).
Results run(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& dy, const Case& c,
            MemoryFormat format) {
  Tensor x = format == MemoryFormat::Contiguous ? ops::clone(x0) : ops::contiguous(x0, format);
  Tensor w = ops::clone(w0), b = ops::clone(b0);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  const int64_t ch = x0.size(1);
  Results r;
  if (c.running) {
    r.rm = ops::full({ch}, 0.25, w0.dtype());
    r.rv = ops::full({ch}, 1.5, w0.dtype());
  }
  const auto op = c.relu ? F::batch_norm_relu : F::batch_norm;
  r.y = op(x, r.rm, r.rv, w, b, c.training, 0.1, 1e-5);
  // autograd::grad: the gradients as the backward returns them (.grad is always contiguous).
  const std::vector<Tensor> g = autograd::grad({r.y}, {x, w, b}, {dy});
  r.dx = g[0];
  r.dw = g[1];
  r.db = g[2];
  return r;
}

const std::vector<Case> kCases{{false, true, true}, {true, true, true},    {false, false, true},
                               {true, false, true}, {false, false, false}, {true, true, false}};

// Shapes whose pixels span several blocks, the last one partial, for C below, at and above one
// lane group (128 values) and with C not dividing it.
const std::vector<Shape> kShapes{{6, 16, 9, 11}, {8, 3, 15, 13}, {3, 20, 10, 9}, {2, 200, 4, 5}};

// Channels-last against contiguous: each result within `tol` of the largest value, and the
// output and dx channels-last. x has mean `offset` and standard deviation 2.
void check_against_contiguous(DType dtype, double tol, double offset = 0.5) {
  Generator g(7);
  for (const Shape& s : kShapes) {
    const DType param = dtype == kBFloat16 ? kFloat32 : dtype;
    Tensor x = ops::to(ops::add(ops::mul(ops::randn(s, kFloat64, &g), 2.0), offset), dtype);
    Tensor w = ops::to(ops::randn({s[1]}, kFloat64, &g), param);
    Tensor b = ops::to(ops::randn({s[1]}, kFloat64, &g), param);
    Tensor dy = ops::to(ops::randn(s, kFloat64, &g), dtype);
    for (const Case& c : kCases) {
      CAPTURE(shape_str(s));
      CAPTURE(c.relu);
      CAPTURE(c.training);
      CAPTURE(c.running);
      const Results nhwc = run(x, w, b, dy, c, MemoryFormat::ChannelsLast);
      const Results nchw = run(x, w, b, dy, c, MemoryFormat::Contiguous);
      REQUIRE(channels_last(x) == false);
      CHECK(channels_last(nhwc.y));
      CHECK(channels_last(nhwc.dx));
      CHECK(nchw.y.is_contiguous());
      const std::vector<Tensor> a = nhwc.all(), e = nchw.all();
      for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        if (!e[i].defined()) continue;
        CHECK(a[i].dtype() == e[i].dtype());
        CHECK(ops::max_rel_error(a[i], e[i]) <= tol);
      }
    }
  }
}

}  // namespace

TEST_CASE("batch_norm channels-last: float32 matches the contiguous input") {
  check_against_contiguous(kFloat32, 1e-6);
}

// Against the reference kernels on the same values in float64.
TEST_CASE("batch_norm channels-last: float32 statistics of values far from zero") {
  // The NHWC loops add float32 values in float within a block (the contiguous loops in double).
  // Far from zero a float sum of the values would round away their spread; the loops sum
  // deviations instead (from a reference value, from the mean rounded to float) and correct for
  // the rounding. Reference: the same float32 values' statistics in float64, in double.
  Generator g(23);
  struct Data {
    double offset, stddev;
  };
  for (const Data& v : {Data{1000.0, 2.0}, Data{1e5, 0.5}}) {
    for (const Shape& s : kShapes) {
      CAPTURE(v.offset);
      CAPTURE(shape_str(s));
      Tensor x =
          ops::to(ops::add(ops::mul(ops::randn(s, kFloat64, &g), v.stddev), v.offset), kFloat32);
      Tensor dy = ops::to(ops::randn(s, kFloat64, &g), kFloat32);
      const Tensor x64 = ops::to(x, kFloat64), dy64 = ops::to(dy, kFloat64);
      const Tensor xl = ops::contiguous(x, MemoryFormat::ChannelsLast);
      const Tensor dyl = ops::contiguous(dy, MemoryFormat::ChannelsLast);
      const F::BatchNormMoments m = F::batch_norm_moments(xl), e = F::batch_norm_moments(x64);
      CHECK(ops::max_rel_error(m.mean, e.mean) <= 1e-12);
      CHECK(ops::max_rel_error(m.m2, e.m2) <= 1e-6);
      const Tensor sums = F::batch_norm_grad_sums(xl, dyl, e.mean);
      CHECK(ops::max_rel_error(sums, F::batch_norm_grad_sums(x64, dy64, e.mean)) <= 1e-6);
    }
  }
}

TEST_CASE("batch_norm channels-last: float64 matches the contiguous input") {
  check_against_contiguous(kFloat64, 1e-12);
}

TEST_CASE("batch_norm channels-last: bfloat16 matches the contiguous input within its rounding") {
  // A value rounds to bfloat16 differently when the float32 before it moved by one ulp: one step
  // of bfloat16 (2^-8 relative) at most.
  check_against_contiguous(kBFloat16, 1.0 / 128);
}

TEST_CASE("batch_norm channels-last: gradcheck in float64, training and eval, with relu") {
  Generator g(11);
  const Shape s{3, 4, 3, 5};
  Tensor x = ops::contiguous(ops::randn(s, kFloat64, &g), MemoryFormat::ChannelsLast);
  Tensor w = ops::randn({4}, kFloat64, &g), b = ops::add(ops::randn({4}, kFloat64, &g), 0.3);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  REQUIRE(channels_last(x));
  Tensor rm = ops::from_vector(std::vector<double>{0.1, -0.2, 0.3, 0.0}, {4}, kFloat64);
  Tensor rv = ops::from_vector(std::vector<double>{1.5, 0.5, 2.0, 1.0}, {4}, kFloat64);
  for (bool relu : {false, true}) {
    for (bool training : {true, false}) {
      CAPTURE(relu);
      CAPTURE(training);
      const auto op = relu ? F::batch_norm_relu : F::batch_norm;
      autograd::GradcheckResult r = autograd::gradcheck(
          [&](const std::vector<Tensor>& v) {
            return training ? op(v[0], Tensor(), Tensor(), v[1], v[2], true, 0.1, 1e-5)
                            : op(v[0], rm, rv, v[1], v[2], false, 0.1, 1e-5);
          },
          {x, w, b});
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
}

TEST_CASE("batch_norm channels-last: the same bits on 1 and 2 threads, and run to run") {
  // Large enough for the parallel loops (and 16 blocks of pixels).
  const int threads = get_num_threads();
  Generator g(13);
  const Shape s{16, 16, 16, 16};
  // float64 shows a change in the order of the sums in its last bits; float32 and bfloat16 round
  // the double sums and mostly hide one, but run the same code.
  for (DType dtype : {kFloat64, kFloat32, kBFloat16}) {
    CAPTURE(dtype_name(dtype));
    const DType param = dtype == kBFloat16 ? kFloat32 : dtype;
    Tensor x = ops::to(ops::randn(s, kFloat64, &g), dtype);
    Tensor w = ops::randn({16}, param, &g), b = ops::randn({16}, param, &g);
    Tensor dy = ops::to(ops::randn(s, kFloat64, &g), dtype);
    for (bool relu : {false, true}) {
      CAPTURE(relu);
      const Case c{relu, true, true};
      std::vector<Results> r;
      for (int n : {1, 2, 2}) {
        set_num_threads(n);
        r.push_back(run(x, w, b, ops::contiguous(dy, MemoryFormat::ChannelsLast), c,
                        MemoryFormat::ChannelsLast));
      }
      set_num_threads(threads);
      for (size_t k = 1; k < r.size(); ++k) {
        const std::vector<Tensor> a = r[0].all(), e = r[k].all();
        for (size_t i = 0; i < a.size(); ++i) CHECK(ops::max_abs_diff(a[i], e[i]) == 0);
      }
    }
  }
}

// As the reference's clamp (relu_clamp, written as ReluOp is): NaN in, NaN out.
TEST_CASE("batch_norm_relu channels-last: NaN stays NaN") {
  Tensor x = ops::contiguous(ops::ones({2, 3, 4, 4}), MemoryFormat::ChannelsLast);
  ops::fill_(ops::narrow(x, 1, 1, 1), 2.0);
  Tensor one =
      ops::narrow(ops::narrow(ops::narrow(ops::narrow(x, 0, 1, 1), 1, 0, 1), 2, 1, 1), 3, 2, 1);
  ops::fill_(one, std::nan(""));
  Tensor y = F::batch_norm_relu(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  const std::vector<float> v = ops::narrow(y, 1, 0, 1).to_vector<float>();
  for (float f : v) CHECK(std::isnan(f));  // channel 0's statistics are NaN
  CHECK(ops::amax(ops::abs(ops::narrow(y, 1, 1, 2))).item<float>() == 0.0f);
}

// Against the same call on the contiguous input (the reference kernels).
TEST_CASE("sync_batch_norm without a group, channels-last: its steps keep the layout") {
  // The SyncBatchNorm steps (nn/batchnorm_kernels.h, nn/batchnorm_steps.cpp) run the same NHWC
  // loops.
  Generator g(17);
  const Shape s{6, 16, 9, 11};
  for (DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    Tensor x0 = ops::to(ops::add(ops::randn(s, kFloat64, &g), 3.0), dtype);
    Tensor w0 = ops::randn({16}, dtype, &g), b0 = ops::randn({16}, dtype, &g);
    Tensor dy = ops::to(ops::randn(s, kFloat64, &g), dtype);
    std::vector<Tensor> r[2];
    for (int k = 0; k < 2; ++k) {
      Tensor x = k ? ops::contiguous(x0, MemoryFormat::ChannelsLast) : ops::clone(x0);
      Tensor w = ops::clone(w0), b = ops::clone(b0);
      for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
      Tensor rm = ops::zeros({16}, dtype), rv = ops::ones({16}, dtype);
      Tensor y = nn::functional::sync_batch_norm(x, rm, rv, w, b, 0.1, 1e-5, nullptr);
      r[k] = autograd::grad({y}, {x, w, b}, {dy});
      r[k].insert(r[k].begin(), y);
      r[k].push_back(rm);
      r[k].push_back(rv);
    }
    CHECK(channels_last(r[1][0]));  // y
    CHECK(channels_last(r[1][1]));  // dx
    for (size_t i = 0; i < r[0].size(); ++i) {
      CAPTURE(i);
      CHECK(ops::max_rel_error(r[1][i], r[0][i]) <= (dtype == kFloat64 ? 1e-12 : 1e-6));
    }
  }
}

// Against the same values made contiguous (the reference kernels).
TEST_CASE("batch_norm channels-last: a view that starts inside its storage") {
  Generator g(19);
  Tensor whole =
      ops::contiguous(ops::randn({5, 16, 6, 7}, kFloat64, &g), MemoryFormat::ChannelsLast);
  Tensor x = ops::narrow(whole, 0, 2, 3);  // samples 2..4: channels-last, at an offset
  REQUIRE(channels_last(x));
  Tensor y = F::batch_norm_relu(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  Tensor y_ref =
      F::batch_norm_relu(ops::contiguous(x), Tensor(), Tensor(), Tensor(), Tensor(), true);
  CHECK(channels_last(y));
  CHECK(ops::max_rel_error(y, y_ref) <= 1e-12);
}

TEST_CASE("batch_norm_add_relu: bit for bit add_relu(batch_norm(...)), forward and backward") {
  // Channels-last runs the fused pass (its backward masks by the saved output, in the sums pass,
  // or alone where eval mode with weight and bias not learning needs no sums); a contiguous x
  // takes the two calls. Either way every output and gradient, the residual's included, and the
  // running statistics must equal the separate calls' exactly.
  Generator g(29);
  const Shape s{6, 16, 9, 11};
  for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
    const DType param = dtype == kBFloat16 ? kFloat32 : dtype;
    Tensor x0 = ops::to(ops::randn(s, kFloat64, &g), dtype);
    Tensor r0 = ops::to(ops::randn(s, kFloat64, &g), dtype);
    Tensor w0 = ops::randn({16}, param, &g), b0 = ops::randn({16}, param, &g);
    Tensor dy = ops::to(ops::randn(s, kFloat64, &g), dtype);
    for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
      for (const auto& mode :
           {std::pair{true, true}, std::pair{false, true}, std::pair{false, false}}) {
        const bool training = mode.first, affine_learns = mode.second;  // CAPTURE reads them
        CAPTURE(dtype_name(dtype));
        CAPTURE(format == MemoryFormat::ChannelsLast);
        CAPTURE(training);
        CAPTURE(affine_learns);
        std::vector<Tensor> out[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor x = ops::contiguous(x0, format), r = ops::contiguous(r0, format);
          Tensor w = ops::clone(w0), b = ops::clone(b0);
          for (Tensor* t : {&x, &r}) t->set_requires_grad(true);
          for (Tensor* t : {&w, &b}) t->set_requires_grad(affine_learns);
          Tensor rm = ops::full({16}, 0.25, param), rv = ops::full({16}, 1.5, param);
          Tensor y = fused ? F::batch_norm_add_relu(x, r, rm, rv, w, b, training)
                           : F::add_relu(F::batch_norm(x, rm, rv, w, b, training), r);
          out[fused] = affine_learns ? autograd::grad({y}, {x, r, w, b}, {dy})
                                     : autograd::grad({y}, {x, r}, {dy});
          for (const Tensor& t : {y, rm, rv}) out[fused].push_back(t);
        }
        CHECK(channels_last(out[1][out[1].size() - 3]) == (format == MemoryFormat::ChannelsLast));
        for (size_t i = 0; i < out[0].size(); ++i) {
          CAPTURE(i);
          CHECK(ops::max_abs_diff(out[1][i], out[0][i]) == 0);
        }
      }
    }
  }
}
