// Lab 7's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracles: the sequence of file operations POSIX needs for an atomic replace (fileio.h logs
// it), the previous file after a crash planted halfway through a write, the library's own
// checkpoint reader and writer (nn/checkpoint.h), and above all a run never interrupted: a run
// killed and resumed must end with exactly its bytes. Part 4 runs the lab's program under ddprun,
// as the handout does; the other multi-rank cases fork ranks (tests/distributed/fork_ranks.h).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fault_lab.h"
#include "fileio.h"
#include "fork_ranks.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "toy_training.h"

using namespace ddplab;
namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Byte strings compare through this, so that a failure prints no binary (or huge) values.
bool same_bytes(const std::string& a, const std::string& b) {
  return a == b;
}

// A tensor's bytes, to compare tensors bit for bit.
std::string tensor_bytes(const Tensor& t) {
  const Tensor c = ops::contiguous(t.detach());
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

// A checkpoint written by the library itself (the oracle's writer), holding `step`.
void plant_checkpoint(const std::string& dir, int64_t step) {
  nn::TrainingState st;
  st.step = step;
  st.epoch = step / 10;
  st.model = {{"weight", ops::full({16}, static_cast<double>(step))}};
  nn::save_checkpoint(lab7::checkpoint_path(dir, step), st);
}

// --- running the lab's program under ddprun --------------------------------------------------

// This grader is build/labs/lab07_grader_<variant>; the program it runs is the same variant's
// build/labs/lab07_train_<variant>, and ddprun is build/tools/ddprun.
std::string built(const std::string& what) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string name = self.filename().string();
  const std::string variant = name.substr(name.rfind('_') + 1);
  if (what == "ddprun") return (self.parent_path().parent_path() / "tools" / "ddprun").string();
  return (self.parent_path() / ("lab07_" + what + "_" + variant)).string();
}

struct Outcome {
  int status;
  std::string log;
};

// ddprun --standalone --nproc-per-node 2 [--max-restarts 1] lab07_train ARGS, output in a log.
// A run takes a second or two; `timeout` ends one that hangs (ddprun stops its workers on
// SIGTERM), so that a hang costs this case only and leaves no process behind.
Outcome ddprun_train(const std::string& args, bool allow_restart, const fs::path& scratch) {
  const std::string log = (scratch / "ddprun.log").string();
  const std::string cmd = "timeout -k 5 25 '" + built("ddprun") +
                          "' --standalone --nproc-per-node 2 " +
                          (allow_restart ? "--max-restarts 1 " : "") + "'" + built("train") + "' " +
                          args + " > '" + log + "' 2>&1";
  const int status = std::system(cmd.c_str());
  return {status, read_file(log)};
}

// The weights of a run never interrupted, with no checkpoint at all: the code under test plays no
// part in it.
std::string uninterrupted_weights(const fs::path& scratch) {
  const std::string out = (scratch / "reference.safetensors").string();
  const Outcome o = ddprun_train("--save-every 0 --out '" + out + "'", false, scratch);
  REQUIRE_MESSAGE(o.status == 0, "the uninterrupted run failed:\n" << o.log);
  return read_file(out);
}

// A 2-rank run under ddprun --max-restarts 1 that crashes as `crash` says on its first attempt;
// its final weights must be the uninterrupted run's, byte for byte.
void check_killed_run_ends_identical(const std::string& crash, const std::string& must_say) {
  TempDir scratch;
  const std::string want = uninterrupted_weights(scratch.path);
  const std::string out = (scratch.path / "resumed.safetensors").string();
  const Outcome o = ddprun_train(
      "--dir '" + (scratch.path / "ckpt").string() + "' --fresh " + crash + " --out '" + out + "'",
      true, scratch.path);
  INFO("ddprun's output:\n" << o.log);
  REQUIRE(o.status == 0);
  CHECK(o.log.find("restarting all workers (restart 1/1)") != std::string::npos);
  CHECK(o.log.find(must_say) != std::string::npos);
  const std::string got = read_file(out);
  CHECK_MESSAGE(got.size() == want.size(), "the final weights files differ in size");
  CHECK_MESSAGE(same_bytes(got, want),
                "the resumed run's final weights differ from the uninterrupted run's");
}

}  // namespace

// --- part 1: the atomic write, and the collective save ----------------------------------------

