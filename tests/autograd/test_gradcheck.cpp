// gradcheck of every differentiable op in autograd/functions.h (float64, CPU), including
// broadcasting, non-contiguous inputs, and keepdim on and off.
#include <doctest/doctest.h>

#include "helpers.h"

using namespace ddplab;
using autograd::gradcheck;
using test::leaf;
using test::leaf_in;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace {

void check(const char* what, const Fn& f, const std::vector<Tensor>& inputs) {
  INFO(what);
  auto r = gradcheck(f, inputs);
  CHECK_MESSAGE(r.ok, r.message);
}

// A leaf whose strides are not contiguous: the transpose of a fresh [cols, rows] tensor.
Tensor transposed_leaf(int64_t rows, int64_t cols, uint64_t seed) {
  Generator gen(seed);
  Tensor base = ops::randn({cols, rows}, kFloat64, &gen);
  Tensor t = ops::transpose(base, 0, 1);
  t.set_requires_grad(true);
  REQUIRE(!t.is_contiguous());
  return t;
}

}  // namespace

TEST_CASE("gradcheck: binary arithmetic with broadcasting") {
  Tensor a = leaf({3, 4}, 1), b = leaf({4}, 2), c = leaf({2, 1, 4}, 3), d = leaf({3, 1}, 4);
  Tensor pos = leaf_in({3, 4}, 5, 0.5, 2.0), pos_row = leaf_in({4}, 6, 0.5, 2.0);
  check("add", [](auto& x) { return add(x[0], x[1]); }, {a, b});
  check("add alpha", [](auto& x) { return add(x[0], x[1], -2.5); }, {a, b});
  check("add 3-D broadcast both ways", [](auto& x) { return x[0] + x[1]; }, {c, d});
  check("sub", [](auto& x) { return x[0] - x[1]; }, {c, d});
  check("mul", [](auto& x) { return x[0] * x[1]; }, {a, b});
  check("mul both broadcast", [](auto& x) { return x[0] * x[1]; }, {c, d});
  check("mul same tensor", [](auto& x) { return x[0] * x[0]; }, {a});
  check("div", [](auto& x) { return x[0] / x[1]; }, {a, pos_row});
  check("div broadcast numerator", [](auto& x) { return x[0] / x[1]; }, {b, pos});
  check("pow tensor", [](auto& x) { return pow(x[0], x[1]); }, {pos, a});
  check("pow tensor broadcast", [](auto& x) { return pow(x[0], x[1]); }, {pos, b});
  check("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {a, b});
  check("minimum", [](auto& x) { return minimum(x[0], x[1]); }, {c, d});
  Tensor cond = ops::gt(leaf({3, 4}, 7).detach(), 0.0);
  check("where", [cond](auto& x) { return where(cond, x[0], x[1]); }, {a, b});
}

TEST_CASE("gradcheck: scalar operands and operators") {
  Tensor a = leaf({2, 3}, 10), pos = leaf_in({2, 3}, 11, 0.5, 2.0);
  check("t + s", [](auto& x) { return x[0] + 1.5; }, {a});
  check("t - s", [](auto& x) { return x[0] - 1.5; }, {a});
  check("t * s", [](auto& x) { return x[0] * -3.0; }, {a});
  check("t / s", [](auto& x) { return x[0] / 4.0; }, {a});
  check("s + t", [](auto& x) { return 1.5 + x[0]; }, {a});
  check("s - t", [](auto& x) { return 1.5 - x[0]; }, {a});
  check("s * t", [](auto& x) { return 2.0 * x[0]; }, {a});
  check("s / t", [](auto& x) { return 2.0 / x[0]; }, {pos});
  check("-t", [](auto& x) { return -x[0]; }, {a});
  check("neg", [](auto& x) { return neg(x[0]); }, {a});
}

TEST_CASE("gradcheck: unary math") {
  Tensor a = leaf({3, 5}, 20), pos = leaf_in({3, 5}, 21, 0.3, 3.0);
  Tensor away_from_zero = leaf_in({3, 5}, 22, 0.2, 2.0);
  away_from_zero = ops::mul(away_from_zero, ops::sign(leaf({3, 5}, 23)));  // both signs
  away_from_zero.set_requires_grad(true);
  check("exp", [](auto& x) { return exp(x[0]); }, {a});
  check("log", [](auto& x) { return log(x[0]); }, {pos});
  check("sqrt", [](auto& x) { return sqrt(x[0]); }, {pos});
  check("rsqrt", [](auto& x) { return rsqrt(x[0]); }, {pos});
  check("pow 2.5", [](auto& x) { return pow(x[0], 2.5); }, {pos});
  check("pow 3", [](auto& x) { return pow(x[0], 3.0); }, {a});
  check("pow 0", [](auto& x) { return pow(x[0], 0.0); }, {a});
  check("square", [](auto& x) { return square(x[0]); }, {a});
  check("abs", [](auto& x) { return abs(x[0]); }, {away_from_zero});
  check("relu", [](auto& x) { return relu(x[0]); }, {away_from_zero});
  check("sigmoid", [](auto& x) { return sigmoid(x[0]); }, {a});
  check("tanh", [](auto& x) { return tanh(x[0]); }, {a});
  check("clamp both", [](auto& x) { return clamp(x[0], -0.5, 0.5); }, {a});
  check("clamp lo", [](auto& x) { return clamp(x[0], 0.1, std::nullopt); }, {a});
  check("clamp hi", [](auto& x) { return clamp(x[0], std::nullopt, 0.1); }, {a});
  check("unary on non-contiguous", [](auto& x) { return tanh(x[0]) * exp(x[0]); },
        {transposed_leaf(3, 4, 24)});
}

TEST_CASE("gradcheck: reductions, keepdim on and off") {
  Tensor a = leaf({2, 3, 4}, 30);
  for (bool keep : {false, true}) {
    INFO("keepdim=" << keep);
    check("sum all", [keep](auto& x) { return sum(x[0], {}, keep); }, {a});
    check("sum dim 1", [keep](auto& x) { return sum(x[0], {1}, keep); }, {a});
    check("sum dims -1, 0", [keep](auto& x) { return sum(x[0], {-1, 0}, keep); }, {a});
    check("mean all", [keep](auto& x) { return mean(x[0], {}, keep); }, {a});
    check("mean dims 0, 2", [keep](auto& x) { return mean(x[0], {0, 2}, keep); }, {a});
    check("var dim 1", [keep](auto& x) { return var(x[0], {1}, 1, keep); }, {a});
    check("var all, correction 0", [keep](auto& x) { return var(x[0], {}, 0, keep); }, {a});
    check("amax dim 2", [keep](auto& x) { return amax(x[0], {2}, keep); }, {a});
    check("amax dims 0, 1", [keep](auto& x) { return amax(x[0], {0, 1}, keep); }, {a});
    check("amin all", [keep](auto& x) { return amin(x[0], {}, keep); }, {a});
    check("max dim 1", [keep](auto& x) { return max(x[0], 1, keep).values; }, {a});
    check("min dim -1", [keep](auto& x) { return min(x[0], -1, keep).values; }, {a});
  }
  check("sum of non-contiguous", [](auto& x) { return sum(x[0], {0}); },
        {transposed_leaf(3, 5, 31)});
  check("var of non-contiguous", [](auto& x) { return var(x[0], {1}); },
        {transposed_leaf(3, 5, 32)});
}

TEST_CASE("gradcheck: matmul in every rank combination") {
  check("1-D . 1-D", [](auto& x) { return matmul(x[0], x[1]); }, {leaf({4}, 40), leaf({4}, 41)});
  check("2-D @ 1-D", [](auto& x) { return matmul(x[0], x[1]); }, {leaf({3, 4}, 42), leaf({4}, 43)});
  check("1-D @ 2-D", [](auto& x) { return matmul(x[0], x[1]); }, {leaf({4}, 44), leaf({4, 5}, 45)});
  check("2-D @ 2-D", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({3, 4}, 46), leaf({4, 5}, 47)});
  check("3-D @ 2-D (linear layer)", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({2, 3, 4}, 48), leaf({4, 5}, 49)});
  check("3-D @ 1-D", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({2, 3, 4}, 50), leaf({4}, 51)});
  check("1-D @ 3-D", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({4}, 52), leaf({2, 4, 3}, 53)});
  check("2-D @ 3-D", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({3, 4}, 54), leaf({2, 4, 5}, 55)});
  check("batched broadcast [2,1,3,4] @ [3,4,5]", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({2, 1, 3, 4}, 56), leaf({3, 4, 5}, 57)});
  check("transposed operands", [](auto& x) { return matmul(x[0], x[1]); },
        {transposed_leaf(3, 4, 58), transposed_leaf(4, 2, 59)});
  check("x @ w^T (view)", [](auto& x) { return matmul(x[0], transpose(x[1], 0, 1)); },
        {leaf({5, 4}, 60), leaf({3, 4}, 61)});
  check("mm", [](auto& x) { return mm(x[0], x[1]); }, {leaf({3, 4}, 62), leaf({4, 2}, 63)});
  check("bmm", [](auto& x) { return bmm(x[0], x[1]); }, {leaf({2, 3, 4}, 64), leaf({2, 4, 2}, 65)});
  check("only one input requires grad", [](auto& x) { return matmul(x[0], x[1]); },
        {leaf({3, 4}, 66), leaf({4, 2}, 67).detach()});
}

