// train: trains an image classifier from the model zoo on CIFAR-10/100, (Fashion-)MNIST or an
// image folder, with SGD + momentum and a learning-rate schedule, printing progress and test
// accuracy after every epoch.
//
//   build/examples/train --model resnet20 --dataset cifar10 --data-dir data/cifar10 --epochs 30
//   build/examples/train --model cnn --dataset fmnist --epochs 2
//   build/tools/ddprun --standalone --nproc-per-node 2 build/examples/train --model cnn
//       --dataset fmnist --epochs 2      (DDP: 2 ranks, --batch-size per rank; docs/ddp.md)
//
// The loop is deliberately plain (build data, model, optimizer, schedule; then epochs of
// forward / loss / backward / step) so that data parallelism is a few lines on top: the loop
// works on an `nn::Module&` (wrap it) and takes its order of training examples from a
// data::Sampler (give each rank its share). Every line that single-process training would not
// need is marked `// DDP:`; setup_distributed() joins the job. Gradient accumulation
// (--accumulation-steps), clipping (--clip-grad-norm) and loss scaling (--grad-scaler) sit
// between backward and the optimizer step. Fault tolerance (checkpoints, resume, rollback) lives
// in train_checkpoint.{h,cpp}: the loop calls it after each step and each epoch
// (docs/checkpoints.md). Monitoring (--logdir, --trace-dir, the epoch summary) reports to a
// monitor::StepMonitor (docs/monitoring.md). See docs/training.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/init_process_group.h"
#include "comm/join.h"
#include "data/cifar.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "data/image_folder.h"
#include "data/mnist.h"
#include "ddp/comm_hooks/builtin.h"
#include "ddp/ddp.h"
#include "ddp/evaluate.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "examples/train_checkpoint.h"
#include "examples/train_config.h"
#include "models/models.h"
#include "monitor/console.h"
#include "monitor/metrics_log.h"
#include "monitor/step_monitor.h"
#include "nn/autocast.h"
#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/module.h"
#include "nn/sync_batchnorm.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/adaptive_threads.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/thread_usage.h"
#include "tensor/threads.h"

using namespace ddplab;
using Clock = std::chrono::steady_clock;
using train::Config;

