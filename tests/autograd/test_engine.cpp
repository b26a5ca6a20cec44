// Tests of the backward engine and of Tensor's autograd methods: accumulation, retain_graph,
// no_grad, detach, hooks and their order, queue_callback, reachable_leaves, diamonds, errors.
// Each runs on every device present.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>

#include "autograd/accumulate_grad.h"
#include "helpers.h"

using namespace ddplab;
using test::test_devices;
using testing::error_of;

namespace {

Tensor param(const Shape& shape, uint64_t seed, Device dev) {
  Generator gen(seed);
  Tensor t = ops::randn(shape, TensorOptions(kFloat32, dev), &gen);
  t.set_requires_grad(true);
  return t;
}

bool close(const Tensor& a, const Tensor& b) {
  return ops::allclose(ops::to(a, kCPU), ops::to(b, kCPU), 1e-5, 1e-6);
}

}  // namespace

TEST_CASE("gradients accumulate across backward calls") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({2, 3}, 1, dev);
    sum(x * 2.0).backward();
    sum(x * 2.0).backward();
    CHECK(close(x.grad(), ops::full_like(x, 4.0)));
    // With retain_graph the same graph runs twice and accumulates twice.
    Tensor y = sum(exp(x));
    x.set_grad(Tensor());
    y.backward(Tensor(), /*retain_graph=*/true);
    y.backward();
    CHECK(close(x.grad(), ops::mul(ops::exp(x), 2.0)));
  }
}

TEST_CASE("AccumulateGrad stores a fresh tensor first, then adds in place") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({3}, 2, dev);
    Tensor g = ops::ones({3}, TensorOptions(kFloat32, dev));
    x.backward(g);  // the root gradient goes straight into the leaf's accumulator
    REQUIRE(x.grad().defined());
    CHECK(x.grad().raw_data() != g.raw_data());
    CHECK(x.grad().is_contiguous());
    void* first = x.grad().raw_data();
    sum(x).backward();  // an expanded (stride-0) gradient view must still be copied/added
    CHECK(x.grad().raw_data() == first);
    CHECK(close(x.grad(), ops::full_like(x, 2.0)));
    CHECK(close(g, ops::ones_like(g)));  // the caller's gradient was not modified
  }
}

TEST_CASE("a freed graph cannot be backwarded twice; retain_graph keeps it") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({4}, 3, dev);
    Tensor y = sum(exp(x));
    y.backward();
    std::string msg = error_of([&] { y.backward(); });
    CHECK(msg.find("second time") != std::string::npos);
    CHECK(msg.find("retain_graph") != std::string::npos);
    CHECK(msg.find("ExpBackward") != std::string::npos);

    Tensor z = sum(exp(x));
    z.backward(Tensor(), true);
    CHECK_NOTHROW(z.backward());
  }
}

TEST_CASE("no_grad records nothing; detach leaves the graph") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({2, 2}, 4, dev);
    {
      autograd::NoGradGuard guard;
      Tensor y = x * 3.0;
      CHECK_FALSE(y.requires_grad());
      CHECK(y.grad_fn() == nullptr);
    }
    CHECK(autograd::grad_enabled());
    Tensor d = x.detach();
    CHECK_FALSE(d.requires_grad());
    CHECK(d.is_leaf());
    CHECK(d.raw_data() == x.raw_data());  // same storage
    Tensor y = x * 2.0 + detach(x) * 5.0;
    sum(y).backward();
    CHECK(close(x.grad(), ops::full_like(x, 2.0)));
  }
}

TEST_CASE("requires_grad rules and errors that name shapes") {
  Tensor c = ops::ones({2, 3});
  std::string msg = error_of([&] { sum(c).backward(); });
  CHECK(msg.find("does not require grad") != std::string::npos);

  Tensor x = param({2, 3}, 5, kCPU);
  Tensor y = x * 2.0;
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  msg = error_of([&] { y.backward(); });
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("scalar") != std::string::npos);
  msg = error_of([&] { y.backward(ops::ones({3, 2})); });
  CHECK(msg.find("[3, 2]") != std::string::npos);
  CHECK_NOTHROW(y.backward(ops::ones({2, 3})));
  CHECK_THROWS_AS(y.set_requires_grad(false), Error);
  CHECK_THROWS_AS(ops::zeros({2}, kInt64).set_requires_grad(true), Error);
}

TEST_CASE("grad hooks can scale; non-leaf hooks see the summed gradient") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({3}, 6, dev);
    autograd::register_hook(x, [](const Tensor& g) { return ops::mul(g, 3.0); });
    Tensor a = exp(x);
    int calls = 0;
    Tensor seen;
    autograd::register_hook(a, [&](const Tensor& g) {
      ++calls;
      seen = g;
      return Tensor();  // observe only
    });
    // Diamond: a is used twice; its node must run once with the two gradients summed.
    Tensor y = sum(a * 2.0 + a * 3.0);
    y.backward();
    CHECK(calls == 1);
    CHECK(close(seen, ops::full_like(x, 5.0)));
    CHECK(close(x.grad(), ops::mul(ops::exp(x), 15.0)));
  }
}

