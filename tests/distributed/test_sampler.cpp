// DistributedSampler: PyTorch's counts, padding, drop_last, striding and epoch behaviour.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "tensor/error.h"

using ddplab::distributed::DistributedSampler;

namespace {
// Every rank's indices, concatenated rank-major.
std::vector<std::vector<int64_t>> all_ranks(int64_t n, int w, bool shuffle, uint64_t seed,
                                            bool drop_last, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < w; ++r)
    out.push_back(DistributedSampler(n, w, r, shuffle, seed, drop_last).indices(epoch));
  return out;
}
}  // namespace

TEST_CASE("DistributedSampler: counts equal, union covers every index, padding repeats the front") {
  for (int64_t n : {0, 1, 2, 7, 10, 11, 100, 101}) {
    for (int w : {1, 2, 3, 4, 5}) {
      CAPTURE(n);
      CAPTURE(w);
      const int64_t per_rank = (n + w - 1) / w;  // ceil(N / W)
      auto ranks = all_ranks(n, w, /*shuffle=*/true, 7, false, 3);
      std::vector<int64_t> all;
      for (const auto& r : ranks) {
        CHECK(static_cast<int64_t>(r.size()) == per_rank);
        all.insert(all.end(), r.begin(), r.end());
      }
      CHECK(DistributedSampler(n, w, 0, true, 7).size() == per_rank);
      CHECK(DistributedSampler(n, w, 0, true, 7).total_size() == per_rank * w);
      std::set<int64_t> uniq(all.begin(), all.end());
      CHECK(static_cast<int64_t>(uniq.size()) == n);  // every index at least once
      for (int64_t i : all) CHECK((i >= 0 && i < n));
      // The padded order is the permutation followed by its own first elements (cyclically).
      const auto perm = ddplab::data::random_permutation(n, 7, 3);
      for (int64_t k = 0; k < per_rank * w; ++k) {
        const int r = static_cast<int>(k % w);
        const int64_t j = k / w;
        CHECK(ranks[r][j] == perm[k % std::max<int64_t>(n, 1)]);
      }
    }
  }
}

TEST_CASE("DistributedSampler: no shuffle strides 0..N-1 as PyTorch (N=10, W=4)") {
  // PyTorch: indices = [0..9] + [0, 1]; rank r takes indices[r::4].
  auto ranks = all_ranks(10, 4, /*shuffle=*/false, 0, false, 0);
  CHECK(ranks[0] == std::vector<int64_t>{0, 4, 8});
  CHECK(ranks[1] == std::vector<int64_t>{1, 5, 9});
  CHECK(ranks[2] == std::vector<int64_t>{2, 6, 0});
  CHECK(ranks[3] == std::vector<int64_t>{3, 7, 1});
  // Dataset smaller than the padding: repeated cyclically (N=2, W=5 -> 0 1 0 1 0).
  auto tiny = all_ranks(2, 5, false, 0, false, 0);
  CHECK(tiny[0] == std::vector<int64_t>{0});
  CHECK(tiny[2] == std::vector<int64_t>{0});
  CHECK(tiny[3] == std::vector<int64_t>{1});
  CHECK(tiny[4] == std::vector<int64_t>{0});
}

TEST_CASE("DistributedSampler: drop_last keeps floor(N/W) per rank and no duplicates") {
  auto ranks = all_ranks(10, 4, false, 0, /*drop_last=*/true, 0);
  CHECK(ranks[0] == std::vector<int64_t>{0, 4});
  CHECK(ranks[3] == std::vector<int64_t>{3, 7});
  for (int64_t n : {0, 3, 10, 11, 12, 101}) {
    for (int w : {1, 2, 3, 4}) {
      auto rs = all_ranks(n, w, true, 1, true, 2);
      std::vector<int64_t> all;
      for (const auto& r : rs) {
        CHECK(static_cast<int64_t>(r.size()) == n / w);
        all.insert(all.end(), r.begin(), r.end());
      }
      std::set<int64_t> uniq(all.begin(), all.end());
      CHECK(uniq.size() == all.size());  // nothing repeated
    }
  }
}

TEST_CASE(
    "DistributedSampler: set_epoch changes the order; same on every rank; W=1 is RandomSampler") {
  DistributedSampler s(1000, 1, 0, true, 42);
  const auto e0 = s.indices();
  s.set_epoch(1);
  const auto e1 = s.indices();
  CHECK(e0 != e1);
  CHECK(s.indices(0) == e0);  // a pure function of the epoch
  CHECK(e0 == ddplab::data::RandomSampler(1000, 42).indices(0));
  CHECK(e1 == ddplab::data::RandomSampler(1000, 42).indices(1));
  CHECK(DistributedSampler(1000, 1, 0, true, 43).indices(0) != e0);  // the seed matters

  // Every rank derives its share from the same permutation: interleaving the ranks' lists
  // rebuilds it exactly.
  auto ranks = all_ranks(1000, 4, true, 42, false, 5);
  const auto perm = ddplab::data::random_permutation(1000, 42, 5);
  for (int64_t k = 0; k < 1000; ++k) CHECK(ranks[k % 4][k / 4] == perm[k]);
}

TEST_CASE("DistributedSampler: bad arguments name the problem") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 2, 2), doctest::Contains("rank 2"), ddplab::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), ddplab::Error);
  CHECK_THROWS_AS(DistributedSampler(-1, 2, 0), ddplab::Error);
}

TEST_CASE(
    "DistributedSampler: even_shards=false visits every index exactly once, shares differ "
    "by at most one") {
  for (int64_t n : {0, 1, 2, 7, 10, 11, 100, 101}) {
    for (int w : {1, 2, 3, 4, 5}) {
      CAPTURE(n);
      CAPTURE(w);
      std::vector<int64_t> all;
      int64_t smallest = n, largest = 0;
      for (int r = 0; r < w; ++r) {
        DistributedSampler s(n, w, r, /*shuffle=*/true, 7, /*drop_last=*/false,
                             /*even_shards=*/false);
        const auto mine = s.indices(3);
        CHECK(static_cast<int64_t>(mine.size()) == s.size());
        CHECK(s.size() == (n > r ? (n - r + w - 1) / w : 0));
        smallest = std::min<int64_t>(smallest, s.size());
        largest = std::max<int64_t>(largest, s.size());
        all.insert(all.end(), mine.begin(), mine.end());
      }
      CHECK(largest - smallest <= 1);
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
      CHECK(all == expected);  // no padding: each index once
    }
  }
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 3, 0, true, 0, /*drop_last=*/true, false),
                       doctest::Contains("even_shards=false"), ddplab::Error);
}