TEST_CASE("part 1 (atomic save): a temporary file beside it - fsync - rename - fsync the folder") {
  TempDir dir;
  const std::string path = (dir.path / "model.ckpt").string();
  write_file(path, "the previous checkpoint");
  std::string bytes(200000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 251);
  lab7::io::clear_log();
  lab7::write_atomically(path, bytes);
  CHECK(same_bytes(read_file(path), bytes));

  const std::vector<std::string>& log = lab7::io::log();
  std::string all;
  for (const auto& line : log) all += "  " + line + "\n";
  INFO("the file operations, in order:\n" << all);
  REQUIRE(!log.empty());
  REQUIRE(log[0].rfind("create ", 0) == 0);
  const std::string tmp = log[0].substr(7);
  CHECK_MESSAGE(tmp != path, "the first file created must be a temporary one, not " << path);
  CHECK_MESSAGE(fs::path(tmp).parent_path() == fs::path(path).parent_path(),
                "the temporary file must be in the same folder (rename works within a file "
                "system only)");
  auto find = [&](const std::string& line) {
    for (size_t i = 0; i < log.size(); ++i)
      if (log[i] == line) return static_cast<int>(i);
    return -1;
  };
  size_t written = 0;
  int last_write = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].rfind("write ", 0) != 0) continue;
    CHECK_MESSAGE(log[i].rfind("write " + tmp + " ", 0) == 0, "wrote to another file: " << log[i]);
    written += std::stoul(log[i].substr(log[i].rfind(' ') + 1));
    last_write = static_cast<int>(i);
  }
  CHECK(written == bytes.size());
  const int fsync = find("fsync " + tmp), close = find("close " + tmp);
  const int rename = find("rename " + tmp + " " + path);
  const int fsync_dir = find("fsync_dir " + fs::path(path).parent_path().string());
  CHECK_MESSAGE(rename > 0, "the temporary file is never renamed to " << path);
  CHECK_MESSAGE((fsync > last_write && fsync < rename),
                "the temporary file must be fsynced after the writes, before the rename");
  CHECK_MESSAGE((close > last_write && close < rename), "close the file before renaming it");
  CHECK_MESSAGE(fsync_dir > rename, "fsync the folder after the rename (or it may be lost)");
  CHECK_MESSAGE(!fs::exists(tmp), "the temporary file is left behind");

  lab7::write_atomically(path, "a newer one");  // replacing works too
  CHECK(read_file(path) == "a newer one");
}

TEST_CASE(
    "part 1 (atomic save): a crash halfway through the write leaves the previous file whole") {
  TempDir dir;
  const std::string path = (dir.path / "model.ckpt").string();
  const std::string fresh = (dir.path / "other.ckpt").string();
  const std::string before = "the previous checkpoint, complete", after(100000, 'n');
  write_file(path, before);
  // In a child: it dies by SIGKILL halfway through the bytes it writes through io::write_all.
  auto crash_writing = [&](const std::string& target) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      lab7::io::crash_halfway_through_next_write();
      try {
        lab7::write_atomically(target, after);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
      _exit(3);  // never got killed: the bytes did not go through io::write_all
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL),
                  "the write should have been killed halfway (write through io::write_all)");
  };
  crash_writing(path);
  CHECK_MESSAGE(same_bytes(read_file(path), before), path << " was damaged by the crash");
  crash_writing(fresh);
  CHECK_MESSAGE(!fs::exists(fresh), "a half-written file appeared under the final name");
  // What the crash left behind must not get in the way of the next save.
  lab7::write_atomically(path, after);
  CHECK(same_bytes(read_file(path), after));
}

TEST_CASE(
    "part 1 (atomic save): on 2 ranks only rank 0 writes - and no rank returns before it is done") {
  TempDir dir;
  const std::string d = dir.path.string();
  testing::run_ranks(2, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    lab7::ToyTraining t(pg);
    for (int i = 0; i < 3; ++i) t.train_step();
    lab7::io::clear_log();
    if (rank == 0) lab7::io::delay_writes(400);  // a slow disk: rank 1 must wait for it
    const std::string path = lab7::save(d, t.run(), pg.get());
    EXPECT(path == lab7::checkpoint_path(d, 3), "save returned " << path);
    EXPECT(fs::exists(path), "rank " << rank << " returned before " << path << " was there");
    const nn::TrainingState saved = nn::load_checkpoint(path);
    EXPECT(saved.step == 3, "the checkpoint says step " << saved.step);
    EXPECT(rank == 0 || lab7::io::log().empty(), "rank 1 touched files: " << lab7::io::log()[0]);
    EXPECT(rank != 0 || !lab7::io::log().empty(), "rank 0 did not write through fileio.h");
    testing::store_sync(*st, "finish", rank, w);
  });
}

// --- part 2: what a checkpoint holds ---------------------------------------------------------