namespace {

// --deterministic: the same bits on every run of the same command on the same machine. The
// kernels' reductions (ours and oneDNN's) split work by thread count, so it must not change
// during the run or between a run and its resumption; data order and augmentation are already
// pure functions of (seed, epoch, index) whatever --num-workers is.
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

// --- data ------------------------------------------------------------------------------------

struct Data {
  std::shared_ptr<data::ImageDataset> train, test;
};

std::string default_dir(const std::string& dataset) {
  if (dataset == "fmnist") return data::FashionMNIST::kDebianRoot;
  return "data/" + dataset;
}

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

// --- learning-rate schedule -------------------------------------------------------------------

// Stepped once per iteration. Warm-up (linear from lr/warmup_steps to lr) then the schedule over
// the remaining steps. onecycle has its own warm-up phase (and also cycles the momentum).
std::unique_ptr<optim::LRScheduler> make_schedule(const Config& c, optim::Optimizer& opt,
                                                  int64_t total_steps, int64_t steps_per_epoch) {
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

// --- data parallelism ----------------------------------------------------------------------------

// What a process needs to be one rank of a data-parallel job.
struct Distributed {
  std::shared_ptr<distributed::ProcessGroup> pg;  // null when training alone
  int world = 1;
  bool main_rank = true;  // rank 0 prints and saves
};

// Under ddprun/torchrun (WORLD_SIZE > 1) this process is one rank of a DDP job: it joins the
// process group, on its own GPU when training on CUDA. Alone, it changes nothing.
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

// --- monitoring and evaluation ---------------------------------------------------------------

// Test accuracy of the inner model, every rank evaluating its share (ddp/evaluate.h).
double evaluate(nn::Module& net, const Data& d, const Config& c, Device device,
                const std::shared_ptr<distributed::ProcessGroup>& pg) {
  // DDP: each rank's last forward updated its BatchNorm running statistics from its own batch;
  // evaluate rank 0's model on every rank, as rank 0 alone would.
  if (pg) distributed::broadcast_coalesced(*pg, net.buffers(), 0);  // DDP:
  distributed::EvalOptions o;
  o.batch_size = std::max<int64_t>(c.batch_size, 256);
  o.num_workers = c.num_workers;
  o.device = device;
  o.limit = c.test_subset;
  return distributed::evaluate_sharded(net, d.test, o, pg.get()).accuracy();
}

}  // namespace

int main(int argc, char** argv) {
  train::Config c;
  std::string config_toml;  // every flag's value, defaults included
  if (const auto status = train::parse_flags(argc, argv, c, config_toml)) return *status;

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    Device device(c.device);
    // --amp: refuse a dtype this device cannot autocast to now, before any data is loaded.
    std::optional<DType> amp_dtype;
    if (!c.amp.empty()) amp_dtype = c.amp == "bf16" ? kBFloat16 : kFloat16;
    if (amp_dtype) amp::check_autocast_supported(device, *amp_dtype);
    const Distributed dist =
        setup_distributed(device, c.collective_timeout);  // DDP: join the job (alone: nothing)
    const auto& pg = dist.pg;                             // DDP:
    const int world = dist.world;                         // DDP:
    const bool main_rank = dist.main_rank;                // DDP:
    if (c.deterministic) make_deterministic(c, main_rank);
    const int asked_threads = get_num_threads();  // adapt_threads runs at most this many
    manual_seed(c.seed);
    if (main_rank) {  // DDP: rank 0 prints and saves
      // Every flag's value, defaults included: saved as a file, `--config FILE` repeats the run.
      std::printf("effective config:\n%s", config_toml.c_str());
      train::save_config(config_toml, {c.checkpoint.dir, c.logdir, c.trace_dir});
    }
    // Fault tolerance: the checkpoint to resume from (every rank the same), before data loads.
    train::Checkpointing checkpointing(c.checkpoint, pg);
    const auto resumed = checkpointing.find_resume();

    // Data.
    Data d = load_data(c);
    int64_t n_train = c.subset > 0 ? std::min<int64_t>(c.subset, d.train->size()) : d.train->size();
    std::shared_ptr<data::Sampler> train_sampler;
    std::shared_ptr<distributed::DistributedSampler> dist_sampler;  // DDP:
    const bool even_shards = c.even_shards == "on";                 // DDP:
    if (pg) {  // DDP: this rank's share; padded so every rank runs the same number of steps
      dist_sampler = std::make_shared<distributed::DistributedSampler>(
          n_train, world, pg->rank(), !c.no_shuffle, c.seed, false, even_shards);
      train_sampler = dist_sampler;
    } else if (c.no_shuffle) {
      train_sampler = std::make_shared<data::SequentialSampler>(n_train);  // the first n_train
    } else {
      train_sampler = std::make_shared<data::RandomSampler>(n_train, c.seed);
    }
    data::DataLoaderOptions train_opts;
    train_opts.batch_size = c.batch_size;
    train_opts.num_workers = c.num_workers;
    train_opts.seed = c.seed;
    train_opts.pin_memory = device.is_cuda();
    train_opts.sampler = train_sampler;
    data::DataLoader train_loader(d.train, train_opts);

    // Model.
    const Shape sample = d.train->sample_shape();  // [C, H, W]
    auto net = models::create(c.model, d.train->num_classes(), sample[0], sample[1]);
    if (!c.init_from.empty()) nn::load(*net, c.init_from);
    if (resumed) train::Checkpointing::restore_model(*net, resumed->state);
    net->to(device);
    if (c.sync_bn && pg) {  // DDP: batch statistics over the whole global batch; before wrapping
      net = nn::convert_sync_batchnorm(net, pg);
    } else if (c.sync_bn && main_rank) {
      std::printf("note: --sync-bn with one process: BatchNorm2d kept\n");
    }
    // DDP: wrap the model. The wrapper's constructor broadcasts rank 0's weights (also after
    // --init-from); its forward and backward keep the ranks' gradients equal.
    std::shared_ptr<distributed::DDP> ddp;                      // DDP:
    if (pg) ddp = std::make_shared<distributed::DDP>(net, pg);  // DDP:
    if (ddp) {  // DDP: --comm-hook (the default: the averaging all-reduce)
      distributed::register_builtin_comm_hook(
          *ddp, {c.comm_hook, c.powersgd_rank, c.powersgd_start_iter});
    }
    nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;  // DDP: the loop trains this
    if (main_rank) {                                                  // DDP: rank 0 prints
      std::printf("model %s: %lld parameters; %s: %lld train / %lld test examples; device %s\n",
                  c.model.c_str(), static_cast<long long>(net->num_parameters()), c.dataset.c_str(),
                  static_cast<long long>(n_train), static_cast<long long>(d.test->size()),
                  device.str().c_str());
      if (pg) {  // DDP: the job's shape
        std::printf("DDP: %d ranks (%s), batch %lld per rank%s, comm hook %s%s\n", world,
                    pg->backend_name().c_str(), static_cast<long long>(c.batch_size),
                    c.sync_bn ? ", SyncBatchNorm" : "", c.comm_hook.c_str(),
                    even_shards ? "" : ", uneven shards (Join)");
      }
      if (c.accumulation_steps > 1) {
        std::printf("accumulation: %lld micro-batches per step, %lld examples per step\n",
                    static_cast<long long>(c.accumulation_steps),
                    static_cast<long long>(c.accumulation_steps) * c.batch_size * world);
      }
    }

    // Optimizer and schedule (stepped every optimizer step). With accumulation an optimizer step
    // takes `accumulation_steps` micro-batches; the epoch's last step takes what is left.
    // DDP --zero: the same SGD steps, each rank holding the momentum of its shard only.
    const optim::SGDOptions sgd{c.lr, c.momentum, 0, c.weight_decay, false};
    std::unique_ptr<optim::Optimizer> optimizer;
    if (c.zero && pg) {
      optimizer = std::make_unique<distributed::ZeroRedundancyOptimizer>(
          model.parameters(), distributed::optimizer_factory<optim::SGD>(sgd), pg);
    } else {
      optimizer = std::make_unique<optim::SGD>(model.parameters(), sgd);
    }
    optim::Optimizer& opt = *optimizer;
    if (c.zero && main_rank && pg) {
      std::printf("ZeRO-1: optimizer state sharded over %d ranks\n", world);
    } else if (c.zero && main_rank) {
      std::printf("note: --zero with one process: nothing to shard, plain SGD\n");
    }
    const int64_t micro_per_epoch = train_loader.size();
    // DDP, --even-shards off: rank 0 holds the largest share; every rank schedules by it.
    const int64_t longest_epoch =
        even_shards || !pg
            ? micro_per_epoch
            : (distributed::DistributedSampler(n_train, world, 0, false, 0, false, false).size() +
               c.batch_size - 1) /
                  c.batch_size;
    const int64_t accum = c.accumulation_steps;
    const int64_t steps_per_epoch = (longest_epoch + accum - 1) / accum;
    if (accum > micro_per_epoch && main_rank) {
      std::printf(
          "note: --accumulation-steps %lld exceeds the %lld batches of an epoch: one "
          "optimizer step per epoch\n",
          static_cast<long long>(accum), static_cast<long long>(micro_per_epoch));
    }
    int64_t total_steps = steps_per_epoch * c.epochs;
    if (c.max_steps > 0) total_steps = std::min(total_steps, c.max_steps);
    auto sched = make_schedule(c, opt, total_steps, steps_per_epoch);
    // Dynamic loss scaling; with a process group every rank skips the same overflowing steps
    // (Note [One scale on every rank], optim/grad_scaler.cpp). Disabled, it passes through.
    optim::GradScalerOptions scaler_options;
    // float16 gradients underflow without it (bfloat16 has float32's range and needs none).
    scaler_options.enabled = c.grad_scaler || c.amp == "fp16";
    optim::GradScaler scaler(scaler_options, pg);
    const std::vector<Tensor> params = model.parameters();

    // Fault tolerance: what a checkpoint holds, and the loop's counters it carries along.
    train::Trainables trainables{*net, opt, *sched, scaler, train_loader};
    train::LoopState loop;
    if (resumed) checkpointing.restore(trainables, loop, resumed->state);

    std::optional<monitor::MetricsLog> metrics;
    if (!c.metrics.empty() && main_rank) metrics.emplace(c.metrics);
    // Monitoring: phase times, TensorBoard (rank 0), a trace per rank (docs/monitoring.md).
    monitor::StepMonitor mon({c.logdir, c.trace_dir, pg ? pg->rank() : 0});
    if (mon.writer()) mon.writer()->add_text("backend", pg ? pg->backend_name() : "none", 0);
    monitor::Progress bar;
    const int64_t first_step = loop.step;  // > 0 when resumed: the ETA counts this run's steps
    const auto run_start = Clock::now();
    for (int epoch = static_cast<int>(loop.epoch); epoch < c.epochs && loop.step < total_steps;
         ++epoch) {
      loop.begin_epoch(epoch);  // zeroed counters (kept when resuming within this epoch)
      train_loader.set_epoch(epoch);
      if (dist_sampler) dist_sampler->set_epoch(epoch);  // DDP: same new shuffle on every rank
      model.train();
      const auto epoch_start = Clock::now();
      const int64_t seen_before = loop.seen;    // examples of this epoch a resumed run did not see
      ThreadUsage thread_usage(asked_threads);  // for the epoch summary
      mon.begin_epoch();
      // DDP, --even-shards off: a rank out of batches shadows the others' all-reduces until all
      // are done (comm/join.h); it then takes the longest rank's model.
      std::optional<distributed::Join> join;  // DDP:
      // The scaler comes after the model: a joined rank also answers its found-inf all-reduce.
      if (ddp && !even_shards)
        join.emplace(std::vector<distributed::Joinable*>{ddp.get(), &scaler});
      for (auto& batch : train_loader) {
        const auto in_batch = mon.batch_arrived();  // monitoring: the wait for data
        // This micro-batch's accumulation group: which micro-batches it spans, and whether this
        // one ends it (and so is followed by the optimizer step).
        const int64_t group_start = loop.micro / accum * accum;
        const int64_t group_size = std::min(accum, micro_per_epoch - group_start);
        const bool steps_now = loop.micro - group_start == group_size - 1;
        ++loop.micro;
        data::Batch b = device.is_cuda() ? batch.to(device, true) : batch;
        Tensor logits, loss;
        {
          // DDP: before the group's last micro-batch, backward only accumulates locally; the last
          // backward all-reduces the sum: one round of bucket all-reduces per optimizer step.
          std::optional<distributed::DDP::NoSyncGuard> no_sync;  // DDP:
          if (ddp && !steps_now) no_sync.emplace(*ddp);          // DDP:
          {  // --amp: forward and loss under autocast; backward follows what they recorded
            const auto timed = mon.phase("forward");
            std::optional<amp::AutocastGuard> autocast;
            if (amp_dtype) autocast.emplace(device, *amp_dtype);
            logits = model(b.images);
            loss = F::cross_entropy(logits, b.labels);
          }
          // Dividing by the group size makes the summed gradient the mean over the group.
          Tensor to_backward = group_size > 1 ? ddplab::div(loss, group_size) : loss;
          // Under DDP, the group's last backward also averages the gradients over the ranks.
          const auto timed = mon.phase("backward");
          scaler.scale(to_backward).backward();
        }
        if (ddp) mon.reducer_iteration(ddp->reducer().last_iteration_timeline());  // monitoring
        const int64_t n = b.labels.size(0);
        loop.loss_sum += loss.item<double>() * static_cast<double>(n);
        loop.correct +=
            std::llround(F::accuracy(logits.detach(), b.labels) * static_cast<double>(n));
        loop.seen += n;
        if (!steps_now) continue;

        // The gradients are now the same on every rank (DDP), so the norm, the clipping and the
        // overflow decision are the same everywhere too.
        auto timed = mon.phase("optimizer step");
        scaler.unscale_(opt);  // true gradients for the norm (a no-op without --grad-scaler)
        loop.grad_norm = optim::clip_grad_norm_(
            params, c.clip_grad_norm > 0 ? c.clip_grad_norm : optim::kInfNorm);
        const bool stepped = scaler.step(opt);  // false on inf/NaN (only with --grad-scaler)
        if (!stepped) ++loop.skipped_steps;
        scaler.update();
        opt.zero_grad();
        const double lr = opt.lr();  // the rate this step used
        sched->step();
        timed.end();
        ++loop.step;
        ++loop.epoch_steps;
        // Fewer threads while other programs hold the cores (Note [Threads under load] in
        // tensor/adaptive_threads.cpp); a deterministic run keeps its count.
        if (!c.deterministic) adapt_threads();
        thread_usage.after_step();
        // A skipped step's norm is inf by definition: the scaler has dealt with it.
        if (main_rank && stepped && c.grad_norm_warn > 0 && !(loop.grad_norm <= c.grad_norm_warn)) {
          bar.end_line();  // on a terminal, below the progress line
          std::printf("warning: step %lld: gradient norm %.4g exceeds --grad-norm-warn %g%s\n",
                      static_cast<long long>(loop.step), loop.grad_norm, c.grad_norm_warn,
                      c.clip_grad_norm > 0 ? " (clipped)" : "");
        }
        checkpointing.after_step(trainables, loop);  // every rank: --checkpoint-every-steps

        double secs = std::chrono::duration<double>(Clock::now() - epoch_start).count();
        double ips = static_cast<double>(loop.seen - seen_before) / secs;
        double run_secs = std::chrono::duration<double>(Clock::now() - run_start).count();
        double eta = run_secs / static_cast<double>(loop.step - first_step) *
                     static_cast<double>(total_steps - loop.step);
        bool last = loop.step >= total_steps || loop.epoch_steps == steps_per_epoch;
        mon.end_step(loop.step, {{"train/loss", loop.loss_sum / static_cast<double>(loop.seen)},
                                 {"train/accuracy", static_cast<double>(loop.correct) /
                                                        static_cast<double>(loop.seen)},
                                 {"lr", lr},
                                 {"grad_norm", loop.grad_norm},
                                 {"loss_scale", scaler.get_scale()},
                                 {"images_per_sec", ips * world}});
        if (main_rank) {  // DDP: rank 0 prints (ips * world: the whole job's speed)
          bar.update(epoch, loop.epoch_steps, steps_per_epoch,
                     loop.loss_sum / static_cast<double>(loop.seen),
                     static_cast<double>(loop.correct) / static_cast<double>(loop.seen),
                     ips * world, eta, last);
        }
        if (loop.step >= total_steps) break;
      }
      if (join) {  // DDP: wait for the others; then count the steps this rank sat out
        join->join();
        for (; loop.epoch_steps < steps_per_epoch && loop.step < total_steps;
             ++loop.epoch_steps, ++loop.step) {
          sched->step();
        }
      }
      const double train_secs = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      const monitor::EpochTimes times = mon.end_epoch();
      // DDP: every rank evaluates its share of the test set; one all-reduce sums the counts.
      const double test_acc = train::planted_accuracy(epoch, evaluate(*net, d, c, device, pg));
      if (mon.writer()) {
        mon.writer()->add_scalar("val/accuracy", test_acc, loop.step);
        mon.writer()->flush();
      }
      if (main_rank) {  // DDP: rank 0 prints and writes the metrics
        bar.end_line();
        const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
        const double seen = static_cast<double>(loop.seen);
        const double train_loss = loop.seen ? loop.loss_sum / seen : 0.0;
        const double train_acc = loop.seen ? static_cast<double>(loop.correct) / seen : 0.0;
        const double ips =  // DDP: * world
            static_cast<double>((loop.seen - seen_before) * world) / train_secs;
        std::printf(
            "epoch %d: train loss %.4f, train acc %.2f%%, test acc %.2f%%, %.1f img/s, "
            "%.1f s, lr %.5f\n",
            epoch, train_loss, 100 * train_acc, 100 * test_acc, ips, seconds, opt.lr());
        monitor::print_epoch_summary(times, {ddp != nullptr, mon.writer() || mon.trace(),
                                             c.comm_wait_warn, c.allreduce_warn_ms});
        if (thread_usage.fewer_steps() > 0) std::printf("  %s\n", thread_usage.summary().c_str());
        std::fflush(stdout);
        if (metrics) {
          nlohmann::ordered_json j = {{"epoch", epoch},           {"step", loop.step},
                                      {"train_loss", train_loss}, {"train_acc", train_acc},
                                      {"test_acc", test_acc},     {"images_per_sec", ips},
                                      {"seconds", seconds},       {"grad_norm", loop.grad_norm}};
          if (c.grad_scaler) {
            j["loss_scale"] = scaler.get_scale();
            j["skipped_steps"] = loop.skipped_steps;
          }
          // DDP: rounds of bucket all-reduces so far; with accumulation, equal to "step".
          if (ddp) j["grad_sync_rounds"] = ddp->reducer().num_synchronized_backwards();
          // DDP: what the communication hook put on the wire in the last step.
          if (ddp) {
            j["bytes_all_reduced_per_step"] = ddp->reducer().bytes_all_reduced_last_iteration();
          }
          metrics->write(j);
        }
      }
      // Every rank: rollback on an accuracy drop, the best and the epoch's checkpoints.
      checkpointing.after_epoch(trainables, loop, test_acc);
      if (main_rank && !c.save.empty()) nn::save(*net, c.save);  // atomic: temp file + rename
    }
    if (pg) pg->barrier()->wait();  // DDP: rank 0 hosts the store, so nobody leaves early
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "\nerror: " << e.what() << "\n";
    distributed::record_error_for_launcher(e.what());  // torchrun's "Root Cause" shows it
    return 1;
  }
}
