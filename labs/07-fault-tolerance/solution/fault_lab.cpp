// Lab 7, the course staff's solution (the contracts are in fault_lab.h; handout: README.md).
#include "fault_lab.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "fileio.h"
#include "tensor/error.h"
#include "tensor/random.h"
#include "toy_training.h"

namespace lab7 {

namespace {

std::string folder_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

bool is_main_rank(const distributed::ProcessGroup* pg) {
  return pg == nullptr || pg->rank() == 0;
}

}  // namespace

void write_atomically(const std::string& path, const std::string& bytes) {
  // The temporary file sits in the same folder: rename is atomic only within one file system.
  const std::string tmp = path + ".tmp";
  const int fd = io::create(tmp);
  try {
    io::write_all(fd, bytes);
    io::fsync(fd);  // the bytes reach the disk before the name does
  } catch (...) {
    io::close(fd);
    io::remove(tmp);
    throw;
  }
  io::close(fd);
  io::rename(tmp, path);           // the commit: readers see the old file or the new one
  io::fsync_dir(folder_of(path));  // and the rename itself survives a power cut
}

std::string save(const std::string& dir, Run& run, distributed::ProcessGroup* pg) {
  std::string path = checkpoint_path(dir, run.step);
  // Every rank holds the same weights and optimizer state after a DDP step, so one copy is the
  // whole checkpoint; two ranks writing one file would race.
  if (is_main_rank(pg)) write_atomically(path, encode_checkpoint(capture(run)));
  // No rank goes on (and may be killed, or read the folder) before the file is complete.
  if (pg != nullptr) pg->barrier()->wait();
  return path;
}

nn::TrainingState capture(Run& run) {
  nn::TrainingState st;
  const data::DataLoaderState position = run.loader.state_dict();
  st.step = run.step;
  st.epoch = position.epoch;
  st.model = run.model.state_dict();
  const optim::OptimizerState opt = run.optimizer.state_dict();
  st.parts["optimizer"] = {opt.meta, opt.tensors};  // momentum buffers and hyper-parameters
  st.parts["data"].meta = {{"epoch", position.epoch},
                           {"batches_yielded", position.batches_yielded}};
  const Generator& gen = default_generator();  // the Dropout masks still to come
  st.parts["rng"].meta = {{"seed", gen.seed()}, {"offset", gen.offset()}};
  return st;
}

void restore(Run& run, const nn::TrainingState& state) {
  run.model.load_state_dict(state.model);
  const nn::CheckpointPart& opt = state.part("optimizer");
  run.optimizer.load_state_dict({opt.meta, opt.tensors});
  const nlohmann::json& data = state.part("data").meta;
  // The loader skips the batches of this epoch already used, without building them.
  run.loader.load_state_dict(
      {data.at("epoch").get<int64_t>(), data.at("batches_yielded").get<int64_t>()});
  const nlohmann::json& rng = state.part("rng").meta;
  default_generator().manual_seed(rng.at("seed").get<uint64_t>());
  default_generator().set_offset(rng.at("offset").get<uint64_t>());
  run.step = state.step;
}

std::optional<Checkpoint> newest_valid_checkpoint(const std::string& dir) {
  // By step, highest first: neither the file's time nor the order of names says which is newest.
  std::vector<int64_t> steps;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (auto step = step_of_checkpoint(entry.path().filename().string())) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t step : steps) {
    const std::string path = checkpoint_path(dir, step);
    try {
      return Checkpoint{path, nn::load_checkpoint(path)};
    } catch (const Error& e) {  // truncated, corrupt: say so, and fall back to the one before
      std::fprintf(stderr, "resume: skipping %s: %s\n", path.c_str(), e.what());
    }
  }
  return std::nullopt;
}

std::optional<int64_t> resume(const std::string& dir, Run& run, distributed::ProcessGroup* pg) {
  // Rank 0 alone chooses: ranks on other machines may list the folder differently (a network
  // file system's cache), and ranks that resumed from different steps would never agree again.
  std::optional<Checkpoint> found;
  int64_t step = -1;
  if (is_main_rank(pg)) {
    found = newest_valid_checkpoint(dir);
    if (found) step = found->state.step;
  }
  step = broadcast_from_rank0(pg, step);
  if (step < 0) return std::nullopt;
  if (!found) {
    const std::string path = checkpoint_path(dir, step);
    found = Checkpoint{path, nn::load_checkpoint(path)};
  }
  restore(run, found->state);
  return step;
}

}  // namespace lab7