TEST_CASE("gradcheck: views and shape ops") {
  Tensor a = leaf({2, 3, 4}, 70);
  Tensor nc = transposed_leaf(4, 6, 71);
  check("reshape", [](auto& x) { return reshape(x[0], {6, 4}); }, {a});
  check("reshape non-contiguous (copies)", [](auto& x) { return reshape(x[0], {-1}); }, {nc});
  check("view", [](auto& x) { return view(x[0], {3, -1}); }, {a});
  check("flatten", [](auto& x) { return flatten(x[0], 1); }, {a});
  check("permute", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {a});
  check("transpose", [](auto& x) { return transpose(x[0], 0, -1); }, {a});
  check("unsqueeze", [](auto& x) { return unsqueeze(x[0], 1); }, {a});
  check("squeeze dim", [](auto& x) { return squeeze(x[0], 1); }, {leaf({3, 1, 2}, 72)});
  check("squeeze all", [](auto& x) { return squeeze(x[0]); }, {leaf({1, 3, 1}, 73)});
  check("expand", [](auto& x) { return expand(x[0], {2, 3, 4}); }, {leaf({3, 1}, 74)});
  check("narrow", [](auto& x) { return narrow(x[0], 2, 1, 2); }, {a});
  check("narrow non-contiguous", [](auto& x) { return narrow(x[0], 1, 2, 3); }, {nc});
  check("select", [](auto& x) { return select(x[0], 1, -1); }, {a});
  check("slice with step", [](auto& x) { return slice(x[0], 2, 0, 4, 2); }, {a});
  check("cat", [](auto& x) { return cat({x[0], x[1]}, 1); }, {a, leaf({2, 2, 4}, 75)});
  check("cat one constant",
        [](auto& x) {
          return cat({x[0], x[1]}, -1);
        },
        {a, leaf({2, 3, 1}, 76).detach()});
  check("stack", [](auto& x) { return stack({x[0], x[1]}, 1); }, {a, leaf({2, 3, 4}, 77)});
  check("contiguous", [](auto& x) { return contiguous(x[0]); }, {nc});
  check("clone", [](auto& x) { return clone(x[0]); }, {a});
  Tensor idx = ops::from_vector<int64_t>({2, 0, 2, 1}, {4}, kInt64);
  check("index_select (repeated indices)", [idx](auto& x) { return index_select(x[0], 1, idx); },
        {a});
  check("index_select dim 0", [idx](auto& x) { return index_select(x[0], 0, idx); },
        {leaf({3, 2}, 78)});
  Tensor gidx = ops::from_vector<int64_t>({0, 2, 2, 1, 1, 0}, {2, 3}, kInt64);
  check("gather", [gidx](auto& x) { return gather(x[0], 1, gidx); }, {leaf({2, 4}, 79)});
}

