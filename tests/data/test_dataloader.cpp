// DataLoader: batch counts, coverage, seeded shuffling, determinism across worker counts,
// samplers, and errors from worker threads.
#include <algorithm>
#include <cstring>
#include <numeric>

#include <doctest/doctest.h>

#include "data/dataloader.h"
#include "tensor/ops.h"
#include "test_util.h"

using namespace ddplab;
using namespace ddplab::data;
using namespace ddplab::data::testing;

namespace {

// n images of shape c x h x w with distinct bytes; label = index.
std::shared_ptr<ImageDataset> synthetic(int64_t n, ImageShape shape, Transform t = {}) {
  std::vector<uint8_t> px(static_cast<size_t>(n * shape.numel()));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 7919) % 256);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  std::iota(labels.begin(), labels.end(), int64_t{0});
  auto ds = std::make_shared<ImageDataset>(std::move(px), std::move(labels), shape, Layout::kCHW,
                                           std::vector<std::string>{});
  ds->set_transform(std::move(t));
  return ds;
}

// All batches of one epoch, as (indices, image bytes, labels).
struct Epoch {
  std::vector<std::vector<int64_t>> indices;
  std::vector<std::vector<float>> images;
  std::vector<std::vector<int64_t>> labels;
};

Epoch run_epoch(DataLoader& loader, int64_t epoch) {
  Epoch out;
  loader.set_epoch(epoch);
  for (auto& b : loader) {
    CHECK(b.batch_index == static_cast<int64_t>(out.indices.size()));
    out.indices.push_back(b.indices);
    const float* p = b.images.data_ptr<float>();
    out.images.emplace_back(p, p + b.images.numel());
    const int64_t* l = b.labels.data_ptr<int64_t>();
    out.labels.emplace_back(l, l + b.labels.numel());
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& v) {
  std::vector<int64_t> out;
  for (const auto& x : v) out.insert(out.end(), x.begin(), x.end());
  return out;
}

// Throws for one index, to test error propagation out of workers.
class FailingDataset : public Dataset {
 public:
  int64_t size() const override { return 20; }
  Shape sample_shape() const override { return {1, 2, 2}; }
  int64_t get_into(int64_t index, float* dst, const SampleRng&) const override {
    DDP_CHECK(index != 13, "cannot read sample " << index);
    std::fill(dst, dst + 4, static_cast<float>(index));
    return index;
  }
};

}  // namespace

TEST_CASE("batch counts with and without drop_last; shapes and dtypes") {
  auto ds = synthetic(10, {1, 2, 3});
  for (int workers : {0, 2}) {
    DataLoaderOptions o;
    o.batch_size = 3;
    o.num_workers = workers;
    DataLoader keep(ds, o);
    CHECK(keep.size() == 4);
    Epoch e = run_epoch(keep, 0);
    REQUIRE(e.indices.size() == 4);
    CHECK(e.indices.back() == std::vector<int64_t>{9});
    CHECK(flat(e.indices) == flat(e.labels));
    o.drop_last = true;
    DataLoader drop(ds, o);
    CHECK(drop.size() == 3);
    CHECK(run_epoch(drop, 0).indices.size() == 3);
  }
  DataLoaderOptions o;
  o.batch_size = 4;
  o.pin_memory = true;
  DataLoader loader(ds, o);
  auto b = loader.next();
  REQUIRE(b.has_value());
  CHECK(b->images.shape() == Shape{4, 1, 2, 3});
  CHECK(b->images.dtype() == kFloat32);
  CHECK(b->labels.shape() == Shape{4});
  CHECK(b->labels.dtype() == kInt64);
}

TEST_CASE("every index exactly once per epoch; shuffle is seeded and changes with the epoch") {
  auto ds = synthetic(103, {1, 2, 2});
  DataLoaderOptions o;
  o.batch_size = 10;
  o.shuffle = true;
  o.seed = 42;
  DataLoader a(ds, o);
  Epoch a0 = run_epoch(a, 0), a1 = run_epoch(a, 1), a0_again = run_epoch(a, 0);
  for (const Epoch* e : {&a0, &a1}) {
    std::vector<int64_t> all = flat(e->indices);
    CHECK(flat(e->labels) == all);
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expect(103);
    std::iota(expect.begin(), expect.end(), int64_t{0});
    CHECK(all == expect);
  }
  CHECK(flat(a0.indices) != flat(a1.indices));
  CHECK(flat(a0.indices) == flat(a0_again.indices));
  o.num_workers = 2;
  DataLoader b(ds, o);  // same seed, other loader, workers: same order
  CHECK(flat(run_epoch(b, 1).indices) == flat(a1.indices));
  o.seed = 43;
  DataLoader c(ds, o);
  CHECK(flat(run_epoch(c, 0).indices) != flat(a0.indices));
  // Without shuffle: sequential.
  DataLoaderOptions s;
  s.batch_size = 50;
  DataLoader seq(ds, s);
  std::vector<int64_t> expect(103);
  std::iota(expect.begin(), expect.end(), int64_t{0});
  CHECK(flat(run_epoch(seq, 3).indices) == expect);
}