TEST_CASE("part 2 (capture and restore): a restored run takes the same steps - bit for bit") {
  TempDir dir;
  const std::string file = (dir.path / "five.safetensors").string();
  std::string want;
  {
    lab7::ToyTraining a(nullptr);
    for (int i = 0; i < 5; ++i) a.train_step();
    write_file(file, lab7::encode_checkpoint(lab7::capture(a.run())));
    for (int i = 0; i < 9; ++i) a.train_step();  // across the end of epoch 0 (12 steps)
    want = lab7::weight_bytes(a.run().model);
  }
  // Another seed: other initial weights, another generator; nothing of `a` is left but the file.
  lab7::ToyTraining b(nullptr, /*seed=*/99);
  lab7::restore(b.run(), nn::load_checkpoint(file));
  for (int i = 0; i < 9; ++i) b.train_step();
  CHECK(b.run().step == 14);
  CHECK_MESSAGE(same_bytes(lab7::weight_bytes(b.run().model), want),
                "9 steps after restoring, the weights differ from the run that never stopped");
}

TEST_CASE("part 2 (capture and restore): the step - the epoch and the data position come back") {
  lab7::ToyTraining a(nullptr);
  for (int i = 0; i < 15; ++i) a.train_step();  // epoch 1, 3 of its 12 batches used
  const nn::TrainingState st = lab7::capture(a.run());
  CHECK(st.step == 15);
  CHECK(st.epoch == 1);
  TempDir dir;
  const std::string file = (dir.path / "c.safetensors").string();
  write_file(file, lab7::encode_checkpoint(st));
  lab7::ToyTraining b(nullptr, /*seed=*/99);
  lab7::restore(b.run(), nn::load_checkpoint(file));
  CHECK(b.run().step == 15);
  const data::DataLoaderState pos = b.run().loader.state_dict();
  CHECK(pos.epoch == 1);
  CHECK(pos.batches_yielded == 3);
  std::optional<data::Batch> next_a = a.run().loader.next(), next_b = b.run().loader.next();
  REQUIRE((next_a && next_b));
  const bool same_samples = next_a->indices == next_b->indices;
  CHECK_MESSAGE(same_samples, "the restored run reads other samples next");
}

TEST_CASE("part 2 (capture and restore): the optimizer's momentum and the generator come back") {
  TempDir dir;
  const std::string file = (dir.path / "m.safetensors").string();
  lab7::ToyTraining a(nullptr);
  for (int i = 0; i < 4; ++i) a.train_step();
  const uint64_t seed = default_generator().seed(), offset = default_generator().offset();
  const optim::OptimizerState want = a.run().optimizer.state_dict();
  write_file(file, lab7::encode_checkpoint(lab7::capture(a.run())));

  lab7::ToyTraining b(nullptr, /*seed=*/99);
  lab7::restore(b.run(), nn::load_checkpoint(file));
  CHECK_MESSAGE(default_generator().seed() == seed, "the generator's seed is not restored");
  CHECK_MESSAGE(default_generator().offset() == offset, "the generator's offset is not restored");
  const optim::OptimizerState got = b.run().optimizer.state_dict();
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    INFO("optimizer tensor " << want.tensors[i].first);
    CHECK(got.tensors[i].first == want.tensors[i].first);
    CHECK(same_bytes(tensor_bytes(got.tensors[i].second), tensor_bytes(want.tensors[i].second)));
  }
}

// --- part 3: falling back past damaged checkpoints -------------------------------------------

TEST_CASE("part 3 (fallback): a truncated newest checkpoint falls back to the one before") {
  TempDir dir;
  const std::string d = dir.path.string();
  for (int64_t s : {4, 8, 12}) plant_checkpoint(d, s);
  fs::resize_file(lab7::checkpoint_path(d, 12), fs::file_size(lab7::checkpoint_path(d, 12)) / 2);
  std::optional<lab7::Checkpoint> c = lab7::newest_valid_checkpoint(d);
  REQUIRE(c.has_value());
  CHECK(c->path == lab7::checkpoint_path(d, 8));
  CHECK(c->state.step == 8);
  fs::resize_file(lab7::checkpoint_path(d, 8), 10);  // not even a whole header
  c = lab7::newest_valid_checkpoint(d);
  REQUIRE(c.has_value());
  CHECK(c->path == lab7::checkpoint_path(d, 4));
  CHECK(c->state.step == 4);
}

TEST_CASE("part 3 (fallback): a flipped bit inside a tensor falls back too (its CRC32 fails)") {
  TempDir dir;
  const std::string d = dir.path.string();
  for (int64_t s : {4, 8}) plant_checkpoint(d, s);
  const std::string path = lab7::checkpoint_path(d, 8);
  std::string bytes = read_file(path);
  bytes.back() ^= 0x01;  // the last byte of the last tensor: every offset is still valid
  write_file(path, bytes);
  std::optional<lab7::Checkpoint> c = lab7::newest_valid_checkpoint(d);
  REQUIRE(c.has_value());
  CHECK(c->state.step == 4);
}

