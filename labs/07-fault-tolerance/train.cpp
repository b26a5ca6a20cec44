// Lab 7's program: the toy training job (toy_training.h) with your checkpoint code, made to crash
// on purpose so that you can watch ddprun restart it and the run resume. Run it under ddprun
// (README.md):
//   ddprun --standalone --nproc-per-node 2 --max-restarts 1 build/labs/lab07_train_starter
//       --dir /tmp/lab7 --fresh --die-at-step 7 --die-rank 1
// Flags:
//   --dir DIR                  the checkpoint folder (created if missing)
//   --steps N                  train until step N (default 24)
//   --save-every K             a checkpoint every K steps (default 4); 0: no checkpoints, and
//                              no resume either (the uninterrupted run to compare with)
//   --fresh                    on the first attempt, remove DIR's old checkpoints first
//   --die-at-step S            after step S (and its checkpoint), rank R kills itself with
//   --die-rank R               SIGKILL (default rank 0); first attempt only
//   --die-while-saving-step S  rank 0 dies halfway through writing step S's checkpoint; first
//                              attempt only
//   --out FILE                 rank 0 writes the final weights there (safetensors)
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "comm/init_process_group.h"
#include "fileio.h"
#include "nn/safetensors.h"
#include "tensor/error.h"
#include "tensor/threads.h"
#include "toy_training.h"

using namespace ddplab;

namespace {

struct Flags {
  std::string dir, out;
  int64_t steps = 24, save_every = 4, die_at_step = -1, die_rank = 0, die_while_saving = -1;
  bool fresh = false;
};

int64_t to_int(const std::string& flag, const std::string& text) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DDP_CHECK(used == text.size() && used > 0 && v >= 0,
            flag << " needs a whole number >= 0, got '" << text << "'");
  return v;
}

Flags parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, int64_t*> numbers = {{"--steps", &f.steps},
                                             {"--save-every", &f.save_every},
                                             {"--die-at-step", &f.die_at_step},
                                             {"--die-rank", &f.die_rank},
                                             {"--die-while-saving-step", &f.die_while_saving}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fresh") {
      f.fresh = true;
      continue;
    }
    DDP_CHECK(numbers.count(a) || a == "--dir" || a == "--out",
              "unknown flag '" << a << "' (see the top of labs/07-fault-tolerance/train.cpp)");
    DDP_CHECK(i + 1 < argc, a << " needs a value");
    const std::string v = argv[++i];
    if (a == "--dir") {
      f.dir = v;
    } else if (a == "--out") {
      f.out = v;
    } else {
      *numbers[a] = to_int(a, v);
    }
  }
  DDP_CHECK(f.save_every == 0 || !f.dir.empty(), "--save-every needs --dir DIR");
  return f;
}

// Removes the checkpoints in `dir` (and their temporary files), nothing else: --dir may name a
// folder that holds other things too.
void remove_checkpoints(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      name.resize(name.size() - 4);
    if (lab7::step_of_checkpoint(name)) std::filesystem::remove(entry.path());
  }
}

int train(const Flags& flags) {
  distributed::InitOptions init;
  // The whole run takes a second or two: a rank that waits 20 s for the others is stuck (ranks
  // that resumed from different steps no longer pair their collectives), so fail instead of
  // hanging for the default 30 minutes.
  init.timeout = std::chrono::seconds(20);
  auto pg = distributed::init_process_group(init);
  const int rank = pg->rank();
  // Bitwise reproducible needs a fixed thread count: reductions split their work by it.
  set_num_threads(1);
  // ddprun counts its restarts in TORCHELASTIC_RESTART_COUNT (0 on the first attempt).
  const int attempt = distributed::launch_env_from_environment().restart_count;
  const bool checkpoints = flags.save_every > 0;

  if (checkpoints) {
    if (rank == 0) {
      std::filesystem::create_directories(flags.dir);
      if (flags.fresh && attempt == 0) remove_checkpoints(flags.dir);
    }
    pg->barrier()->wait();
  }
  lab7::ToyTraining training(pg);
  lab7::Run& run = training.run();
  int64_t resumed = -1;  // the step resumed from; -1: a fresh start
  if (checkpoints) {
    if (std::optional<int64_t> step = lab7::resume(flags.dir, run, pg.get())) resumed = *step;
  }
  if (rank == 0) {
    const data::DataLoaderState pos = run.loader.state_dict();
    if (resumed >= 0) {
      std::printf("attempt %d: resumed from step %lld (epoch %lld, batch %lld) of %s\n", attempt,
                  static_cast<long long>(resumed), static_cast<long long>(pos.epoch),
                  static_cast<long long>(pos.batches_yielded),
                  lab7::checkpoint_path(flags.dir, resumed).c_str());
    } else {
      std::printf("attempt %d: starting at step 0\n", attempt);
    }
    std::fflush(stdout);
  }

  while (run.step < flags.steps) {
    const double loss = training.train_step();
    const data::DataLoaderState pos = run.loader.state_dict();
    if (rank == 0) {
      std::printf("step %3lld  epoch %lld  loss %.6f\n", static_cast<long long>(run.step),
                  static_cast<long long>(pos.epoch), loss);
    }
    if (checkpoints && run.step % flags.save_every == 0) {
      if (rank == 0 && attempt == 0 && run.step == flags.die_while_saving) {
        std::printf("rank 0: dying halfway through writing the checkpoint of step %lld\n",
                    static_cast<long long>(run.step));
        std::fflush(stdout);
        lab7::io::crash_halfway_through_next_write();
      }
      const std::string path = lab7::save(flags.dir, run, pg.get());
      if (rank == 0)
        std::printf("step %3lld  checkpoint %s\n", static_cast<long long>(run.step), path.c_str());
    }
    std::fflush(stdout);
    if (attempt == 0 && run.step == flags.die_at_step && rank == flags.die_rank) {
      std::printf("rank %d: SIGKILL after step %lld (--die-at-step, first attempt only)\n", rank,
                  static_cast<long long>(run.step));
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
  }

  if (rank == 0 && !flags.out.empty()) nn::save_safetensors(flags.out, run.model.state_dict());
  pg->barrier()->wait();  // no rank leaves while rank 0 still writes
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "lab07_train: %s\n", e.what());
    return 2;
  }
  try {
    return train(flags);
  } catch (const std::exception& e) {  // e.g. a LAB_TODO not done yet: say which, not abort()
    std::fprintf(stderr, "lab07_train: %s\n", e.what());
    return 1;
  }
}
