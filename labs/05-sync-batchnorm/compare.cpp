// Lab 5's measurement: why small per-rank batches need SyncBatchNorm. Trains SmallCNN on a
// subset of Fashion-MNIST twice under DDP, from the same weights on the same batches: once with
// plain BatchNorm2d (each rank normalises with its own B images), once with SyncBatchNorm
// (statistics of all W * B images: yours, or the library's with --library). Rank 0 then
// evaluates both in eval mode (running statistics) on the test subset. Run it under ddprun:
//   ddprun --standalone --nproc-per-node 2 build/labs/lab05_compare_starter [--batch 2] ...
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "comm/init_process_group.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "ddp/ddp.h"
#include "models/simple.h"
#include "nn/functional.h"
#include "nn/sync_batchnorm.h"
#include "optim/sgd.h"
#include "sync_bn_lab.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

namespace {

struct Options {
  int64_t steps = 1000;  // optimizer steps per model
  int64_t batch = 1;     // images per rank and step
  int64_t train = 6000;  // the first `train` training images
  int64_t test = 2000;   // the first `test` test images
  double lr = 0.02;      // SGD
  double momentum = 0;   // with 0.9 it diverged here (lr 0.01, 0.02)
  bool library = false;  // nn::SyncBatchNorm instead of yours
  uint64_t seed = 0;     // the weights and the order of the batches
};

// `--name value` pairs (and the flag --library); anything else is an error naming it.
Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--library") {
      o.library = true;
    } else if (a.rfind("--", 0) == 0 && i + 1 < argc) {
      values[a.substr(2)] = argv[++i];
    } else {
      throw Error("unexpected argument '" + a +
                  "' (options: --steps N --batch B --train N --test N --lr X --momentum M --seed S "
                  "--library)");
    }
  }
  auto number = [&](const std::string& name, double low) {
    const std::string& v = values.at(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(x >= low))
      throw Error("--" + name + " expects a number >= " + std::to_string(static_cast<int>(low)) +
                  ", got '" + v + "'");
    return x;
  };
  for (const auto& [name, value] : values) {
    if (name == "steps")
      o.steps = static_cast<int64_t>(number(name, 1));
    else if (name == "batch")
      o.batch = static_cast<int64_t>(number(name, 1));
    else if (name == "train")
      o.train = static_cast<int64_t>(number(name, 1));
    else if (name == "test")
      o.test = static_cast<int64_t>(number(name, 1));
    else if (name == "lr")
      o.lr = number(name, 0);
    else if (name == "momentum")
      o.momentum = number(name, 0);
    else if (name == "seed")
      o.seed = static_cast<uint64_t>(number(name, 0));
    else
      throw Error("unknown option --" + name);
  }
  return o;
}

// The first n images of a split, normalised with Fashion-MNIST's mean and std, and their labels.
struct Subset {
  Tensor images, labels;
};
Subset load(bool train, int64_t n) {
  data::FashionMNIST ds(data::FashionMNIST::kDebianRoot, train);
  n = std::min(n, ds.size());
  Tensor images = ops::empty({n, 1, 28, 28});
  Tensor labels = ops::empty({n}, kInt64);
  for (int64_t i = 0; i < n; ++i) {
    labels.data_ptr<int64_t>()[i] = ds.get_into(i, images.data_ptr<float>() + i * 28 * 28, {});
  }
  return {ops::div(ops::sub(images, 0.2860), 0.3530), labels};
}

struct Result {
  double train_loss;  // the mean over the last quarter of the steps, on rank 0's batches
  double test_loss, test_accuracy;
};

// Trains `model` under DDP for o.steps: step s takes the next W * B images of a seeded shuffle
// (the same on every rank and for both models); rank r takes its B of them.
Result train(const nn::ModulePtr& model, const Subset& data, const Subset& test,
             const std::shared_ptr<distributed::ProcessGroup>& pg, const Options& o) {
  auto ddp = std::make_shared<distributed::DDP>(model, pg);
  optim::SGDOptions so;
  so.lr = o.lr;
  so.momentum = o.momentum;
  optim::SGD opt(ddp->parameters(), so);
  const int64_t n = data.images.size(0), global = o.batch * pg->size();
  const int64_t per_epoch = n / global;
  double tail_loss = 0;
  int64_t tail_steps = 0;
  std::vector<int64_t> order;
  for (int64_t s = 0; s < o.steps; ++s) {
    if (s % per_epoch == 0) order = data::random_permutation(n, o.seed, s / per_epoch);
    const int64_t first = (s % per_epoch) * global + pg->rank() * o.batch;
    const Tensor index = ops::from_vector<int64_t>(
        std::vector<int64_t>(order.begin() + first, order.begin() + first + o.batch), {o.batch},
        kInt64);
    opt.zero_grad();
    Tensor loss = F::cross_entropy(ddp->forward(ops::index_select(data.images, 0, index)),
                                   ops::index_select(data.labels, 0, index));
    loss.backward();
    opt.step();
    if (s >= o.steps - std::max<int64_t>(1, o.steps / 4)) {
      tail_loss += loss.item<double>();
      ++tail_steps;
    }
  }
  model->eval();  // batch norm now uses the running statistics
  autograd::NoGradGuard no_grad;
  const Tensor logits = model->forward(test.images);
  return {tail_loss / std::max<int64_t>(1, tail_steps),
          F::cross_entropy(logits, test.labels).item<double>(), F::accuracy(logits, test.labels)};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    auto pg = distributed::init_process_group();
    const bool main_rank = pg->rank() == 0;
    if (!std::filesystem::exists(data::FashionMNIST::kDebianRoot)) {
      if (main_rank)
        std::printf(
            "compare: needs Fashion-MNIST in %s (Debian's dataset-fashion-mnist); skipped\n",
            data::FashionMNIST::kDebianRoot);
      return 77;  // "skipped" for meson's test runner
    }
    const Subset data = load(true, o.train), test = load(false, o.test);
    if (data.images.size(0) < o.batch * pg->size())
      throw Error("--train " + std::to_string(data.images.size(0)) +
                  " images is less than one global batch of " +
                  std::to_string(o.batch * pg->size()));
    if (main_rank)
      std::printf(
          "SmallCNN, %lld steps of %d ranks x batch %lld, %lld training and %lld test "
          "images of Fashion-MNIST\n",
          static_cast<long long>(o.steps), pg->size(), static_cast<long long>(o.batch),
          static_cast<long long>(data.images.size(0)), static_cast<long long>(test.images.size(0)));

    manual_seed(o.seed);
    auto plain = std::make_shared<models::SmallCNN>();
    manual_seed(o.seed);  // the same initial weights
    auto synced = std::make_shared<models::SmallCNN>();
    if (o.library)
      nn::convert_sync_batchnorm(synced, pg);
    else
      lab5::convert_sync_batchnorm(synced, pg);

    const Result a = train(plain, data, test, pg, o);
    const Result b = train(synced, data, test, pg, o);
    if (main_rank) {
      std::printf("%-28s %12s %10s %14s\n", "", "train loss", "test loss", "test accuracy");
      std::printf("%-28s %12.4f %10.4f %14.4f\n", "BatchNorm2d (per rank)", a.train_loss,
                  a.test_loss, a.test_accuracy);
      std::printf("%-28s %12.4f %10.4f %14.4f\n",
                  o.library ? "nn::SyncBatchNorm" : "lab5::SyncBatchNorm (yours)", b.train_loss,
                  b.test_loss, b.test_accuracy);
    }
    pg->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare: %s\n", e.what());
    return 1;
  }
}
