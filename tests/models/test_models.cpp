// Tests of the model zoo: torchvision parameter names, parameter counts, forward shapes, the
// factory, and a state_dict round trip through safetensors.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "models/models.h"
#include "models/resnet.h"
#include "models/simple.h"
#include "nn/functional.h"
#include "nn/module.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

namespace {

std::vector<std::string> param_names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

// The parameter names of one torchvision BasicBlock at `prefix` (e.g. "layer2.0.").
void basic_block(std::vector<std::string>& v, const std::string& prefix, bool downsample) {
  for (const char* s :
       {"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight", "bn2.bias"}) {
    v.push_back(prefix + s);
  }
  if (downsample) {
    for (const char* s : {"downsample.0.weight", "downsample.1.weight", "downsample.1.bias"}) {
      v.push_back(prefix + s);
    }
  }
}

}  // namespace

TEST_CASE("resnet20: torchvision names, 272,474 parameters") {
  auto m = models::cifar_resnet(20, 10);
  // Written out for the first stage and the first downsampling block, as torchvision lists them.
  std::vector<std::string> expect = {"conv1.weight",
                                     "bn1.weight",
                                     "bn1.bias",
                                     "layer1.0.conv1.weight",
                                     "layer1.0.bn1.weight",
                                     "layer1.0.bn1.bias",
                                     "layer1.0.conv2.weight",
                                     "layer1.0.bn2.weight",
                                     "layer1.0.bn2.bias",
                                     "layer1.1.conv1.weight",
                                     "layer1.1.bn1.weight",
                                     "layer1.1.bn1.bias",
                                     "layer1.1.conv2.weight",
                                     "layer1.1.bn2.weight",
                                     "layer1.1.bn2.bias",
                                     "layer1.2.conv1.weight",
                                     "layer1.2.bn1.weight",
                                     "layer1.2.bn1.bias",
                                     "layer1.2.conv2.weight",
                                     "layer1.2.bn2.weight",
                                     "layer1.2.bn2.bias",
                                     "layer2.0.conv1.weight",
                                     "layer2.0.bn1.weight",
                                     "layer2.0.bn1.bias",
                                     "layer2.0.conv2.weight",
                                     "layer2.0.bn2.weight",
                                     "layer2.0.bn2.bias",
                                     "layer2.0.downsample.0.weight",
                                     "layer2.0.downsample.1.weight",
                                     "layer2.0.downsample.1.bias"};
  basic_block(expect, "layer2.1.", false);
  basic_block(expect, "layer2.2.", false);
  basic_block(expect, "layer3.0.", true);
  basic_block(expect, "layer3.1.", false);
  basic_block(expect, "layer3.2.", false);
  expect.push_back("fc.weight");
  expect.push_back("fc.bias");
  CHECK(param_names(*m) == expect);
  CHECK(m->num_parameters() == 272474);
  // Buffers: running stats and the int64 batch counter of every BN.
  auto buffers = m->named_buffers();
  CHECK(buffers.size() == 3 * 21);
  CHECK(buffers[0].first == "bn1.running_mean");
  CHECK(buffers[2].first == "bn1.num_batches_tracked");
  CHECK(buffers[2].second.dtype() == kInt64);
  CHECK(m->state_dict().size() == expect.size() + buffers.size());
}

TEST_CASE("resnet18/34/50 (32x32 stem): torchvision names and counts") {
  auto m = models::resnet18(10);
  std::vector<std::string> expect = {"conv1.weight", "bn1.weight", "bn1.bias"};
  for (int s = 1; s <= 4; ++s) {
    for (int b = 0; b < 2; ++b) {
      basic_block(expect, "layer" + std::to_string(s) + "." + std::to_string(b) + ".",
                  s > 1 && b == 0);
    }
  }
  expect.push_back("fc.weight");
  expect.push_back("fc.bias");
  CHECK(param_names(*m) == expect);
  CHECK(m->num_parameters() == 11173962);
  CHECK(models::resnet34(10)->num_parameters() == 21282122);
  auto r50 = models::resnet50(10);
  auto names50 = param_names(*r50);
  // Bottleneck: conv3/bn3, and layer1.0 projects 64 -> 256.
  CHECK(names50[3] == "layer1.0.conv1.weight");
  CHECK(std::find(names50.begin(), names50.end(), "layer1.0.downsample.0.weight") != names50.end());
  CHECK(std::find(names50.begin(), names50.end(), "layer4.2.bn3.bias") != names50.end());
  CHECK(r50->num_parameters() == 23520842);
}

