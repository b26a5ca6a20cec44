// Building train's pieces from its Config (see train_setup.h).
#include "examples/train_setup.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>

#include "comm/init_process_group.h"
#include "data/cifar.h"
#include "data/distributed_sampler.h"
#include "data/image_folder.h"
#include "data/mnist.h"
#include "ddp/evaluate.h"
#include "tensor/error.h"
#include "tensor/threads.h"

namespace ddplab::train {

Distributed setup_distributed(Device& device, double collective_timeout_s) {
  const distributed::LaunchEnv env = distributed::launch_env_from_environment();
  Distributed d;
  if (env.world_size <= 1) return d;
  if (device.is_cuda()) device = cuda(env.local_rank);  // one GPU per rank
  distributed::InitOptions options;
  options.device = device;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(collective_timeout_s * 1000));
  d.pg = distributed::init_process_group(options);
  d.world = d.pg->size();
  d.main_rank = d.pg->rank() == 0;
  return d;
}

void make_deterministic(const Config& c, bool main_rank) {
  const int threads = c.threads > 0 ? c.threads : get_num_threads();
  set_num_threads(threads);
  if (const char* dyn = std::getenv("OMP_DYNAMIC");
      dyn && std::string(dyn) != "false" && main_rank) {
    std::printf("warning: --deterministic with OMP_DYNAMIC=%s: the thread count may vary\n", dyn);
  }
  if (main_rank) {
    std::printf("deterministic: %d threads per rank%s\n", threads,
                c.device == "cpu" ? "" : " (bitwise reproducibility is checked on the CPU only)");
  }
}

std::optional<DType> autocast_dtype(const std::string& amp) {
  if (amp.empty()) return std::nullopt;
  return amp == "bf16" ? kBFloat16 : kFloat16;
}

namespace {

std::string default_dir(const std::string& dataset) {
  if (dataset == "fmnist") return data::FashionMNIST::kDebianRoot;
  return "data/" + dataset;
}

}  // namespace

Data load_data(const Config& c) {
  const std::string dir = c.data_dir.empty() ? default_dir(c.dataset) : c.data_dir;
  Data d;
  try {
    if (c.dataset == "cifar10" || c.dataset == "cifar100") {
      auto stats = c.dataset == "cifar10" ? data::cifar10_stats() : data::cifar100_stats();
      // The official record counts catch a download cut at a record boundary.
      const bool check_counts = !c.any_record_count;
      auto train_tf =
          c.no_augment ? data::Transform::eval(stats) : data::Transform::cifar_train(stats);
      if (c.dataset == "cifar10") {
        d.train = std::make_shared<data::CIFAR10>(dir, true, train_tf, check_counts);
        d.test =
            std::make_shared<data::CIFAR10>(dir, false, data::Transform::eval(stats), check_counts);
      } else {
        d.train = std::make_shared<data::CIFAR100>(dir, true, train_tf, check_counts);
        d.test = std::make_shared<data::CIFAR100>(dir, false, data::Transform::eval(stats),
                                                  check_counts);
      }
    } else if (c.dataset == "fmnist" || c.dataset == "mnist") {
      auto stats = c.dataset == "fmnist" ? data::fashion_mnist_stats() : data::mnist_stats();
      // Small gray images: a 2-pixel random shift is the usual light augmentation.
      data::Transform train_tf;
      if (!c.no_augment) train_tf.random_crop(28, 2);
      train_tf.normalize(stats);
      if (c.dataset == "fmnist") {
        d.train = std::make_shared<data::FashionMNIST>(dir, true, train_tf);
        d.test = std::make_shared<data::FashionMNIST>(dir, false, data::Transform::eval(stats));
      } else {
        d.train = std::make_shared<data::MNIST>(dir, true, train_tf);
        d.test = std::make_shared<data::MNIST>(dir, false, data::Transform::eval(stats));
      }
    } else if (c.dataset == "folder") {
      // No per-dataset statistics: normalise to roughly [-1, 1].
      data::NormStats stats{{0.5f}, {0.5f}};
      data::Transform train_tf;
      if (!c.no_augment) train_tf.random_horizontal_flip();
      train_tf.normalize(stats);
      d.train = std::make_shared<data::ImageFolder>(dir + "/train", train_tf);
      std::string test_dir = std::filesystem::exists(dir + "/test") ? dir + "/test" : dir + "/val";
      d.test = std::make_shared<data::ImageFolder>(test_dir, data::Transform::eval(stats));
    } else {
      throw Error("unknown dataset '" + c.dataset + "' (cifar10, cifar100, fmnist, mnist, folder)");
    }
  } catch (const Error& e) {
    std::cerr << "error: could not load " << c.dataset << " from '" << dir << "':\n  " << e.what()
              << "\n";
    // The dataset classes' messages already say what is missing and where to get it.
    std::cerr << "(--data-dir DIR reads the dataset from another folder";
    if (c.dataset == "folder") std::cerr << "; expected DIR/train/<class>/<image> and DIR/test/...";
    std::cerr << ")\n";
    std::exit(2);
  }
  return d;
}

