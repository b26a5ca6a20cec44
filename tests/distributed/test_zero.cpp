// ZeroRedundancyOptimizer (ZeRO-1) on 2 and 3 forked Gloo ranks, against plain DDP with the same
// optimizer and LR schedule: the same parameters step by step, about 1/W of the optimizer state
// per rank, and a consolidated state dict in the plain optimizer's layout that round-trips
// through a training checkpoint (into a fresh ZeRO on 2 ranks and into a plain optimizer in one
// process). The partition rule is checked by hand and on resnet20/resnet18.
//
// Each rank trains two copies of one model side by side on the same batches: one under DDP with
// a plain optimizer, one under DDP with ZeRO. DDP gives both the same averaged gradients, and
// ZeRO's owner runs the same arithmetic as the plain optimizer, so the copies must agree.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "fork_ranks.h"
#include "models/models.h"
#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;
using namespace ddplab::testing;
using distributed::ZeroRedundancyOptimizer;

namespace {

enum class Kind { SGD, Adam };
const char* kind_name(Kind k) {
  return k == Kind::SGD ? "SGD" : "Adam";
}

distributed::OptimizerFactory factory(Kind kind) {
  if (kind == Kind::SGD) {
    optim::SGDOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
    return distributed::optimizer_factory<optim::SGD>(o);
  }
  optim::AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 1e-3;
  return distributed::optimizer_factory<optim::Adam>(o);
}

// Six 24x24 layers (600 elements each with the bias): shards of exactly 1/2 and 1/3 of the
// elements on 2 and 3 ranks, so the state per rank can be checked against 1/W.
std::shared_ptr<nn::Sequential> make_net() {
  manual_seed(7);
  auto net = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 6; ++i) {
    net->push_back(std::make_shared<nn::Linear>(24, 24));
    if (i < 5) net->push_back(std::make_shared<nn::ReLU>());
  }
  return net;
}

// This rank's batch of step `step` (different on each rank, the same for both copies).
std::pair<Tensor, Tensor> batch(int rank, int step) {
  manual_seed(1000 * step + rank);
  Tensor x = ops::randn({4, 24});
  Tensor y = ops::from_vector<int64_t>({(rank + step) % 24, 3, 17, step % 24}, {4}, kInt64);
  return {x, y};
}

void forward_backward(nn::Module& model, int rank, int step) {
  auto [x, y] = batch(rank, step);
  F::cross_entropy(model.forward(x), y).backward();
}

// max |a - b| / max(1, max |b|) over every parameter.
double max_rel_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, ops::max_abs_diff(b[i], ops::zeros_like(b[i])));
    worst = std::max(worst, ops::max_abs_diff(a[i], b[i]) / scale);
  }
  return worst;
}

size_t state_bytes(const optim::OptimizerState& st) {
  size_t bytes = 0;
  for (const auto& [name, t] : st.tensors) bytes += t.nbytes();
  return bytes;
}

