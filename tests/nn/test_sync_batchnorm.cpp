// Tests of SyncBatchNorm in one process: replace_module and bound members, convert/revert on a
// ResNet (names, values, the very same tensors), and sync_batch_norm without a group against
// batch_norm and finite differences. The multi-rank behaviour is tested in
// tests/distributed/test_sync_batchnorm.cpp.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "models/models.h"
#include "nn/batchnorm_kernels.h"
#include "nn/layers.h"
#include "nn/sync_batchnorm.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace ddplab;

namespace {

// One bound member, one unbound child.
struct Block : nn::Module {
  std::shared_ptr<nn::BatchNorm2d> bn;
  Block() {
    register_module("bn", bn, std::make_shared<nn::BatchNorm2d>(3));
    register_module("act", std::make_shared<nn::ReLU>());
  }
  Tensor forward(const Tensor& x) override { return (*child("act"))((*bn)(x)); }
};

bool is_sync(const nn::ModulePtr& m) {
  return dynamic_cast<nn::SyncBatchNorm*>(m.get()) != nullptr;
}

// Dotted names of the modules of exactly type BatchNorm2d / SyncBatchNorm.
std::vector<std::string> batchnorms(const nn::ModulePtr& model, bool sync) {
  std::vector<std::string> out;
  for (const auto& [name, m] : model->named_modules()) {
    if (sync ? m->type_name() == "SyncBatchNorm" : m->type_name() == "BatchNorm2d")
      out.push_back(name);
  }
  return out;
}

}  // namespace

TEST_CASE("replace_module: a bound member follows; a type it cannot hold changes nothing") {
  auto block = std::make_shared<Block>();
  auto old_bn = block->bn;
  auto sync = std::make_shared<nn::SyncBatchNorm>(3);
  block->replace_module("bn", sync);
  CHECK(block->bn == sync);
  CHECK(block->bn != old_bn);
  CHECK(block->child("bn") == sync);
  CHECK(block->named_children()[0].first == "bn");  // same position, same name

  // A Linear is not a BatchNorm2d: the member could not hold it, so the registry keeps `sync`.
  testing::check_error_mentions(
      [&] { block->replace_module("bn", std::make_shared<nn::Linear>(3, 3)); },
      {"replace_module('bn')", "cannot hold a Linear"});
  CHECK(block->bn == sync);
  CHECK(block->child("bn") == sync);
  // Unbound children can be replaced by anything; unknown names are errors.
  block->replace_module("act", std::make_shared<nn::Identity>());
  CHECK(block->child("act")->type_name() == "Identity");
  testing::check_error_mentions(
      [&] { block->replace_module("nope", std::make_shared<nn::Identity>()); },
      {"has no child 'nope'"});
}

TEST_CASE("convert/revert_sync_batchnorm on resnet20: same names, same tensors, members follow") {
  manual_seed(0);
  auto model = models::create("resnet20", 10);
  auto& net = dynamic_cast<models::ResNet&>(*model);
  const nn::StateDict before = model->state_dict();
  const std::vector<std::string> bn_names = batchnorms(model, /*sync=*/false);
  REQUIRE(bn_names.size() == 21);  // stem, 9 blocks x 2, 2 projection shortcuts
  model->eval();

  CHECK(nn::SyncBatchNorm::convert_sync_batchnorm(model) == model);
  CHECK(batchnorms(model, /*sync=*/true) == bn_names);
  CHECK(batchnorms(model, /*sync=*/false).empty());
  // The members the forward uses point at the new modules.
  CHECK(is_sync(net.bn1));
  for (const auto& layer : net.layers) {
    for (size_t b = 0; b < layer->size(); ++b) {
      auto& block = dynamic_cast<models::BasicBlock&>(*(*layer)[b]);
      CHECK(is_sync(block.bn1));
      CHECK(is_sync(block.bn2));
      if (block.downsample)
        CHECK(is_sync((*std::dynamic_pointer_cast<nn::Sequential>(block.downsample))[1]));
    }
  }
  CHECK(!net.bn1->is_training());  // the mode carries over
  // Same keys in the same order, and the same tensors (not copies): an optimizer or DDP built
  // before the conversion still holds the parameters the model trains.
  const nn::StateDict converted = model->state_dict();
  REQUIRE(converted.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(converted[i].first == before[i].first);
    CHECK(converted[i].second.raw_data() == before[i].second.raw_data());
  }
  // Without a group it computes exactly what BatchNorm2d does.
  model->train();
  Tensor x = ops::randn({4, 3, 8, 8});
  manual_seed(0);
  auto plain = models::create("resnet20", 10);
  CHECK(ops::allclose((*model)(x), (*plain)(x), 0, 0));

  CHECK(nn::revert_sync_batchnorm(model) == model);
  CHECK(batchnorms(model, /*sync=*/false) == bn_names);
  CHECK(!is_sync(net.bn1));
  const nn::StateDict reverted = model->state_dict();
  REQUIRE(reverted.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(reverted[i].first == before[i].first);
    CHECK(reverted[i].second.raw_data() == before[i].second.raw_data());
  }
  // A checkpoint of the converted model loads into a plain one and back.
  plain->load_state_dict(converted);
  nn::convert_sync_batchnorm(plain);
  plain->load_state_dict(before);

  // A lone BatchNorm2d is itself replaced: the result is the new module.
  auto lone = std::make_shared<nn::BatchNorm2d>(4);
  auto converted_lone = nn::convert_sync_batchnorm(lone);
  CHECK(is_sync(converted_lone));
  CHECK(converted_lone->parameters()[0].raw_data() == lone->weight.raw_data());
}

