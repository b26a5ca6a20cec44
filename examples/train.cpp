// train: trains an image classifier from the model zoo on CIFAR-10/100, (Fashion-)MNIST or an
// image folder, with SGD + momentum and a learning-rate schedule, printing progress and test
// accuracy after every epoch.
//
//   build/examples/train --model resnet20 --dataset cifar10 --data-dir data/cifar10 --epochs 30
//   build/examples/train --model cnn --dataset fmnist --epochs 2
//   build/tools/ddprun --standalone --nproc-per-node 2 build/examples/train --model cnn
//       --dataset fmnist --epochs 2      (DDP: 2 ranks, --batch-size per rank; docs/ddp.md)
//
// main() tells a training run in the order one thinks of it: configuration, data, model, the
// DDP wrapper, optimizer and schedule, then epochs of training (train_one_epoch, below main),
// evaluation and saving. Data parallelism is a few lines on top of single-process training: the
// loop works on an `nn::Module&` (wrap it) and takes its order of examples from a data::Sampler
// (give each rank its share). Every line of this file that single-process training would not
// need is marked `// DDP:`. Around the story, each in its own file: the flags
// (train_config.h); the process group, datasets, step counts and schedule built from them
// (train_setup.h); what the run prints and logs (train_report.h, docs/monitoring.md);
// checkpoints, resume and rollback (train_checkpoint.h, docs/checkpoints.md). See
// docs/training.md.
#include <algorithm>
#include <cmath>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "comm/init_process_group.h"
#include "comm/join.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "ddp/comm_hooks/builtin.h"
#include "ddp/ddp.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "examples/train_checkpoint.h"
#include "examples/train_config.h"
#include "examples/train_report.h"
#include "examples/train_setup.h"
#include "models/models.h"
#include "nn/autocast.h"
#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/module.h"
#include "nn/sync_batchnorm.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/adaptive_threads.h"
#include "tensor/random.h"
#include "tensor/threads.h"

using namespace ddplab;

namespace {

void train_one_epoch(nn::Module& model, distributed::DDP* ddp, train::Trainables& t,
                     train::LoopState& loop, const train::Config& c, const train::StepCounts& steps,
                     Device device, train::Checkpointing& checkpointing, train::Report& report);

}  // namespace

