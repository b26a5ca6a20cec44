// evaluate_sharded on 2 and 3 forked Gloo ranks: with a test set that no world size divides, the
// sharded accuracy equals the single-process accuracy on the same weights exactly (Note [Exact
// sharded evaluation] in ddp/evaluate.cpp), and the shards cover the set once.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "data/dataset.h"
#include "data/distributed_sampler.h"
#include "ddp/evaluate.h"
#include "fork_ranks.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;
using namespace ddplab::testing;

namespace {

constexpr int64_t kExamples = 101;  // prime: 2 and 3 ranks both get uneven shares

// The same seeded model and test set in every process (random labels, so the accuracy is far from
// 0 and 1 and a miscounted example shows).
std::shared_ptr<const data::TensorDataset> test_set() {
  manual_seed(7);
  const Tensor x = ops::randn({kExamples, 6});
  std::vector<int64_t> y(kExamples);
  for (int64_t i = 0; i < kExamples; ++i) y[static_cast<size_t>(i)] = (i * 7 + i / 3) % 4;
  return std::make_shared<data::TensorDataset>(x,
                                               ops::from_vector<int64_t>(y, {kExamples}, kInt64));
}

void check_sharded_equals_single(int world) {
  run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    auto ds = test_set();
    manual_seed(11);
    nn::Linear model(6, 4);
    distributed::EvalOptions o;
    o.batch_size = 8;  // several batches per shard, the last one short
    const distributed::EvalResult single = distributed::evaluate_sharded(model, ds, o, nullptr);
    const distributed::EvalResult sharded = distributed::evaluate_sharded(model, ds, o, pg.get());
    EXPECT(single.total == kExamples, single.total);
    EXPECT(sharded.total == kExamples, "sharded total " << sharded.total);
    EXPECT(sharded.correct == single.correct,
           "sharded " << sharded.correct << " vs single " << single.correct);
    EXPECT(sharded.accuracy() == single.accuracy(), sharded.accuracy());
    EXPECT(single.correct > 0 && single.correct < kExamples, single.correct);
    // What the note warns of: DistributedSampler's padded split visits more than the set.
    distributed::DistributedSampler padded(kExamples, w, rank, /*shuffle=*/false);
    EXPECT(padded.total_size() > kExamples, padded.total_size());
    finish(pg, *store);
  });
}

}  // namespace

TEST_CASE("evaluate_sharded: the shards are disjoint, contiguous and cover the set") {
  for (int world : {1, 2, 3, 7}) {
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      const auto [b, e] = distributed::eval_shard(kExamples, world, r);
      CHECK(b == next);
      CHECK(e - b >= kExamples / world);
      CHECK(e - b <= kExamples / world + 1);
      next = e;
    }
    CHECK(next == kExamples);
  }
}

TEST_CASE("evaluate_sharded: 2 ranks give the single-process accuracy exactly") {
  check_sharded_equals_single(2);
}

TEST_CASE("evaluate_sharded: 3 ranks give the single-process accuracy exactly") {
  check_sharded_equals_single(3);
}