TEST_CASE("part 3 (fallback): newest means highest step - and leftovers are not checkpoints") {
  TempDir dir;
  const std::string d = dir.path.string();
  // Written newest first: the files' times say nothing. Step 1000000 has 7 digits, so the names
  // do not sort by step either.
  for (int64_t s : {1000000, 999999, 5}) plant_checkpoint(d, s);
  // A complete checkpoint that a crash left as .tmp before its rename, and an unrelated file.
  plant_checkpoint(d, 2000000);
  fs::rename(lab7::checkpoint_path(d, 2000000), lab7::checkpoint_path(d, 2000000) + ".tmp");
  write_file(d + "/notes.txt", "not a checkpoint");
  std::optional<lab7::Checkpoint> c = lab7::newest_valid_checkpoint(d);
  REQUIRE(c.has_value());
  CHECK(c->state.step == 1000000);
  CHECK(c->path == lab7::checkpoint_path(d, 1000000));
}

TEST_CASE("part 3 (fallback): no valid checkpoint means a fresh start") {
  TempDir dir;
  const std::string d = dir.path.string();
  CHECK_FALSE(lab7::newest_valid_checkpoint(d).has_value());  // an empty folder
  plant_checkpoint(d, 3);
  fs::resize_file(lab7::checkpoint_path(d, 3), 100);
  write_file(lab7::checkpoint_path(d, 6), "");
  CHECK_FALSE(lab7::newest_valid_checkpoint(d).has_value());
}

// --- part 4: resume, under ddprun ------------------------------------------------------------

TEST_CASE(
    "part 4 (resume): rank 1 killed after step 7 - restarted by ddprun - ends bit for bit as a run "
    "never killed") {
  check_killed_run_ends_identical("--die-at-step 7 --die-rank 1",
                                  "attempt 1: resumed from step 4 (epoch 0, batch 4)");
}

TEST_CASE(
    "part 4 (resume): rank 0 killed halfway through writing step 8 - resumes from step 4 - bit for "
    "bit") {
  check_killed_run_ends_identical("--die-while-saving-step 8",
                                  "attempt 1: resumed from step 4 (epoch 0, batch 4)");
}

TEST_CASE("part 4 (resume): every rank restores the checkpoint rank 0 chose") {
  TempDir scratch;
  // Checkpoints of steps 3 and 6 from a real run; then rank 1 sees a copy of the folder in which
  // step 6 is fine, rank 0 one in which it is truncated (as two machines may see a network
  // file system at a moment when one has not yet caught up).
  const std::string seen_by_0 = (scratch.path / "rank0").string();
  const std::string seen_by_1 = (scratch.path / "rank1").string();
  const std::string empty = (scratch.path / "empty").string();
  const Outcome o =
      ddprun_train("--dir '" + seen_by_0 + "' --steps 6 --save-every 3", false, scratch.path);
  REQUIRE_MESSAGE(o.status == 0, "the run that writes the checkpoints failed:\n" << o.log);
  fs::copy(seen_by_0, seen_by_1);
  fs::create_directory(empty);
  const std::string six = lab7::checkpoint_path(seen_by_0, 6);
  fs::resize_file(six, fs::file_size(six) / 2);

  testing::run_ranks(2, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    lab7::ToyTraining fresh(pg);
    const std::string before = lab7::weight_bytes(fresh.run().model);
    std::optional<int64_t> none = lab7::resume(empty, fresh.run(), pg.get());
    EXPECT(!none.has_value(), "resumed from step " << *none << " of an empty folder");
    EXPECT(fresh.run().step == 0 && lab7::weight_bytes(fresh.run().model) == before,
           "a resume that found nothing changed the run");

    lab7::ToyTraining t(pg);
    const std::string& mine = rank == 0 ? seen_by_0 : seen_by_1;
    std::optional<int64_t> step = lab7::resume(mine, t.run(), pg.get());
    EXPECT(step.has_value() && *step == 3,
           "rank " << rank << " resumed from step " << (step ? *step : -1) << ", rank 0 chose 3");
    EXPECT(t.run().step == 3, "rank " << rank << " is at step " << t.run().step);
    const nn::TrainingState three = nn::load_checkpoint(lab7::checkpoint_path(seen_by_0, 3));
    std::map<std::string, std::string> want;
    for (const auto& [name, tensor] : three.model) want[name] = tensor_bytes(tensor);
    for (const auto& [name, tensor] : t.run().model.state_dict()) {
      EXPECT(want[name] == tensor_bytes(tensor),
             "rank " << rank << ": " << name << " is not step 3's");
    }
    testing::store_sync(*st, "finish", rank, w);
  });
}