int64_t reduce_int(distributed::ProcessGroup& pg, int64_t v, distributed::ReduceOp op) {
  Tensor t = ops::full({1}, static_cast<double>(v), kInt64);
  pg.all_reduce(t, op)->wait();
  return t.to_vector<int64_t>()[0];
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A run takes about a second; a broken one is stopped well within the meson timeout.
constexpr auto kDeadline = std::chrono::seconds(20);

// One rank of "ZeRO-1 equals plain DDP": two copies of the model trained side by side.
void equals_plain_ddp_rank(Kind kind, int rank, int world, const std::shared_ptr<TCPStore>& store) {
  auto pg = make_group(rank, world, store);
  std::shared_ptr<distributed::ProcessGroup> group(pg.get(), [](distributed::ProcessGroup*) {});
  auto plain_net = make_net();
  auto zero_net = make_net();
  distributed::DDP plain_ddp(plain_net, group);
  distributed::DDP zero_ddp(zero_net, group);
  auto plain = factory(kind)({optim::ParamGroup(plain_ddp.parameters())});
  ZeroRedundancyOptimizer zero(zero_ddp.parameters(), factory(kind), group);

  // A schedule halves the lr every 2 steps: ZeRO must pass its param_groups' lr to the shards.
  optim::StepLR plain_schedule(*plain, 2, 0.5), zero_schedule(zero, 2, 0.5);

  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    forward_backward(plain_ddp, rank, step);
    plain->step();
    plain->zero_grad();
    plain_schedule.step();
    forward_backward(zero_ddp, rank, step);
    zero.step();
    zero.zero_grad();
    zero_schedule.step();
    const double d = max_rel_diff(zero_ddp.parameters(), plain_ddp.parameters());
    EXPECT(d <= 1e-6, kind_name(kind) << " step " << step << ": ZeRO differs from plain DDP by "
                                      << d << " (relative)");
    worst = std::max(worst, d);
  }
  // Plain DDP holds the whole state on every rank; ZeRO about 1/W of it, and all of it once.
  const auto plain_bytes = static_cast<int64_t>(state_bytes(plain->state_dict()));
  const auto mine = static_cast<int64_t>(zero.local_state_bytes());
  const int64_t sum = reduce_int(*pg, mine, distributed::ReduceOp::Sum);
  const int64_t most = reduce_int(*pg, mine, distributed::ReduceOp::Max);
  std::printf(
      "RESULT %s, %d ranks, rank %d: optimizer state %lld bytes (plain DDP %lld, "
      "ratio %.3f); max relative difference to plain DDP over 5 steps %.2e\n",
      kind_name(kind), world, rank, static_cast<long long>(mine),
      static_cast<long long>(plain_bytes),
      static_cast<double>(mine) / static_cast<double>(plain_bytes), worst);
  EXPECT(sum == plain_bytes, "the shards hold " << sum << " bytes, plain " << plain_bytes);
  EXPECT(most <= plain_bytes / world + plain_bytes / world / 10,
         "the largest shard holds " << most << " bytes, 1/W of plain is " << plain_bytes / world);

  // The consolidated state is the plain optimizer's state, layout and values. Only rank `to`
  // compares; all ranks learn the verdict, so a failure stops them all at once.
  const int to = world - 1;
  zero.consolidate_state_dict(to);
  std::string mismatch;
  if (rank == to) {
    const optim::OptimizerState a = zero.state_dict(), b = plain->state_dict();
    if (a.meta != b.meta) mismatch = "meta " + a.meta.dump() + " vs plain " + b.meta.dump();
    if (a.tensors.size() != b.tensors.size()) mismatch += "; a different number of tensors";
    for (size_t i = 0; mismatch.empty() && i < a.tensors.size(); ++i) {
      if (a.tensors[i].first != b.tensors[i].first ||
          ops::max_abs_diff(a.tensors[i].second, b.tensors[i].second) > 1e-6)
        mismatch = a.tensors[i].first + " differs from plain " + b.tensors[i].first;
    }
  } else {
    const std::string e = error_of([&] { zero.state_dict(); });
    if (e.find("consolidated on rank " + std::to_string(to)) == std::string::npos)
      mismatch = "state_dict() on a non-target rank said: " + e;
  }
  const bool any = reduce_int(*pg, mismatch.empty() ? 0 : 1, distributed::ReduceOp::Max) != 0;
  finish(pg, *store);
  EXPECT(mismatch.empty(), mismatch);
  EXPECT(!any, "the consolidated state on rank " << to << " differs from plain DDP's");
}

void zero_equals_plain_ddp(int world, Kind kind) {
  run_ranks(
      world,
      [kind](int rank, int w, const auto& store) { equals_plain_ddp_rank(kind, rank, w, store); },
      kDeadline);
}