TEST_CASE("forward shapes and the factory") {
  autograd::NoGradGuard no_grad;
  Tensor x = ops::randn({2, 3, 32, 32});
  CHECK(models::create("resnet20", 10)->forward(x).shape() == Shape{2, 10});
  CHECK(models::create("resnet56", 100)->forward(x).shape() == Shape{2, 100});
  CHECK(models::create("resnet18", 10)->forward(x).shape() == Shape{2, 10});
  Tensor g = ops::randn({3, 1, 28, 28});
  CHECK(models::create("cnn", 10, 1)->forward(g).shape() == Shape{3, 10});
  CHECK(models::create("mlp", 10, 1)->forward(g).shape() == Shape{3, 10});
  CHECK(models::create("resnet20", 10, 1)->forward(g).shape() == Shape{3, 10});
  CHECK_THROWS_WITH_AS(models::create("resnet21"), doctest::Contains("available"), Error);
}

TEST_CASE("init: torchvision's (BN 1/0, He-normal fan_out convs); seeds reproduce") {
  manual_seed(5);
  auto a = models::cifar_resnet(20);
  manual_seed(5);
  auto b = models::cifar_resnet(20);
  auto sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK_MESSAGE(
        ops::allclose(ops::to(sa[i].second, kFloat64), ops::to(sb[i].second, kFloat64), 0, 0),
        sa[i].first);
  }
  CHECK(ops::sum_all(a->bn1->weight) == doctest::Approx(16));
  CHECK(ops::sum_all(ops::abs(a->bn1->bias)) == 0);
  // layer3 convs: fan_out = 64 * 9, std sqrt(2 / 576) ~ 0.0589.
  Tensor w = a->layers[2]->named_parameters()[0].second;
  CHECK(std::sqrt(ops::var(w).item<double>()) ==
        doctest::Approx(std::sqrt(2.0 / 576)).epsilon(0.05));
}

TEST_CASE("state_dict round trip through safetensors") {
  std::string path = "/tmp/ddplab_test_models_" + std::to_string(::getpid()) + ".safetensors";
  manual_seed(1);
  auto a = models::cifar_resnet(20);
  manual_seed(2);
  auto b = models::cifar_resnet(20);
  nn::save(*a, path);
  nn::load(*b, path);
  autograd::NoGradGuard no_grad;
  a->eval();
  b->eval();
  Tensor x = ops::randn({2, 3, 32, 32});
  CHECK(ops::allclose((*a)(x), (*b)(x), 0, 0));
  // A resnet32 checkpoint does not fit resnet20: one error naming the extra blocks.
  auto c = models::cifar_resnet(32);
  nn::save(*c, path);
  try {
    nn::load(*a, path);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("unexpected keys") != std::string::npos);
    CHECK(msg.find("layer1.3.conv1.weight") != std::string::npos);
    CHECK(msg.find(path) != std::string::npos);
  }
  std::remove(path.c_str());
}

namespace {

// A layer of type L that counts its forward calls (state not shared: only the calls matter).
template <class L>
struct Counting : L {
  using L::L;
  int calls = 0;
  Tensor forward(const Tensor& x) override {
    ++calls;
    return L::forward(x);
  }
};

// Replaces every Linear, Conv2d and BatchNorm2d below `m` with a counting twin (through
// replace_module, as convert_sync_batchnorm does) and adds a way to read its count.
void swap_in_counters(nn::Module& m, std::vector<std::function<int()>>& counters) {
  const auto children = m.named_children();
  for (const auto& [name, c] : children) {
    nn::ModulePtr twin;
    if (auto* l = dynamic_cast<nn::Linear*>(c.get())) {
      auto t = std::make_shared<Counting<nn::Linear>>(l->in_features, l->out_features);
      counters.emplace_back([t] { return t->calls; });
      twin = t;
    } else if (auto* conv = dynamic_cast<nn::Conv2d*>(c.get())) {
      auto t = std::make_shared<Counting<nn::Conv2d>>(conv->in_channels, conv->out_channels,
                                                      conv->kernel_size, conv->options);
      counters.emplace_back([t] { return t->calls; });
      twin = t;
    } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(c.get())) {
      auto t = std::make_shared<Counting<nn::BatchNorm2d>>(bn->num_features);
      counters.emplace_back([t] { return t->calls; });
      twin = t;
    }
    if (twin) {
      m.replace_module(name, twin);
    } else {
      swap_in_counters(*c, counters);
    }
  }
}

}  // namespace

