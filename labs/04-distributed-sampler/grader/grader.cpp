// Lab 4's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracles: what PyTorch's DistributedSampler(shuffle=False) returns (printed by PyTorch 1.13
// and written out below), the library's DistributedSampler for the shuffled orders, and, in part
// 4, ranks in separate processes that must together visit the dataset as one process would.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "data/distributed_sampler.h"
#include "fork_ranks.h"
#include "sampler_lab.h"
#include "tensor/ops.h"

using namespace ddplab;
using Shards = std::vector<std::vector<int64_t>>;

namespace {

Shards all_shards(int64_t n, int w, bool shuffle, uint64_t seed, int64_t epoch, bool drop_last) {
  Shards s;
  for (int r = 0; r < w; ++r) s.push_back(lab4::shard(n, w, r, shuffle, seed, epoch, drop_last));
  return s;
}

}  // namespace

TEST_CASE("part 1 (num_samples): PyTorch's counts with and without drop_last") {
  CHECK(lab4::num_samples(10, 3, false) == 4);  // ceil: 2 padded samples
  CHECK(lab4::num_samples(10, 3, true) == 3);   // floor: 1 sample dropped
  CHECK(lab4::num_samples(12, 3, false) == 4);  // even split: no padding either way
  CHECK(lab4::num_samples(12, 3, true) == 4);
  CHECK(lab4::num_samples(2, 5, false) == 1);  // fewer samples than ranks
  CHECK(lab4::num_samples(3, 4, true) == 0);
  CHECK(lab4::num_samples(0, 2, false) == 0);
}

TEST_CASE("part 2 (padding and striding): PyTorch's shards without shuffling") {
  // Written out from torch.utils.data.distributed.DistributedSampler(range(N), W, r,
  // shuffle=False, drop_last=...) for r in 0..W-1.
  CHECK(all_shards(10, 3, false, 0, 0, false) == Shards{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}});
  CHECK(all_shards(10, 3, false, 0, 0, true) == Shards{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}});
  CHECK(all_shards(7, 2, false, 0, 0, false) == Shards{{0, 2, 4, 6}, {1, 3, 5, 0}});
  CHECK(all_shards(7, 2, false, 0, 0, true) == Shards{{0, 2, 4}, {1, 3, 5}});
}

TEST_CASE("part 2 (padding and striding): tiny datasets pad cyclically or drop everything") {
  CHECK(all_shards(2, 5, false, 0, 0, false) == Shards{{0}, {1}, {0}, {1}, {0}});
  CHECK(all_shards(3, 4, false, 0, 0, true) == Shards{{}, {}, {}, {}});
  CHECK(all_shards(0, 2, false, 0, 0, false) == Shards{{}, {}});
}

TEST_CASE("part 3 (shuffle and epochs): the library's shards for every setting") {
  for (int64_t n : {1, 9, 10, 64, 101})
    for (int w : {1, 2, 3, 4})
      for (bool drop_last : {false, true})
        for (int64_t epoch : {0, 1, 7}) {
          for (int r = 0; r < w; ++r) {
            INFO("N " << n << ", rank " << r << " of " << w << ", drop_last " << drop_last
                      << ", epoch " << epoch);
            distributed::DistributedSampler ref(n, w, r, /*shuffle=*/true, /*seed=*/5, drop_last);
            CHECK(lab4::shard(n, w, r, true, 5, epoch, drop_last) == ref.indices(epoch));
          }
        }
}

TEST_CASE("part 3 (shuffle and epochs): a new order each epoch and a full cover in each") {
  const int64_t n = 60;
  const int w = 3;
  Shards e0 = all_shards(n, w, true, 1, 0, false), e1 = all_shards(n, w, true, 1, 1, false);
  CHECK(e0 != e1);                                   // set_epoch matters: the order changes
  CHECK(e0 == all_shards(n, w, true, 1, 0, false));  // and is a pure function of the epoch
  for (const Shards& e : {e0, e1}) {
    std::vector<int64_t> all;
    for (const auto& s : e) all.insert(all.end(), s.begin(), s.end());
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = i;
    CHECK(all == want);  // 60 = 3 x 20: every sample exactly once, on exactly one rank
  }
}

TEST_CASE("part 4 (ranks in separate processes): the shards gathered over Gloo cover the data") {
  // Three processes, as under ddprun: each computes only its own shard (no communication), then
  // the ranks all-gather the shards and each checks that together they are one epoch.
  testing::run_ranks(3, [](int rank, int world, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, world, st);
    const int64_t n = 100;  // 100 = 3 x 34 - 2: rank 1 and rank 2 each repeat one sample
    for (int64_t epoch : {0, 1}) {
      std::vector<int64_t> mine = lab4::shard(n, world, rank, true, 3, epoch, false);
      EXPECT(static_cast<int64_t>(mine.size()) == 34, "rank " << rank << " got " << mine.size());
      std::vector<Tensor> outs;
      outs.reserve(world);
      for (int r = 0; r < world; ++r) outs.push_back(ops::zeros({34}, kInt64));
      pg->all_gather(outs, ops::from_vector<int64_t>(mine, {34}, kInt64))->wait();
      std::multiset<int64_t> seen;
      for (const Tensor& o : outs)
        for (int64_t i : o.to_vector<int64_t>()) seen.insert(i);
      for (int64_t i = 0; i < n; ++i) EXPECT(seen.count(i) >= 1, "sample " << i << " is missing");
      EXPECT(seen.size() == 102, "gathered " << seen.size());  // 100 + the 2 padded
    }
    testing::finish(pg, *st);
  });
}