TEST_CASE("post-accumulate hooks fire once per leaf per backward, last layer first") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = ops::randn({2, 4}, TensorOptions(kFloat32, dev));  // data: no grad
    Tensor w1 = param({4, 4}, 7, dev), w2 = param({4, 4}, 8, dev), w3 = param({4, 3}, 9, dev);
    std::vector<std::string> order;
    bool grad_was_set = true;
    auto watch = [&](const Tensor& w, const std::string& name) {
      autograd::register_post_accumulate_grad_hook(w, [&, name](const Tensor& p) {
        grad_was_set = grad_was_set && p.grad().defined();
        order.push_back(name);
      });
    };
    watch(w1, "w1");
    watch(w2, "w2");
    watch(w3, "w3");
    Tensor loss = sum(matmul(matmul(matmul(x, w1), w2), w3));
    loss.backward();
    CHECK(grad_was_set);
    CHECK(order == std::vector<std::string>{"w3", "w2", "w1"});

    // A parameter used twice still fires once, with the summed gradient already in .grad.
    order.clear();
    sum(matmul(matmul(x, w1), w1)).backward();
    CHECK(order == std::vector<std::string>{"w1"});
  }
}

TEST_CASE("hooks return a RemovableHandle; remove() unregisters exactly that hook") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = ops::randn({2, 4}, TensorOptions(kFloat32, dev));
    Tensor w = param({4, 3}, 15, dev);
    int post_a = 0, post_b = 0, leaf_hook = 0, nonleaf_hook = 0;
    autograd::RemovableHandle a =
        autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++post_a; });
    autograd::RemovableHandle b =
        autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++post_b; });
    autograd::RemovableHandle scale = autograd::register_hook(w, [&](const Tensor& g) {
      ++leaf_hook;
      return ops::mul(g, 2.0);
    });
    CHECK(autograd::autograd_meta(w).post_accumulate_hooks.size() == 2);

    sum(matmul(x, w)).backward();
    CHECK(post_a == 1);
    CHECK(post_b == 1);
    CHECK(leaf_hook == 1);
    const Tensor doubled = ops::clone(w.grad());

    // Removing one of two hooks leaves the other; removing twice is harmless.
    a.remove();
    a.remove();
    scale.remove();
    CHECK(autograd::autograd_meta(w).post_accumulate_hooks.size() == 1);
    CHECK(autograd::autograd_meta(w).hooks.empty());
    w.set_grad(Tensor());
    Tensor h = matmul(x, w);
    autograd::RemovableHandle on_h =
        autograd::register_hook(h, [&](const Tensor&) { return ++nonleaf_hook, Tensor(); });
    on_h.remove();
    sum(h).backward();
    CHECK(post_a == 1);
    CHECK(post_b == 2);
    CHECK(leaf_hook == 1);
    CHECK(nonleaf_hook == 0);
    CHECK(close(ops::mul(w.grad(), 2.0), doubled));  // no longer scaled by the removed hook

    // A handle outliving its graph node: remove() is a no-op, not a dangling access.
    autograd::RemovableHandle orphan;
    {
      Tensor tmp = matmul(x, w);
      orphan = autograd::register_hook(tmp, [](const Tensor&) { return Tensor(); });
    }
    orphan.remove();
    autograd::RemovableHandle().remove();  // an empty handle, too
  }
}

TEST_CASE("queue_callback runs after every node") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = ops::randn({2, 4}, TensorOptions(kFloat32, dev));
    Tensor w1 = param({4, 4}, 10, dev), w2 = param({4, 4}, 11, dev);
    std::vector<std::string> events;
    autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor&) {
      events.push_back("w2");
      autograd::queue_callback([&] { events.push_back("callback"); });
    });
    autograd::register_post_accumulate_grad_hook(w1,
                                                 [&](const Tensor&) { events.push_back("w1"); });
    sum(matmul(matmul(x, w1), w2)).backward();
    CHECK(events == std::vector<std::string>{"w2", "w1", "callback"});
  }
  CHECK_THROWS_AS(autograd::queue_callback([] {}), Error);
}

TEST_CASE("reachable_leaves excludes unused parameters") {
  Tensor x = ops::randn({2, 3});
  Tensor w_used = param({3, 3}, 12, kCPU), b = param({3}, 13, kCPU);
  Tensor w_unused = param({3, 3}, 14, kCPU);
  Tensor out = sum(relu(matmul(x, w_used) + b));
  auto leaves = autograd::reachable_leaves({out});
  CHECK(leaves.count(w_used.impl_ptr().get()) == 1);
  CHECK(leaves.count(b.impl_ptr().get()) == 1);
  CHECK(leaves.count(w_unused.impl_ptr().get()) == 0);
  CHECK(leaves.count(x.impl_ptr().get()) == 0);
  CHECK(leaves.size() == 2);
}

TEST_CASE("autograd::grad leaves .grad alone and handles unused inputs") {
  Tensor x = param({3}, 15, kCPU), y = param({3}, 16, kCPU), unused = param({3}, 17, kCPU);
  Tensor h = x * y;
  Tensor out = sum(h * h);
  auto g = autograd::grad({out}, {x, h, unused});
  CHECK_FALSE(x.grad().defined());
  CHECK(close(g[0], ops::mul(ops::mul(ops::mul(x, y), y), 2.0)));
  CHECK(close(g[1], ops::mul(ops::mul(x, y), 2.0)));
  CHECK_FALSE(g[2].defined());
}