TEST_CASE("every model's forward uses children swapped in by replace_module") {
  autograd::NoGradGuard no_grad;
  // One model of each class: BasicBlock and Bottleneck ResNets, SmallCNN, MLP.
  for (const std::string name : {"resnet20", "resnet50", "cnn", "mlp"}) {
    CAPTURE(name);
    const bool gray = name == "cnn" || name == "mlp";
    auto model = models::create(name, 10, gray ? 1 : 3);
    std::vector<std::function<int()>> counters;
    swap_in_counters(*model, counters);
    REQUIRE(!counters.empty());
    model->forward(ops::randn(gray ? Shape{2, 1, 28, 28} : Shape{2, 3, 8, 8}));
    for (const auto& calls : counters) CHECK(calls() == 1);
  }
}

namespace {

// The models' forward written with separate relu calls, as before batch_norm_relu and add_relu:
// the reference the fused forward must equal.
Tensor unfused_block(models::BasicBlock& b, const Tensor& x) {
  Tensor out = F::relu((*b.bn1)((*b.conv1)(x)));
  out = (*b.bn2)((*b.conv2)(out));
  Tensor identity = b.downsample ? (*b.downsample)(x) : x;
  return F::relu(out + identity);
}

Tensor unfused_forward(nn::Module& m, const Tensor& x) {
  if (auto* r = dynamic_cast<models::ResNet*>(&m)) {
    Tensor out = F::relu((*r->bn1)((*r->conv1)(x)));
    for (auto& layer : r->layers) {
      for (size_t i = 0; i < layer->size(); ++i) {
        auto* b = dynamic_cast<models::BasicBlock*>((*layer)[i].get());
        REQUIRE(b != nullptr);
        out = unfused_block(*b, out);
      }
    }
    return (*r->fc)(ddplab::flatten((*r->avgpool)(out), 1));
  }
  auto& c = dynamic_cast<models::SmallCNN&>(m);
  Tensor h = F::max_pool2d(F::relu((*c.bn1)((*c.conv1)(x))), {2, 2});
  h = F::max_pool2d(F::relu((*c.bn2)((*c.conv2)(h))), {2, 2});
  h = F::relu((*c.fc1)(ddplab::flatten(h, 1)));
  return (*c.fc2)(h);
}

}  // namespace

TEST_CASE("the fused forward (batch_norm_relu, add_relu) equals the unfused one bit for bit") {
  for (const std::string name : {"resnet20", "cnn"}) {
    CAPTURE(name);
    const bool gray = name == "cnn";
    Generator g(7);
    Tensor x = ops::randn(gray ? Shape{3, 1, 28, 28} : Shape{3, 3, 8, 8}, kFloat32, &g);
    // [0]: the model's forward, [1]: the reference; twin models from one seed.
    std::vector<Tensor> out(2);
    std::vector<std::vector<std::pair<std::string, Tensor>>> params(2), buffers(2);
    for (int k = 0; k < 2; ++k) {
      manual_seed(11);
      auto model = models::create(name, 10, gray ? 1 : 3);
      out[k] = k == 0 ? model->forward(x) : unfused_forward(*model, x);
      autograd::backward({ddplab::sum(ddplab::square(out[k]))});
      params[k] = model->named_parameters();
      buffers[k] = model->named_buffers();
    }
    CHECK(out[0].to_vector<float>() == out[1].to_vector<float>());
    for (size_t i = 0; i < params[0].size(); ++i) {
      CAPTURE(params[0][i].first);
      CHECK(params[0][i].second.grad().to_vector<float>() ==
            params[1][i].second.grad().to_vector<float>());
    }
    for (size_t i = 0; i < buffers[0].size(); ++i) {
      CAPTURE(buffers[0][i].first);
      CHECK(ops::allclose(ops::to(buffers[0][i].second, kFloat64),
                          ops::to(buffers[1][i].second, kFloat64), 0, 0));
    }
  }
}