// One rank of the round trip: train 3 steps, checkpoint (model + consolidated optimizer), then
// one more step, both by the trained ZeRO and by a fresh one restored from the checkpoint. Rank 0
// records that step's averaged gradients and resulting parameters in `expected`.
void round_trip_rank(Kind kind, const std::string& ckpt, const std::string& expected, int rank,
                     int world, const std::shared_ptr<TCPStore>& store) {
  auto pg = make_group(rank, world, store);
  std::shared_ptr<distributed::ProcessGroup> group(pg.get(), [](distributed::ProcessGroup*) {});
  auto net = make_net();
  distributed::DDP ddp(net, group);
  ZeroRedundancyOptimizer zero(ddp.parameters(), factory(kind), group);
  for (int step = 0; step < 3; ++step) {
    forward_backward(ddp, rank, step);
    zero.step();
    zero.zero_grad();
  }
  EXPECT(error_of([&] { zero.state_dict(); }).find("consolidate_state_dict") != std::string::npos,
         "state_dict() before consolidating does not say what to call");
  EXPECT(error_of([&] { zero.consolidate_state_dict(2); }).find("to=2 is not a rank") !=
             std::string::npos,
         "consolidate_state_dict(2) on 2 ranks does not name the bad rank");
  zero.consolidate_state_dict(0);
  if (rank == 0) {
    nn::TrainingState st;
    st.step = 3;
    st.model = net->state_dict();
    const optim::OptimizerState o = zero.state_dict();
    st.parts["optimizer"] = {o.meta, o.tensors};
    nn::save_checkpoint(ckpt, st);
  }
  pg->barrier()->wait();

  auto fresh_net = make_net();  // not the trained values: the checkpoint must bring them
  const nn::TrainingState loaded = nn::load_checkpoint(ckpt);
  fresh_net->load_state_dict(loaded.model);
  distributed::DDP fresh_ddp(fresh_net, group);
  ZeroRedundancyOptimizer fresh(fresh_ddp.parameters(), factory(kind), group);
  const nn::CheckpointPart& part = loaded.part("optimizer");
  fresh.load_state_dict({part.meta, part.tensors});

  forward_backward(ddp, rank, 3);
  std::vector<std::pair<std::string, Tensor>> record;
  const auto named = net->named_parameters();
  for (const auto& [name, p] : named) record.emplace_back("grad." + name, ops::clone(p.grad()));
  zero.step();
  forward_backward(fresh_ddp, rank, 3);
  fresh.step();
  const double d = max_rel_diff(fresh_ddp.parameters(), ddp.parameters());
  EXPECT(d <= 1e-6, kind_name(kind) << ": the restored ZeRO differs by " << d);
  for (const auto& [name, p] : named) record.emplace_back("after." + name, p);
  if (rank == 0) nn::save_safetensors(expected, record);

  // Loading the wrong kind of state fails, naming both kinds.
  const Kind other = kind == Kind::SGD ? Kind::Adam : Kind::SGD;
  ZeroRedundancyOptimizer wrong(fresh_ddp.parameters(), factory(other), group);
  const std::string e = error_of([&] { wrong.load_state_dict({part.meta, part.tensors}); });
  EXPECT(
      e.find(std::string("from a ") + kind_name(kind)) != std::string::npos &&
          e.find(kind_name(other)) != std::string::npos,
      "loading " << kind_name(kind) << " state into ZeRO(" << kind_name(other) << ") said: " << e);
  finish(pg, *store);
}

// One process: the checkpoint in a plain optimizer, stepped with the gradients the 2 ranks
// averaged, lands on the same parameters.
void round_trip_plain(Kind kind, const std::string& ckpt, const std::string& expected) {
  const nn::TrainingState loaded = nn::load_checkpoint(ckpt);
  auto net = make_net();
  net->load_state_dict(loaded.model);
  auto plain = factory(kind)({optim::ParamGroup(net->parameters())});
  const nn::CheckpointPart& part = loaded.part("optimizer");
  plain->load_state_dict({part.meta, part.tensors});
  auto want = nn::load_safetensors(expected);
  std::vector<Tensor> got, after;
  for (const auto& [name, p] : net->named_parameters()) {
    Tensor param = p;  // a handle to the module's parameter
    param.set_grad(want.at("grad." + name));
    got.push_back(param);
    after.push_back(want.at("after." + name));
  }
  plain->step();
  const double d = max_rel_diff(got, after);
  std::printf(
      "RESULT %s: plain optimizer from the ZeRO checkpoint, one step: max relative "
      "difference %.2e\n",
      kind_name(kind), d);
  EXPECT(d <= 1e-6, kind_name(kind) << ": the plain optimizer differs by " << d);
}

}  // namespace

