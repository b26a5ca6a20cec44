// Tests of nn::Module, the layers, nn::init and the safetensors reader/writer (including the
// corrupt files it must reject with a clear message).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "autograd/functions.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

namespace {

// A module with a nested submodule, a parameter-free child and a buffer.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Sequential> seq;
  Net() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 3));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(3));
    seq = register_module(
        "seq", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                   std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(3, 2, false)}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(2, 2));
  }
  std::string type_name() const override { return "Net"; }
};

std::vector<std::string> names(const nn::NamedTensors& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

std::string tmp_path(const std::string& name) {
  return std::string("/tmp/ddplab_test_module_") + std::to_string(::getpid()) + "_" + name;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A raw safetensors file from a header string and a data buffer.
std::string st_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string load_error(const std::string& path) {
  try {
    nn::load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Module: dotted names in PyTorch's order") {
  auto net = std::make_shared<Net>();
  CHECK(names(net->named_parameters()) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "seq.1.weight",
                                 "fc2.weight", "fc2.bias"});
  CHECK(names(net->named_buffers()) ==
        std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  // state_dict: each module's parameters then buffers, children in order.
  CHECK(names(net->state_dict()) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                 "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
                                 "seq.1.weight", "fc2.weight", "fc2.bias"});
  CHECK(net->bn->num_batches_tracked.dtype() == kInt64);
  CHECK(net->bn->num_batches_tracked.dim() == 0);
  CHECK(net->named_parameters(false).empty());
  CHECK(net->num_parameters() == 4 * 3 + 3 + 3 + 3 + 3 * 2 + 2 * 2 + 2);
  auto mods = net->named_modules();
  CHECK(mods.size() == 7);
  CHECK(mods[0].first == "");
  CHECK(mods[4].first == "seq.0");
  for (const auto& p : net->parameters()) CHECK(p.requires_grad());
  CHECK(net->repr().find("Linear(in_features=4, out_features=3, bias=True)") != std::string::npos);
}

TEST_CASE("Module: duplicate names and bad names are rejected") {
  nn::Linear l(2, 2);
  CHECK_THROWS_AS(l.register_parameter("weight", ops::zeros({2})), Error);
  CHECK_THROWS_AS(l.register_buffer("a.b", ops::zeros({2})), Error);
}

TEST_CASE("Module: train/eval propagate; zero_grad sets to none or zeroes") {
  auto net = std::make_shared<Net>();
  net->eval();
  CHECK(!net->is_training());
  CHECK(!net->seq->is_training());
  CHECK(!(*net->seq)[1]->is_training());
  net->train();
  CHECK(net->bn->is_training());

  Tensor x = ops::randn({5, 4});
  Tensor y = sum((*net->fc1)(x));
  y.backward();
  CHECK(net->fc1->weight.grad().defined());
  net->zero_grad(false);
  CHECK(net->fc1->weight.grad().defined());
  CHECK(ops::sum_all(ops::abs(net->fc1->weight.grad())) == 0.0);
  net->zero_grad();
  CHECK(!net->fc1->weight.grad().defined());
}

TEST_CASE("Module: state_dict round trip and strict loading lists every bad key") {
  manual_seed(1);
  auto a = std::make_shared<Net>();
  manual_seed(2);
  auto b = std::make_shared<Net>();
  CHECK(!ops::allclose(a->fc1->weight, b->fc1->weight));
  Tensor held = b->fc1->weight;  // a handle taken before loading must see the new values
  b->load_state_dict(a->state_dict());
  CHECK(ops::allclose(held, a->fc1->weight, 0, 0));
  CHECK(ops::allclose(b->fc2->bias, a->fc2->bias, 0, 0));

  auto sd = a->state_dict();
  std::map<std::string, Tensor> m(sd.begin(), sd.end());
  m.erase("fc1.bias");
  m.erase("bn.running_var");
  m["extra.weight"] = ops::zeros({1});
  m["fc2.weight"] = ops::zeros({3, 3});
  std::string msg;
  try {
    b->load_state_dict(m);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("missing keys (2)") != std::string::npos);
  CHECK(msg.find("fc1.bias") != std::string::npos);
  CHECK(msg.find("bn.running_var") != std::string::npos);
  CHECK(msg.find("unexpected keys (1): extra.weight") != std::string::npos);
  CHECK(msg.find("fc2.weight (checkpoint [3, 3], model [2, 2])") != std::string::npos);

  // Non-strict: missing/unexpected are fine, shape mismatches still are not.
  m["fc2.weight"] = a->fc2->weight;
  CHECK_NOTHROW(b->load_state_dict(m, false));
  // DDP checkpoints: the hint about the "module." prefix.
  std::map<std::string, Tensor> prefixed;
  for (const auto& [n, t] : sd) prefixed["module." + n] = t;
  try {
    b->load_state_dict(prefixed);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("'module.'") != std::string::npos);
  }
}

TEST_CASE("Module: save/load through safetensors") {
  manual_seed(3);
  auto a = std::make_shared<Net>();
  ops::fill_(a->bn->running_mean, 0.25);
  ops::fill_(a->bn->num_batches_tracked, 7);
  std::string path = tmp_path("net.safetensors");
  nn::save(*a, path);
  manual_seed(4);
  auto b = std::make_shared<Net>();
  nn::load(*b, path);
  for (const auto& [n, t] : a->state_dict()) {
    Tensor u;
    for (const auto& [n2, t2] : b->state_dict()) {
      if (n2 == n) u = t2;
    }
    CHECK_MESSAGE(ops::allclose(ops::to(t, kFloat64), ops::to(u, kFloat64), 0, 0), n);
  }
  CHECK(b->bn->num_batches_tracked.item<int64_t>() == 7);
  std::remove(path.c_str());
}

TEST_CASE("Layers: shapes, PyTorch default init bounds, BatchNorm counters") {
  manual_seed(0);
  nn::Linear l(100, 50);
  double bound = 1.0 / std::sqrt(100.0);
  CHECK(ops::amax(ops::abs(l.weight)).item<double>() <= bound);
  CHECK(ops::amax(ops::abs(l.weight)).item<double>() > 0.9 * bound);
  CHECK(ops::amax(ops::abs(l.bias)).item<double>() <= bound);
  CHECK(l(ops::randn({7, 100})).shape() == Shape{7, 50});

  nn::Conv2d c(8, 16, 3, 2, 1, false);
  CHECK(!c.bias.defined());
  CHECK(c.named_parameters().size() == 1);
  CHECK(ops::amax(ops::abs(c.weight)).item<double>() <= 1.0 / std::sqrt(72.0));
  CHECK(c(ops::randn({2, 8, 9, 9})).shape() == Shape{2, 16, 5, 5});

  nn::BatchNorm2d bn(16);
  Tensor x = ops::randn({4, 16, 3, 3});
  bn(x);
  bn(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);
  bn.eval();
  bn(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);

  CHECK(nn::MaxPool2d(2)(ops::randn({1, 2, 8, 8})).shape() == Shape{1, 2, 4, 4});
  CHECK(nn::AvgPool2d(2)(ops::randn({1, 2, 8, 8})).shape() == Shape{1, 2, 4, 4});
  CHECK(nn::AdaptiveAvgPool2d(1)(ops::randn({3, 2, 5, 5})).shape() == Shape{3, 2, 1, 1});
  CHECK(nn::Flatten()(ops::randn({3, 2, 5, 5})).shape() == Shape{3, 50});
  Tensor ones = ops::ones({1000});
  nn::Dropout d(0.5);
  d.eval();
  CHECK(ops::allclose(d(ones), ones));
}

TEST_CASE("init: kaiming and xavier statistics, seeded reproducibility") {
  Tensor w = ops::empty({256, 128, 3, 3});
  Generator g1(42), g2(42);
  nn::init::kaiming_normal_(w, 0, nn::init::FanMode::FanOut, "relu", &g1);
  double expect_std = std::sqrt(2.0 / (256 * 9));
  double std = std::sqrt(ops::var(w).item<double>());
  CHECK(std == doctest::Approx(expect_std).epsilon(0.02));
  Tensor w2 = ops::empty({256, 128, 3, 3});
  nn::init::kaiming_normal_(w2, 0, nn::init::FanMode::FanOut, "relu", &g2);
  CHECK(ops::allclose(w, w2, 0, 0));
  nn::init::kaiming_uniform_(w, 0, nn::init::FanMode::FanIn, "relu");
  double bound = std::sqrt(2.0) * std::sqrt(3.0 / (128 * 9));
  CHECK(ops::amax(ops::abs(w)).item<double>() <= bound);
  CHECK(nn::init::calculate_gain("tanh") == doctest::Approx(5.0 / 3));
  nn::init::constant_(w, 3);
  CHECK(ops::sum_all(w) == doctest::Approx(3.0 * w.numel()));
}

TEST_CASE("safetensors: every dtype round trips, header is aligned") {
  std::string path = tmp_path("all.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool}) {
    Tensor a = ops::to(ops::arange(0, 6), t);
    if (t == kBool) a = ops::gt(ops::arange(0, 6), 2.0);
    ts.emplace_back(std::string("t_") + dtype_name(t), ops::reshape(a, {2, 3}));
  }
  ts.emplace_back("scalar", ops::scalar_tensor(5));
  ts.emplace_back("empty", ops::zeros({0, 4}));
  // A non-contiguous view is written as its logical contents.
  ts.emplace_back("transposed", ops::transpose(ops::reshape(ops::arange(0, 6), {2, 3}), 0, 1));
  nn::save_safetensors(path, ts, {{"k", "v"}});
  auto back = nn::load_safetensors(path);
  REQUIRE(back.size() == ts.size());
  for (const auto& [n, t] : ts) {
    const Tensor& u = back.at(n);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.shape() == t.shape());
    CHECK_MESSAGE(ops::allclose(ops::to(t, kFloat64), ops::to(u, kFloat64), 0, 0), n);
  }
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  CHECK(len[0] % 8 == 0);
  std::remove(path.c_str());
  // No temporary file is left behind.
  CHECK(!std::ifstream(path + ".tmp").good());
}

