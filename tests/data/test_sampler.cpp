// Samplers smaller than their dataset: train --subset N visits the first N examples, reshuffled
// every epoch by a RandomSampler of size N (in file order by a SequentialSampler), and the
// DataLoader reads those examples and no others.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "data/dataloader.h"
#include "data/sampler.h"

using namespace ddplab;
using namespace ddplab::data;

namespace {

// n one-pixel examples whose label is their index.
class Indices : public Dataset {
 public:
  explicit Indices(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 1, 1}; }
  int64_t get_into(int64_t index, float* dst, const SampleRng&) const override {
    *dst = static_cast<float>(index);
    return index;
  }

 private:
  int64_t n_;
};

// The labels of one epoch, in the order the loader delivered them.
std::vector<int64_t> visited(const std::shared_ptr<Sampler>& sampler, int64_t dataset_size,
                             int64_t epoch) {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.sampler = sampler;
  DataLoader loader(std::make_shared<Indices>(dataset_size), o);
  loader.set_epoch(epoch);
  std::vector<int64_t> out;
  for (auto& b : loader) {
    const int64_t* l = b.labels.data_ptr<int64_t>();
    out.insert(out.end(), l, l + b.labels.numel());
  }
  return out;
}

}  // namespace

TEST_CASE("a RandomSampler of size n over a larger dataset: the first n examples, shuffled") {
  auto sampler = std::make_shared<RandomSampler>(10, /*seed=*/7);
  const std::vector<int64_t> e0 = visited(sampler, 100, 0), e1 = visited(sampler, 100, 1);
  std::vector<int64_t> first(10);
  std::iota(first.begin(), first.end(), int64_t{0});
  for (const auto& e : {e0, e1}) {
    std::vector<int64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == first);
  }
  CHECK(e0 != first);                         // shuffled ...
  CHECK(e0 != e1);                            // ... anew every epoch ...
  CHECK(e0 == random_permutation(10, 7, 0));  // ... as random_permutation(n, seed, epoch)
  CHECK(e1 == random_permutation(10, 7, 1));
  CHECK(e0 == visited(sampler, 100, 0));  // the same order whenever epoch 0 is read again
}

TEST_CASE("a SequentialSampler of size n over a larger dataset: the first n examples in order") {
  auto sampler = std::make_shared<SequentialSampler>(6);
  CHECK(visited(sampler, 50, 0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(visited(sampler, 50, 3) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
}
