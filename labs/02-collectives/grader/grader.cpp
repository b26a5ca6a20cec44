// Lab 2's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// Every case forks one process per rank with a Gloo group (tests/distributed/fork_ranks.h); the
// oracle is Gloo's own all_reduce on the same inputs. Inputs are small integers, so float sums
// are exact whatever the order of the additions, and results compare bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "collectives_lab.h"
#include "fork_ranks.h"
#include "tensor/ops.h"

using namespace ddplab;

namespace {

using AllReduce = lab2::AllReduceFn;

// On `world` ranks, for each size: the student's all-reduce equals Gloo's, and leaves no message
// behind (the next collective of the group still works). Returns through the children's status.
void check_against_gloo(AllReduce fn, const char* name, int world, std::vector<size_t> sizes) {
  testing::run_ranks(world, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    for (size_t n : sizes) {
      std::vector<float> mine(n);
      for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>((rank + 1) * ((i % 13) + 1));
      Tensor want = ops::from_vector<float>(mine, {static_cast<int64_t>(n)});
      pg->all_reduce(want)->wait();
      lab2::run_collective(*pg, name, [&](lab2::Comm& c) { fn(c, mine.data(), n); })->wait();
      const std::vector<float> w_ = want.to_vector<float>();
      for (size_t i = 0; i < n; ++i)
        EXPECT(mine[i] == w_[i], name << ", " << n << " floats on " << w << " ranks: element " << i
                                      << " is " << mine[i] << ", Gloo says " << w_[i]);
    }
    Tensor one = ops::ones({1});
    pg->all_reduce(one)->wait();
    EXPECT(one.item<float>() == static_cast<float>(w), "the group is broken afterwards");
    testing::finish(pg, *st);
  });
}

}  // namespace

TEST_CASE("part 1 (ring all-reduce): equals Gloo on 2 ranks") {
  check_against_gloo(lab2::ring_allreduce, "ring", 2, {1, 2, 1000, 4099});
}

TEST_CASE("part 1 (ring all-reduce): equals Gloo on 3 and 4 ranks with uneven chunks") {
  check_against_gloo(lab2::ring_allreduce, "ring", 3, {1, 2, 3, 10, 1001});
  check_against_gloo(lab2::ring_allreduce, "ring", 4, {0, 3, 4, 1003});
}

TEST_CASE("part 1 (ring all-reduce): sends 2 (W - 1) / W of the data per rank") {
  // The point of the ring: each rank's link carries about 2 S (W - 1) / W bytes whatever W is,
  // not (W - 1) S as when everyone sends everything to everyone.
  testing::run_ranks(4, [](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    const size_t n = 4000;
    std::vector<float> data(n, 1.0f);
    size_t sent = 0;
    lab2::run_collective(*pg, "ring", [&](lab2::Comm& c) {
      lab2::ring_allreduce(c, data.data(), n);
      sent = c.bytes_sent();
    })->wait();
    EXPECT(data[0] == 4.0f && data[n - 1] == 4.0f, "wrong sums");
    EXPECT(sent == 2 * 3 * n / 4 * sizeof(float), "rank " << rank << " sent " << sent << " bytes");
    testing::finish(pg, *st);
  });
}

TEST_CASE("part 2 (tree all-reduce): equals Gloo on 2 and 3 ranks") {
  check_against_gloo(lab2::tree_allreduce, "tree", 2, {1, 1000});
  check_against_gloo(lab2::tree_allreduce, "tree", 3, {0, 1, 7, 1001});
}

TEST_CASE("part 2 (tree all-reduce): equals Gloo on 4 and 5 ranks") {
  check_against_gloo(lab2::tree_allreduce, "tree", 4, {1, 5, 1000});
  check_against_gloo(lab2::tree_allreduce, "tree", 5, {2, 999});
}

TEST_CASE("part 2 (tree all-reduce): rank 0 sends only ceil(log2 W) messages") {
  // A tree is about latency: the root talks to log2(W) children, not to W - 1 ranks.
  testing::run_ranks(5, [](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    std::vector<float> data(10, 1.0f);
    size_t sent = 0;
    lab2::run_collective(*pg, "tree", [&](lab2::Comm& c) {
      lab2::tree_allreduce(c, data.data(), data.size());
      sent = c.bytes_sent();
    })->wait();
    EXPECT(data[9] == 5.0f, "wrong sum " << data[9]);
    if (rank == 0) EXPECT(sent == 3 * 10 * sizeof(float), "rank 0 sent " << sent << " bytes");
    testing::finish(pg, *st);
  });
}

TEST_CASE("part 3 (bus bandwidth): nccl-tests' factor 2 (W - 1) / W") {
  CHECK(lab2::allreduce_bus_bandwidth(10.0, 1) == doctest::Approx(0.0));
  CHECK(lab2::allreduce_bus_bandwidth(10.0, 2) == doctest::Approx(10.0));
  CHECK(lab2::allreduce_bus_bandwidth(10.0, 4) == doctest::Approx(15.0));
  CHECK(lab2::allreduce_bus_bandwidth(3.0, 8) == doctest::Approx(5.25));
}