TEST_CASE("augmented batches are bit-identical for 0, 1 and 2 workers; epochs differ") {
  auto ds = synthetic(37, {3, 8, 8}, [] {
    Transform t;
    t.random_crop(8, 2).random_horizontal_flip().normalize(cifar10_stats());
    return t;
  }());
  std::vector<Epoch> runs;
  for (int workers : {0, 1, 2}) {
    for (int prefetch : {1, 3}) {
      DataLoaderOptions o;
      o.batch_size = 8;
      o.shuffle = true;
      o.seed = 7;
      o.num_workers = workers;
      o.prefetch_factor = prefetch;
      DataLoader loader(ds, o);
      runs.push_back(run_epoch(loader, 5));
      if (workers == 0 && prefetch == 1) {
        Epoch other = run_epoch(loader, 6);
        CHECK(other.images != runs[0].images);
      }
    }
  }
  for (const Epoch& e : runs) {
    CHECK(e.indices == runs[0].indices);
    CHECK(e.images == runs[0].images);  // exact float equality
  }
  // Sample i's augmentation depends on (seed, epoch, i), not on where the shuffle put it.
  Example direct = ds->get(runs[0].indices[1][2], 7, 5);
  const float* p = direct.image.data_ptr<float>();
  CHECK(std::vector<float>(p, p + 192) == std::vector<float>(runs[0].images[1].begin() + 2 * 192,
                                                             runs[0].images[1].begin() + 3 * 192));
}

TEST_CASE("samplers: external index lists and the permutation") {
  auto ds = synthetic(10, {1, 1, 1});
  DataLoaderOptions o;
  o.batch_size = 2;
  o.sampler = std::make_shared<ListSampler>(std::vector<int64_t>{3, 3, 1, 8, 0});
  DataLoader loader(ds, o);
  CHECK(loader.size() == 3);
  CHECK(flat(run_epoch(loader, 0).labels) == std::vector<int64_t>{3, 3, 1, 8, 0});

  std::vector<int64_t> p = random_permutation(1000, 1, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[static_cast<size_t>(i)] == i);
  CHECK(p != random_permutation(1000, 1, 1));
  CHECK(p == RandomSampler(1000, 1).indices(0));
  CHECK(SequentialSampler(3).indices(9) == std::vector<int64_t>{0, 1, 2});

  o.sampler = std::make_shared<ListSampler>(std::vector<int64_t>{1, 10});
  DataLoader bad(ds, o);
  CHECK(contains(error_of([&] { bad.next(); }), "index 10"));
}

TEST_CASE("an exception in a worker is rethrown by next(); the loader stays usable") {
  for (int workers : {0, 1, 3}) {
    DataLoaderOptions o;
    o.batch_size = 4;
    o.num_workers = workers;
    DataLoader loader(std::make_shared<FailingDataset>(), o);
    loader.begin_epoch(0);
    int good = 0;
    std::string err;
    try {
      while (auto b = loader.next()) ++good;
    } catch (const Error& e) {
      err = e.what();
    }
    CHECK(good == 3);  // batches 0-2 (indices 0..11); batch 3 holds index 13
    CHECK(contains(err, "cannot read sample 13"));
    CHECK(!loader.next().has_value());  // the failed epoch is over
    // A new epoch starts cleanly and reaches the bad batch again.
    loader.begin_epoch(1);
    CHECK(loader.next().has_value());
  }
}

TEST_CASE("leaving an epoch early and destroying a busy loader are clean") {
  auto ds = synthetic(200, {3, 8, 8});
  DataLoaderOptions o;
  o.batch_size = 4;
  o.num_workers = 2;
  o.prefetch_factor = 4;
  {
    DataLoader loader(ds, o);
    for (auto& b : loader) {
      if (b.batch_index == 2) break;
    }
    loader.set_epoch(1);
    int64_t n = 0;
    for (auto& b : loader) {
      CHECK(b.batch_index == n);
      ++n;
    }
    CHECK(n == 50);
    loader.begin_epoch(2);
    loader.next();
  }  // destructor joins workers that are mid-epoch
  CHECK(true);
}