data::DataLoaderOptions loader_options(const Config& c, Device device,
                                       std::shared_ptr<data::Sampler> sampler) {
  data::DataLoaderOptions o;
  o.batch_size = c.batch_size;
  o.num_workers = c.num_workers;
  o.seed = c.seed;
  o.pin_memory = device.is_cuda();
  o.sampler = std::move(sampler);
  return o;
}

int64_t StepCounts::group_size(int64_t micro) const {
  const int64_t group_start = micro / accumulation * accumulation;
  return std::min(accumulation, micro_per_epoch - group_start);
}

bool StepCounts::ends_group(int64_t micro) const {
  return micro - micro / accumulation * accumulation == group_size(micro) - 1;
}

StepCounts count_steps(const Config& c, int64_t micro_per_epoch, int64_t n_train,
                       const Distributed& dist) {
  StepCounts s;
  s.micro_per_epoch = micro_per_epoch;
  s.accumulation = c.accumulation_steps;
  int64_t longest_epoch = micro_per_epoch;
  if (dist.pg && c.even_shards == "off") {  // DDP: rank 0 holds the largest share; all follow it
    const int64_t rank0_share =
        distributed::DistributedSampler(n_train, dist.world, 0, false, 0, false, false).size();
    longest_epoch = (rank0_share + c.batch_size - 1) / c.batch_size;  // DDP:
  }
  s.per_epoch = (longest_epoch + s.accumulation - 1) / s.accumulation;
  s.total = s.per_epoch * c.epochs;
  if (c.max_steps > 0) s.total = std::min(s.total, c.max_steps);
  return s;
}

std::unique_ptr<optim::LRScheduler> make_schedule(const Config& c, optim::Optimizer& opt,
                                                  const StepCounts& steps) {
  const int64_t total_steps = steps.total, steps_per_epoch = steps.per_epoch;
  if (c.schedule == "onecycle") {
    return std::make_unique<optim::OneCycleLR>(opt, c.lr, std::max<int64_t>(total_steps, 2));
  }
  const int64_t warm = static_cast<int64_t>(std::llround(c.warmup_epochs * steps_per_epoch));
  const int64_t main_steps = std::max<int64_t>(total_steps - warm, 1);
  std::function<double(int64_t)> after;
  if (c.schedule == "constant") {
    after = [](int64_t) { return 1.0; };
  } else if (c.schedule == "step") {
    // x0.1 at each third of training.
    int64_t every = std::max<int64_t>(main_steps / 3, 1);
    after = [every](int64_t s) {
      // NOLINTNEXTLINE(bugprone-integer-division): whole steps, so the rate drops in stairs
      return std::pow(0.1, static_cast<double>(s / every));
    };
  } else if (c.schedule == "multistep") {
    // x0.1 at 50% and 75% of training (He et al. 2016: 32k and 48k of 64k iterations).
    after = [main_steps](int64_t s) {
      return std::pow(0.1, (s >= main_steps / 2 ? 1 : 0) + (s >= main_steps * 3 / 4 ? 1 : 0));
    };
  } else if (c.schedule == "cosine") {
    after = [main_steps](int64_t s) {
      return 0.5 * (1 + std::cos(M_PI * static_cast<double>(std::min(s, main_steps)) /
                                 static_cast<double>(main_steps)));
    };
  } else {
    throw Error("unknown --schedule '" + c.schedule +
                "' (constant, step, multistep, cosine, onecycle)");
  }
  return std::make_unique<optim::LambdaLR>(opt, [warm, after](int64_t s) {
    if (s < warm) return static_cast<double>(s + 1) / static_cast<double>(warm);
    return after(s - warm);
  });
}

optim::GradScalerOptions scaler_options(const Config& c) {
  optim::GradScalerOptions o;
  o.enabled = c.grad_scaler || c.amp == "fp16";
  return o;
}

double evaluate(nn::Module& net, const std::shared_ptr<data::ImageDataset>& test, const Config& c,
                Device device, distributed::ProcessGroup* pg) {
  distributed::EvalOptions o;
  o.batch_size = std::max<int64_t>(c.batch_size, 256);
  o.num_workers = c.num_workers;
  o.device = device;
  o.limit = c.test_subset;
  return distributed::evaluate_sharded(net, test, o, pg).accuracy();
}

}  // namespace ddplab::train