TEST_CASE("sync_batch_norm without a group: equals batch_norm; gradcheck in float64") {
  manual_seed(1);
  // Values far from zero: the mean/M2 form must not lose the small spread.
  Tensor x = ops::add(ops::randn({5, 3, 4, 2}), 1000.0);
  Tensor w = ops::rand({3}), b = ops::randn({3});
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor rm = ops::zeros({3}), rv = ops::ones({3});
  Tensor rm2 = ops::zeros({3}), rv2 = ops::ones({3});
  Tensor g = ops::randn({5, 3, 4, 2});

  Tensor y = nn::functional::sync_batch_norm(x, rm, rv, w, b, 0.1, 1e-5, nullptr);
  sum(mul(y, g)).backward();
  const Tensor dx = x.grad(), dw = w.grad(), db = b.grad();
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  Tensor y_ref = F::batch_norm(x, rm2, rv2, w, b, /*training=*/true, 0.1, 1e-5);
  sum(mul(y_ref, g)).backward();
  CHECK(ops::max_rel_error(y, y_ref) < 1e-5);
  CHECK(ops::max_rel_error(dx, x.grad()) < 1e-4);
  CHECK(ops::max_rel_error(dw, w.grad()) < 1e-4);
  CHECK(ops::max_rel_error(db, b.grad()) < 1e-5);
  CHECK(ops::max_rel_error(rm, rm2) < 1e-6);
  CHECK(ops::max_rel_error(rv, rv2) < 1e-5);

  for (bool affine : {true, false}) {
    CAPTURE(affine);
    std::vector<Tensor> in{ops::randn({3, 2, 3, 2}, kFloat64)};
    if (affine) {
      in.push_back(ops::rand({2}, kFloat64));
      in.push_back(ops::randn({2}, kFloat64));
    }
    for (Tensor& t : in) t.set_requires_grad(true);
    auto r = autograd::gradcheck(
        [affine](const std::vector<Tensor>& v) {
          return nn::functional::sync_batch_norm(v[0], Tensor(), Tensor(), affine ? v[1] : Tensor(),
                                                 affine ? v[2] : Tensor(), 0.1, 1e-5, nullptr);
        },
        in);
    CHECK_MESSAGE(r.ok, r.message);
  }
}

// nn/batchnorm_steps.cpp: its CPU kernels against its generic ops, which CUDA runs.
TEST_CASE("batch_norm steps: the CPU kernels and the generic-op versions (CUDA's) agree") {
  namespace F = nn::functional;
  manual_seed(2);
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dt));
    Tensor x = ops::add(ops::randn({4, 3, 5, 2}, dt), 100.0);
    Tensor dy = ops::randn({4, 3, 5, 2}, dt);
    Tensor w = ops::rand({3}, dt), b = ops::randn({3}, dt);
    const auto fast = F::batch_norm_moments(x), slow = F::batch_norm_moments(x, /*generic=*/true);
    CHECK(ops::max_rel_error(fast.mean, slow.mean) < 1e-12);
    CHECK(ops::max_rel_error(fast.m2, slow.m2) < 1e-10);
    Tensor invstd = ops::rsqrt(ops::add(ops::div(fast.m2, 40.0), 1e-5));
    for (const Tensor& weight : {w, Tensor()}) {
      CHECK(ops::max_rel_error(F::batch_norm_normalize(x, fast.mean, invstd, weight, b),
                               F::batch_norm_normalize(x, fast.mean, invstd, weight, b, true)) <
            1e-6);
    }
    Tensor sums = F::batch_norm_grad_sums(x, dy, fast.mean);
    CHECK(ops::max_rel_error(sums, F::batch_norm_grad_sums(x, dy, fast.mean, true)) < 1e-10);
    CHECK(ops::max_rel_error(
              F::batch_norm_input_grad(x, dy, fast.mean, invstd, w, sums, 40.0),
              F::batch_norm_input_grad(x, dy, fast.mean, invstd, w, sums, 40.0, true)) < 1e-6);
  }
}