TEST_CASE("state_dict / load_state_dict resume mid-epoch with the same batches") {
  auto ds = synthetic(23, {1, 4, 4}, Transform().random_crop(4, 1).random_horizontal_flip());
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 5;
  for (int workers : {0, 2}) {
    o.num_workers = workers;
    DataLoader a(ds, o);
    Epoch full = run_epoch(a, 3);
    // Stop after 2 batches of epoch 3, save the position, resume in a fresh loader.
    a.begin_epoch(3);
    a.next();
    a.next();
    DataLoaderState st = a.state_dict();
    CHECK(st.epoch == 3);
    CHECK(st.batches_yielded == 2);
    DataLoader b(ds, o);
    b.load_state_dict(st);
    CHECK(b.state_dict().batches_yielded == 2);  // a loaded position reads back before use
    std::vector<int64_t> seen;
    for (auto& batch : b) {  // the range-for resumes at batch 2, then ends the epoch
      CHECK(batch.batch_index == 2 + static_cast<int64_t>(seen.size()) / 4);
      seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
      const float* p = batch.images.data_ptr<float>();
      CHECK(std::vector<float>(p, p + batch.images.numel()) == full.images[batch.batch_index]);
    }
    std::vector<int64_t> rest = flat(full.indices);
    rest.erase(rest.begin(), rest.begin() + 8);
    CHECK(seen == rest);
    // The next epoch starts from its first batch.
    Epoch next = run_epoch(b, 4);
    CHECK(next.indices.size() == 6);
  }
}

// PyTorch's contract: the sampler's epoch is what counts. Before this, the loader passed its own
// epoch to the sampler, so a user's sampler->set_epoch(e) was silently ignored.
TEST_CASE("DataLoader: a user's sampler->set_epoch changes the order, as loader.set_epoch does") {
  auto ds = synthetic(40, {1, 2, 2});
  auto sampler = std::make_shared<RandomSampler>(40, /*seed=*/3);
  DataLoaderOptions o;
  o.batch_size = 8;
  o.sampler = sampler;
  DataLoader loader(ds, o);
  auto order = [&] {
    std::vector<int64_t> out;
    for (auto& b : loader) out.insert(out.end(), b.indices.begin(), b.indices.end());
    return out;
  };
  const std::vector<int64_t> e0 = order();
  sampler->set_epoch(1);  // the user's call, not the loader's
  CHECK(loader.epoch() == 1);
  const std::vector<int64_t> e1 = order();
  CHECK(e1 != e0);
  CHECK(e1 == sampler->indices(1));
  loader.set_epoch(0);  // the loader forwards to the same sampler
  CHECK(sampler->epoch() == 0);
  CHECK(order() == e0);
  // The augmentation follows the same epoch: the plan's epoch is the sampler's.
  sampler->set_epoch(5);
  loader.begin_epoch();
  CHECK(loader.state_dict().epoch == 5);
}

TEST_CASE("TensorDataset: samples are the rows of the tensors; bad shapes are errors") {
  std::vector<float> x(5 * 2 * 3);
  std::iota(x.begin(), x.end(), 0.f);
  const Tensor inputs = ops::from_vector<float>(x, {5, 2, 3});
  const Tensor targets = ops::from_vector<int64_t>({4, 3, 2, 1, 0}, {5}, kInt64);
  auto ds = std::make_shared<TensorDataset>(inputs, targets);
  CHECK(ds->size() == 5);
  CHECK(ds->sample_shape() == Shape{2, 3});
  const Example e = ds->get(2);
  CHECK(e.label == 2);
  CHECK(e.image.to_vector<float>() == std::vector<float>{12, 13, 14, 15, 16, 17});
  DataLoaderOptions o;
  o.batch_size = 2;
  DataLoader loader(ds, o);
  int64_t seen = 0;
  for (auto& b : loader) {
    CHECK(b.images.shape() == Shape{b.labels.size(0), 2, 3});
    for (int64_t k = 0; k < b.labels.size(0); ++k) {
      CHECK(b.labels.to_vector<int64_t>()[k] == 4 - b.indices[k]);
      CHECK(b.images.to_vector<float>()[k * 6] == static_cast<float>(b.indices[k] * 6));
    }
    seen += b.labels.size(0);
  }
  CHECK(seen == 5);
  CHECK_THROWS_WITH(TensorDataset(inputs, ops::from_vector<int64_t>({1, 2}, {2}, kInt64)),
                    doctest::Contains("5 inputs but 2 targets"));
  CHECK_THROWS_WITH(TensorDataset(inputs, ops::from_vector<float>({1, 2, 3, 4, 5}, {5})),
                    doctest::Contains("int64"));
}