TEST_CASE("gradcheck: a small network mixing ops") {
  Tensor x = leaf({4, 3}, 90), w1 = leaf({3, 5}, 91), b1 = leaf({5}, 92), w2 = leaf({5, 2}, 93);
  check("mlp",
        [](auto& v) {
          Tensor h = tanh(matmul(v[0], v[1]) + v[2]);
          Tensor o = matmul(h, v[3]);
          return mean(square(o - amax(o, {1}, true)));
        },
        {x, w1, b1, w2});
}

TEST_CASE("gradcheck reports the failing element") {
  // A deliberately wrong backward: forward x*2 but treat it as identity in backward.
  Fn wrong = [](const std::vector<Tensor>& x) {
    Tensor y = ops::mul(x[0], 2.0);
    return autograd::record("WrongBackward", y, {x[0]}, {},
                            [](const Tensor& g, const autograd::Saved&, const autograd::Needs&) {
                              return autograd::Grads{g};
                            });
  };
  auto r = gradcheck(wrong, {leaf({3}, 95)});
  CHECK_FALSE(r.ok);
  CHECK(r.input == 0);
  CHECK(r.element == 0);
  CHECK(r.numeric == doctest::Approx(2 * r.analytic));
  CHECK(r.message.find("element 0") != std::string::npos);
}