int main(int argc, char** argv) {
  train::Config c;
  std::string config_toml;  // every flag's value, defaults included
  if (const auto status = train::parse_flags(argc, argv, c, config_toml)) return *status;
  try {
    if (c.threads > 0) set_num_threads(c.threads);
    Device device(c.device);
    // --amp: refuse a dtype this device cannot autocast to now, before any data is loaded.
    if (const auto amp = train::autocast_dtype(c.amp)) amp::check_autocast_supported(device, *amp);
    const auto dist = train::setup_distributed(device, c.collective_timeout);  // DDP: join the job
    const auto& pg = dist.pg;               // DDP: the process group; null when training alone
    const bool main_rank = dist.main_rank;  // DDP: rank 0 prints and saves
    if (c.deterministic) train::make_deterministic(c, main_rank);
    manual_seed(c.seed);
    if (main_rank) train::report_config(config_toml, c);  // DDP: rank 0 prints and saves
    // Fault tolerance: the checkpoint to resume from (every rank the same), before data loads.
    train::Checkpointing checkpointing(c.checkpoint, pg);  // DDP: pg: rank 0 writes, all agree
    const auto resumed = checkpointing.find_resume();

    // Data: the first --subset examples (all by default), in a new order every epoch.
    const train::Data d = train::load_data(c);
    const int64_t n_train = c.subset > 0 ? std::min(c.subset, d.train->size()) : d.train->size();
    std::shared_ptr<data::Sampler> sampler;
    std::shared_ptr<distributed::DistributedSampler> dist_sampler;  // DDP:
    if (pg) {  // DDP: this rank's share; padded so every rank runs the same number of steps
      sampler = dist_sampler = std::make_shared<distributed::DistributedSampler>(  // DDP:
          n_train, dist.world, pg->rank(), !c.no_shuffle, c.seed, false, c.even_shards == "on");
    } else if (c.no_shuffle) {
      sampler = std::make_shared<data::SequentialSampler>(n_train);
    } else {
      sampler = std::make_shared<data::RandomSampler>(n_train, c.seed);
    }
    data::DataLoader train_loader(d.train, train::loader_options(c, device, sampler));

    // Model: from the zoo, its weights from --init-from or the checkpoint, on its device.
    const Shape sample = d.train->sample_shape();  // [C, H, W]
    auto net = models::create(c.model, d.train->num_classes(), sample[0], sample[1]);
    if (!c.init_from.empty()) nn::load(*net, c.init_from);
    if (resumed) train::Checkpointing::restore_model(*net, resumed->state);
    net->to(device);
    // DDP: batch statistics over the whole global batch; converted before wrapping.
    if (c.sync_bn && pg) net = nn::convert_sync_batchnorm(net, pg);  // DDP:
    // DDP: wrap the model. The wrapper's constructor broadcasts rank 0's weights (also after
    // --init-from); its forward and backward keep the ranks' gradients equal.
    std::shared_ptr<distributed::DDP> ddp;                // DDP:
    if (pg) {                                             // DDP:
      ddp = std::make_shared<distributed::DDP>(net, pg);  // DDP:
      distributed::register_builtin_comm_hook(            // DDP: --comm-hook (default: averaging)
          *ddp, {c.comm_hook, c.powersgd_rank, c.powersgd_start_iter});
    }
    nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;  // DDP: the loop trains this
    if (main_rank) train::print_setup(c, *net, n_train, d.test->size(), device, dist);  // DDP:

    // Optimizer: SGD with momentum, stepped once per --accumulation-steps micro-batches, and the
    // schedule of its learning rate; loss scaling, which every rank skips together (one scale).
    const optim::SGDOptions sgd{c.lr, c.momentum, 0, c.weight_decay, false};
    std::unique_ptr<optim::Optimizer> opt;
    if (c.zero && pg) {  // DDP: --zero: the same steps, each rank holding its shard's momentum
      opt = std::make_unique<distributed::ZeroRedundancyOptimizer>(  // DDP:
          model.parameters(), distributed::optimizer_factory<optim::SGD>(sgd), pg);
    } else {
      opt = std::make_unique<optim::SGD>(model.parameters(), sgd);
    }
    const train::StepCounts steps = train::count_steps(c, train_loader.size(), n_train, dist);
    if (main_rank) train::print_step_notes(c, dist, steps);  // DDP: rank 0 prints
    auto sched = train::make_schedule(c, *opt, steps);
    optim::GradScaler scaler(train::scaler_options(c), pg);  // DDP: pg: one scale on all ranks

    // Training: epochs, each evaluated, reported and checkpointed.
    train::Trainables trainables{*net, *opt, *sched, scaler, train_loader};  // checkpointed
    train::LoopState loop;
    if (resumed) checkpointing.restore(trainables, loop, resumed->state);
    train::Report report(c, dist, steps, loop.step);  // console, TensorBoard, metrics
    for (int epoch = static_cast<int>(loop.epoch); epoch < c.epochs && loop.step < steps.total;
         ++epoch) {
      loop.begin_epoch(epoch);  // zeroed counters (kept when resuming within this epoch)
      train_loader.set_epoch(epoch);
      if (dist_sampler) dist_sampler->set_epoch(epoch);  // DDP: same new shuffle on every rank
      train_one_epoch(model, ddp.get(), trainables, loop, c, steps, device, checkpointing, report);
      report.before_evaluation();
      // DDP: each rank's last forward updated its BatchNorm statistics from its own batch: every
      // rank evaluates rank 0's model on its share of the test set; an all-reduce sums the counts.
      if (pg) distributed::broadcast_coalesced(*pg, net->buffers(), 0);  // DDP:
      const double test_acc =
          train::planted_accuracy(epoch, train::evaluate(*net, d.test, c, device, pg.get()));
      report.end_epoch(epoch, loop, test_acc, opt->lr(), scaler, ddp.get());
      // Every rank: rollback on an accuracy drop, the best and the epoch's checkpoints.
      checkpointing.after_epoch(trainables, loop, test_acc);
      if (main_rank && !c.save.empty()) nn::save(*net, c.save);  // DDP: rank 0 saves (atomically)
    }
    if (pg) pg->barrier()->wait();  // DDP: rank 0 hosts the store, so nobody leaves early
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "\nerror: " << e.what() << "\n";
    distributed::record_error_for_launcher(e.what());  // DDP: torchrun's "Root Cause" shows it
    return 1;
  }
}