TEST_CASE("the diamond runs each node once and sums") {
  // x -> a = tanh(x) -> (b = a * 2, c = exp(a)) -> y = sum(b * c)
  Tensor x = param({5}, 18, kCPU);
  Tensor a = tanh(x);
  int runs = 0;
  autograd::register_hook(a, [&](const Tensor&) {
    ++runs;
    return Tensor();
  });
  Tensor y = sum((a * 2.0) * exp(a));
  y.backward();
  CHECK(runs == 1);
  // dy/da = 2 e^a + 2 a e^a, times (1 - tanh^2)
  Tensor av = ops::tanh(x), ea = ops::exp(av);
  Tensor expect = ops::mul(ops::add(ops::mul(ea, 2.0), ops::mul(ops::mul(av, ea), 2.0)),
                           ops::rsub(ops::square(av), 1.0));
  CHECK(close(x.grad(), expect));
}

TEST_CASE("a gradient sums in place only where no other node still holds it") {
  // s = p + q hands one gradient tensor g (dense: from s * 1) to both p's node and q's node. r = q * 5, created
  // before s, runs before p's node and adds 5 into q's sum, which holds g so far: that sum must
  // not write into g, which p's node has yet to read. The first sum starts from an expanded view
  // (sum's gradient), which may never be written in place either. A sum whose first gradient
  // no one else holds is written in place (the residual networks' case).
  for (Device dev : test_devices()) {
    CAPTURE(dev);
    Tensor x = param({4}, 19, dev);
    Tensor p = x * 3.0;
    Tensor q = x * 4.0;
    Tensor r = q * 5.0;
    Tensor s = p + q;
    (sum(s * 1.0) + sum(r)).backward();
    // d/dx = 3 (through p) + 4 * (1 + 5) (through q)
    CHECK(close(x.grad(), ops::full({4}, 27.0, TensorOptions(kFloat32, dev))));

    // t's sum starts from a gradient that no one else holds but that is an expanded view of one
    // element: v = t * 2, whose backward (valid for the uniform gradient of a sum) returns
    // 2 * grad[0] repeated. u's gradient arrives after it.
    Tensor y = param({4}, 20, dev);
    Tensor t = y * 4.0;
    Tensor u = t * 5.0;
    Tensor v =
        autograd::record("TimesTwoBackward", ops::mul(t, 2.0), {t}, {},
                         [](const Tensor& grad, const autograd::Saved&, const autograd::Needs&) {
                           Tensor first = ops::mul(ops::narrow(grad, 0, 0, 1), 2.0);
                           return autograd::Grads{ops::expand(first, grad.shape())};
                         });
    (sum(u) + sum(v)).backward();
    CHECK(close(y.grad(), ops::full({4}, 28.0, TensorOptions(kFloat32, dev))));
  }
}

TEST_CASE("differentiable ops give the right gradient on every device") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = param({2, 3}, 19, dev), b = param({3}, 20, dev);
    Tensor y = sum(sigmoid(x * b) + mean(square(x), {1}, true));
    y.backward();
    Tensor xc = ops::to(x.detach(), kCPU), bc = ops::to(b.detach(), kCPU);
    Tensor s = ops::sigmoid(ops::mul(xc, bc));
    Tensor ds = ops::mul(s, ops::rsub(s, 1.0));
    // The [2, 1] mean is broadcast over 3 columns: d/dx = 3 * (2x / 3) = 2x.
    Tensor gx = ops::add(ops::mul(ds, bc), ops::mul(xc, 2.0));
    Tensor gb = ops::sum(ops::mul(ds, xc), {0});
    CHECK(close(x.grad(), gx));
    CHECK(close(b.grad(), gb));
    // to(dtype) sends the gradient back in the input's dtype.
    Tensor z = param({4}, 21, dev);
    sum(to(z, kFloat64)).backward();
    CHECK(z.grad().dtype() == kFloat32);
    CHECK(close(z.grad(), ops::ones_like(z)));
  }
}

TEST_CASE("the graph is freed with its outputs (saved outputs make no cycle)") {
  Tensor x = param({3}, 22, kCPU);
  std::weak_ptr<autograd::Node> exp_node, acc_node;
  {
    Tensor y = exp(x);  // ExpBackward saves its own output y
    exp_node = y.grad_fn();
    acc_node = y.grad_fn()->next_edges[0].fn;
    CHECK(acc_node.lock()->name() == "AccumulateGrad");
  }
  CHECK(exp_node.expired());
  CHECK(acc_node.expired());
}

TEST_CASE("grad mode is per thread") {
  autograd::NoGradGuard guard;
  bool other_thread_enabled = false;
  std::thread t([&] { other_thread_enabled = autograd::grad_enabled(); });
  t.join();
  CHECK(other_thread_enabled);
  CHECK_FALSE(autograd::grad_enabled());
}
