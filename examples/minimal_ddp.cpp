// minimal_ddp: the smallest complete DDP program, in the shape of PyTorch's DDP tutorial.
// A two-layer network learns which of four Gaussian blobs a 2-D point comes from; each rank trains
// on its shard of the data (DistributedSampler), DDP averages the gradients, rank 0 evaluates and
// writes a checkpoint. Built against the installed library (docs/getting-started.md):
//
//   c++ -O2 minimal_ddp.cpp $(pkg-config --cflags --libs ddplab) -o minimal_ddp
//   ddprun --standalone --nproc-per-node 2 ./minimal_ddp [checkpoint-path]
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <ddplab/ddplab.h>  // all of ddplab, as libtorch's <torch/torch.h>

using namespace ddplab;

// An in-memory dataset of (feature vector, label) rows: the Dataset interface asks how many
// samples there are, their shape, and how to write sample i into the batch the loader builds.
class PointDataset : public data::Dataset {
 public:
  PointDataset(Tensor x, Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return x_.size(0); }
  Shape sample_shape() const override { return {x_.size(1)}; }
  int64_t get_into(int64_t i, float* dst, const data::SampleRng& /*rng*/) const override {
    std::memcpy(dst, x_.data_ptr<float>() + i * x_.size(1), sizeof(float) * x_.size(1));
    return y_.data_ptr<int64_t>()[i];
  }
  const Tensor& x() const { return x_; }
  const Tensor& y() const { return y_; }

 private:
  Tensor x_, y_;
};

// Four blobs centred at (+-2, +-2); every rank draws the same points from the same seed.
std::shared_ptr<PointDataset> make_blobs(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor label = ops::randint(0, 4, {n}, &gen);
  Tensor centre = ops::from_vector<float>({-2, -2, -2, 2, 2, -2, 2, 2}, {4, 2});
  Tensor x = ops::add(ops::index_select(centre, 0, label), ops::randn({n, 2}, {}, &gen));
  return std::make_shared<PointDataset>(x, label);
}

// A custom model: a Module registers its layers, then says what forward does.
struct ToyModel : nn::Module {
  ToyModel() {
    register_module("net1", net1, std::make_shared<nn::Linear>(2, 32));
    register_module("net2", net2, std::make_shared<nn::Linear>(32, 4));
  }
  Tensor forward(const Tensor& x) override { return (*net2)(F::relu((*net1)(x))); }
  std::shared_ptr<nn::Linear> net1, net2;
};

int main(int argc, char** argv) {
  auto pg = distributed::init_process_group();  // RANK, WORLD_SIZE, MASTER_ADDR from ddprun
  const int rank = pg->rank();
  manual_seed(0);  // DDP copies rank 0's weights anyway; the seed makes the run repeatable
  auto ddp = std::make_shared<distributed::DDP>(std::make_shared<ToyModel>(), pg);

  auto train_set = make_blobs(2048, /*seed=*/1);
  data::DataLoaderOptions lo;
  lo.batch_size = 32;  // per rank: the global batch is 32 * world size
  auto sampler = std::make_shared<distributed::DistributedSampler>(train_set->size(), pg->size(),
                                                                   rank, /*shuffle=*/true);
  lo.sampler = sampler;
  data::DataLoader loader(train_set, lo);

  optim::SGDOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  optim::SGD opt(ddp->parameters(), so);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader.set_epoch(epoch);  // a new shuffle each epoch, the same on every rank
    double total = 0;
    for (auto& batch : loader) {
      opt.zero_grad();
      Tensor loss = F::cross_entropy(ddp->forward(batch.images), batch.labels);
      loss.backward();  // DDP all-reduces the gradients while backward runs
      opt.step();
      total += loss.item<double>();
    }
    if (rank == 0) std::printf("epoch %lld: loss %.4f\n", (long long)epoch, total / loader.size());
  }

  if (rank == 0) {  // every rank holds the same weights now; one evaluates and saves them
    auto test_set = make_blobs(512, /*seed=*/2);
    autograd::NoGradGuard no_grad;  // evaluation records no graph
    Tensor logits = ddp->module()->forward(test_set->x());
    std::printf("test accuracy: %.3f\n", F::accuracy(logits, test_set->y()));
    nn::TrainingState state;
    state.epoch = 3;
    state.model = ddp->module()->state_dict();  // without DDP's "module." prefix
    nn::save_checkpoint(argc > 1 ? argv[1] : "minimal_ddp.safetensors", state);
  }
  pg->barrier()->wait();  // no rank leaves while rank 0 still writes
  return 0;
}