TEST_CASE("partition_parameters: sorted greedy, hand-computed") {
  // Sizes 10, 50, 30, 20, 40 on 2 ranks: 50 -> r0, 40 -> r1, 30 -> r1 (70), 20 -> r0 (70),
  // 10 -> r0 (a tie: the lowest rank; 80).
  std::vector<Tensor> p;
  for (int64_t n : {10, 50, 30, 20, 40}) p.push_back(ops::zeros({n}));
  CHECK(distributed::partition_parameters({optim::ParamGroup(p)}, 2) ==
        std::vector<int>{0, 0, 1, 0, 1});
  // The counts carry over to the next group: {8} joins rank 1, which holds 0 after {9} -> r0.
  CHECK(distributed::partition_parameters(
            {optim::ParamGroup({ops::zeros({9})}), optim::ParamGroup({ops::zeros({8})})}, 2) ==
        std::vector<int>{0, 1});
  // More ranks than parameters: some shards are empty.
  CHECK(distributed::partition_parameters({optim::ParamGroup({ops::zeros({3})})}, 3) ==
        std::vector<int>{0});
}

TEST_CASE("ZeRO-1 equals plain DDP step by step; state per rank about 1/W") {
  for (Kind kind : {Kind::SGD, Kind::Adam}) {
    zero_equals_plain_ddp(2, kind);
    zero_equals_plain_ddp(3, kind);
  }
}

TEST_CASE("ZeRO-1 consolidated state round-trips: fresh ZeRO on 2 ranks, plain in 1 process") {
  for (Kind kind : {Kind::SGD, Kind::Adam}) {
    TempDir dir;
    const std::string ckpt = (dir.path / "ckpt.safetensors").string();
    const std::string expected = (dir.path / "expected.safetensors").string();
    run_ranks(
        2,
        [&](int rank, int world, const auto& store) {
          round_trip_rank(kind, ckpt, expected, rank, world, store);
        },
        kDeadline);
    run_ranks(
        1, [&](int, int, const auto&) { round_trip_plain(kind, ckpt, expected); }, kDeadline);
  }
}

// The guarantee of greedy list scheduling (Graham): when the shard that ends largest received
// its last parameter it was the smallest, so at most total / W; hence largest <= total / W +
// the largest parameter. With few, equal big tensors (resnet20's five 64x64x3x3 convolutions on
// 4 ranks) that bound is what one gets; with many parameters per rank it is close to 1/W.
TEST_CASE("partition_parameters: resnet20 and resnet18 shards near 1/W") {
  for (const std::string name : {"resnet20", "resnet18"}) {
    const auto params = models::create(name)->parameters();
    int64_t total = 0, biggest = 0;
    for (const Tensor& p : params) {
      total += p.numel();
      biggest = std::max(biggest, p.numel());
    }
    for (int world : {2, 3, 4, 8}) {
      const std::vector<int> owner =
          distributed::partition_parameters({optim::ParamGroup(params)}, world);
      std::vector<int64_t> shard(world, 0);
      for (size_t i = 0; i < params.size(); ++i) shard[owner[i]] += params[i].numel();
      const int64_t largest = *std::max_element(shard.begin(), shard.end());
      const double ratio = static_cast<double>(largest) * world / static_cast<double>(total);
      MESSAGE(name << " (" << total << " elements, largest parameter " << biggest << ") on "
                   << world << " ranks: largest shard " << largest << " = " << ratio
                   << " x total / W");
      CHECK(largest * world <= total + world * biggest);
      if (world <= 3) CHECK(ratio < 1.01);
    }
  }
}