namespace {

// One pass over this rank's batches. Each micro-batch: forward and loss (under autocast with
// --amp), backward. After every --accumulation-steps of them: one optimizer step, its report and
// checkpoint. Gradient accumulation, clipping and loss scaling sit between backward and the step;
// each is a no-op when its flag is off, so the loop has one shape.
void train_one_epoch(nn::Module& model, distributed::DDP* ddp, train::Trainables& t,
                     train::LoopState& loop, const train::Config& c, const train::StepCounts& steps,
                     Device device, train::Checkpointing& checkpointing, train::Report& report) {
  model.train();
  report.begin_epoch(loop);
  monitor::StepMonitor& mon = report.monitor();
  const std::optional<DType> amp_dtype = train::autocast_dtype(c.amp);
  const std::vector<Tensor> params = model.parameters();
  // DDP, --even-shards off: a rank out of batches shadows the others' all-reduces until all
  // are done (comm/join.h); it then takes the longest rank's model. The scaler comes after the
  // model: a joined rank also answers its found-inf all-reduce.
  std::optional<distributed::Join> join;                                // DDP:
  if (ddp && c.even_shards == "off") {                                  // DDP:
    join.emplace(std::vector<distributed::Joinable*>{ddp, &t.scaler});  // DDP:
  }
  for (auto& batch : t.loader) {
    const auto in_batch = mon.batch_arrived();  // monitoring: the wait for data
    // Whether this micro-batch ends its accumulation group, and so is followed by the step.
    const int64_t group_size = steps.group_size(loop.micro);
    const bool steps_now = steps.ends_group(loop.micro);
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
      t.scaler.scale(to_backward).backward();
    }
    if (ddp) mon.reducer_iteration(ddp->reducer().last_iteration_timeline());  // DDP: monitoring
    const int64_t n = b.labels.size(0);
    loop.loss_sum += loss.item<double>() * static_cast<double>(n);
    loop.correct += std::llround(F::accuracy(logits.detach(), b.labels) * static_cast<double>(n));
    loop.seen += n;
    if (!steps_now) continue;

    // The gradients are now the same on every rank (DDP), so the norm, the clipping and the
    // overflow decision are the same everywhere too.
    auto timed = mon.phase("optimizer step");
    t.scaler.unscale_(t.opt);  // true gradients for the norm (a no-op without --grad-scaler)
    loop.grad_norm =
        optim::clip_grad_norm_(params, c.clip_grad_norm > 0 ? c.clip_grad_norm : optim::kInfNorm);
    const bool stepped = t.scaler.step(t.opt);  // false on inf/NaN (only with --grad-scaler)
    if (!stepped) ++loop.skipped_steps;
    t.scaler.update();
    t.opt.zero_grad();
    const double lr = t.opt.lr();  // the rate this step used
    t.sched.step();
    timed.end();
    ++loop.step;
    ++loop.epoch_steps;
    // Fewer threads while other programs hold the cores (Note [Threads under load] in
    // tensor/adaptive_threads.cpp); a deterministic run keeps its count.
    if (!c.deterministic) adapt_threads();
    report.check_grad_norm(loop, stepped);
    checkpointing.after_step(t, loop);  // every rank: --checkpoint-every-steps
    report.end_step(loop, lr, t.scaler.get_scale());
    if (loop.step >= steps.total) break;
  }
  if (join) {      // DDP: wait for the others; then count the steps this rank sat out
    join->join();  // DDP:
    for (; loop.epoch_steps < steps.per_epoch && loop.step < steps.total;  // DDP:
         ++loop.epoch_steps, ++loop.step) {
      t.sched.step();  // DDP:
    }
  }
}

}  // namespace