TEST_CASE("safetensors: corrupt files are rejected with what is wrong") {
  std::string path = tmp_path("bad.safetensors");
  std::string good_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data8(8, '\0');
  write_bytes(path, st_file(good_header, data8));
  CHECK(nn::load_safetensors(path).at("a").shape() == Shape{2});

  struct Case {
    std::string bytes, expect;
  };
  std::vector<Case> cases = {
      {"abc", "shorter than the 8-byte header length"},
      {st_file(good_header, data8).substr(0, 20), "exceeds"},
      {st_file("{not json", data8), "not valid JSON"},
      {st_file("[1,2]", ""), "not a JSON object"},
      {st_file(R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", data8),
       "unknown dtype 'F99'"},
      {st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8), "need 12"},
      {st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8 + "xx"),
       "trailing"},
      {st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8), "run past"},
      {st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               data8),
       "overlaps"},
      {st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8), "gap"},
      {st_file(R"({"a":{"dtype":"F32","shape":[2]}})", data8), "data_offsets"},
      {st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8), "negative"},
  };
  for (const auto& c : cases) {
    write_bytes(path, c.bytes);
    std::string msg = load_error(path);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos,
                  "expected '" << c.expect << "' in '" << msg << "'");
    CHECK_MESSAGE(msg.find(path) != std::string::npos, msg);
  }
  std::remove(path.c_str());
  CHECK(load_error("/nonexistent/x.safetensors").find("cannot open") != std::string::npos);
}
