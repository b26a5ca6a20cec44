// Tests of training checkpoints (nn/checkpoint.h): a resumed run continues bit for bit; damaged
// files are refused with the tensor, file and offset named, and the manager falls back to the
// previous checkpoint; rotation, stale temporary files, unwritable folders, a full disk; a fuzz
// of the reader.
#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include "data/dataloader.h"
#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tests/data/test_util.h"  // TempDir, contains
#include "tests/test_util.h"

using namespace ddplab;
namespace fs = std::filesystem;
using ddplab::data::testing::contains;
using ddplab::data::testing::TempDir;
using ddplab::testing::error_of;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(ops::contiguous(a).raw_data(), ops::contiguous(b).raw_data(), a.nbytes()) == 0;
}

// 24 images 3x8x8 with distinct bytes and 10 classes, augmented (random crop and flip), so the
// data position and the augmentation seed both matter.
std::shared_ptr<data::ImageDataset> tiny_dataset() {
  const data::ImageShape shape{3, 8, 8};
  std::vector<uint8_t> px(static_cast<size_t>(24 * shape.numel()));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 7919) % 251);
  std::vector<int64_t> labels(24);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  auto ds = std::make_shared<data::ImageDataset>(std::move(px), std::move(labels), shape,
                                                 data::Layout::kCHW, std::vector<std::string>{});
  data::Transform t;
  t.random_crop(8, 2).random_horizontal_flip().normalize(data::cifar10_stats());
  ds->set_transform(std::move(t));
  return ds;
}

// Everything a training run carries from step to step: model (with dropout, so the default
// generator matters), SGD with momentum and weight decay, a per-iteration schedule, a shuffling
// loader with worker threads.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<optim::StepLR> sched;
  std::unique_ptr<data::DataLoader> loader;
  int64_t step = 0;

  explicit Run(uint64_t init_seed) {
    manual_seed(init_seed);
    model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(192, 16),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.25),
        std::make_shared<nn::Linear>(16, 10)});
    optim::SGDOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
    opt = std::make_unique<optim::SGD>(model->parameters(), o);
    sched = std::make_unique<optim::StepLR>(*opt, 4, 0.5);
    data::DataLoaderOptions d;
    d.batch_size = 5;
    d.shuffle = true;
    d.seed = 11;
    d.num_workers = 2;
    loader = std::make_unique<data::DataLoader>(tiny_dataset(), d);
  }

  void train(int64_t steps) {
    for (int64_t i = 0; i < steps; ++i) {
      auto batch = loader->next();
      if (!batch) {  // end of the epoch: on to the next
        loader->begin_epoch(loader->epoch() + 1);
        batch = loader->next();
      }
      opt->zero_grad();
      Tensor loss = F::cross_entropy(model->forward(batch->images), batch->labels);
      loss.backward();
      opt->step();
      sched->step();
      ++step;
    }
  }

  // The glue the train app will use (docs/checkpoints.md).
  nn::TrainingState capture() const {
    nn::TrainingState st;
    st.step = step;
    data::DataLoaderState pos = loader->state_dict();
    st.epoch = pos.epoch;
    st.model = model->state_dict();
    optim::OptimizerState os = opt->state_dict();
    st.parts["optimizer"] = {os.meta, os.tensors};
    st.parts["scheduler"].meta = sched->state_dict();
    st.parts["rng"].meta = {{"seed", default_generator().seed()},
                            {"offset", default_generator().offset()}};
    st.parts["data"].meta = {{"epoch", pos.epoch}, {"batches_yielded", pos.batches_yielded}};
    return st;
  }
  void restore(const nn::TrainingState& st) {
    step = st.step;
    model->load_state_dict(st.model);
    const nn::CheckpointPart& o = st.part("optimizer");
    opt->load_state_dict({o.meta, o.tensors});
    sched->load_state_dict(st.part("scheduler").meta);
    const auto& rng = st.part("rng").meta;
    default_generator().manual_seed(rng.at("seed").get<uint64_t>());
    default_generator().set_offset(rng.at("offset").get<uint64_t>());
    const auto& d = st.part("data").meta;
    loader->load_state_dict({d.at("epoch").get<int64_t>(), d.at("batches_yielded").get<int64_t>()});
  }
};

nn::TrainingState small_state(int64_t step) {
  nn::TrainingState st;
  st.step = step;
  st.epoch = step / 10;
  st.model = {{"weight", ops::full({2, 3}, static_cast<double>(step))},
              {"bias", ops::arange(0, 3)}};
  st.parts["optimizer"].tensors = {{"state.0.momentum_buffer", ops::full({2, 3}, 0.5)}};
  st.parts["optimizer"].meta = {{"type", "SGD"}};
  return st;
}

// The byte offset where tensor `key`'s data starts in a safetensors file.
size_t data_offset(const std::string& bytes, const std::string& key) {
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  auto header = nlohmann::json::parse(bytes.substr(8, hlen));
  return 8 + hlen + header.at(key).at("data_offsets")[0].get<size_t>();
}

}  // namespace

TEST_CASE("checkpoint: a resumed run continues bit for bit") {
  TempDir dir;
  const int64_t k = 7, m = 9;  // 5 batches an epoch: k stops mid-epoch 1, m crosses two ends

  Run straight(1);
  straight.train(k);
  nn::CheckpointManager ckpts(dir.path());
  const std::string path = ckpts.save(straight.capture());
  CHECK(fs::path(path).filename() == "ckpt-step000007.safetensors");
  straight.train(m);

  Run resumed(999);  // different initial weights: everything must come from the checkpoint
  auto loaded = ckpts.load_latest();
  REQUIRE(loaded.has_value());
  CHECK(loaded->path == path);
  CHECK(loaded->state.step == k);
  resumed.restore(loaded->state);
  resumed.train(m);

  CHECK(resumed.step == straight.step);
  CHECK(resumed.loader->state_dict().epoch == straight.loader->state_dict().epoch);
  CHECK(resumed.opt->lr() == straight.opt->lr());
  auto a = straight.model->state_dict(), b = resumed.model->state_dict();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    CHECK_MESSAGE(bitwise_equal(a[i].second, b[i].second), a[i].first);
}

TEST_CASE("checkpoint: the file is plain safetensors with the model unprefixed") {
  TempDir dir;
  nn::save_checkpoint(dir / "c.safetensors", small_state(3));
  std::map<std::string, std::string> meta;
  auto tensors = nn::load_safetensors(dir / "c.safetensors", &meta);
  CHECK(tensors.count("weight") == 1);
  CHECK(tensors.count("bias") == 1);
  CHECK(tensors.count("optimizer.state.0.momentum_buffer") == 1);
  CHECK(meta.at("format") == "ddplab-checkpoint");
  auto st = nn::load_checkpoint(dir / "c.safetensors");
  CHECK(st.step == 3);
  CHECK(st.model.size() == 2);
  CHECK(st.part("optimizer").tensors.at(0).first == "state.0.momentum_buffer");
  CHECK(st.part("optimizer").meta.at("type") == "SGD");
  CHECK(contains(error_of([&] { st.part("scaler"); }), "no part 'scaler'"));
  // A plain state dict is not a checkpoint.
  nn::save_safetensors(dir / "plain.safetensors", {{"w", ops::ones({2})}});
  CHECK(contains(error_of([&] { nn::load_checkpoint(dir / "plain.safetensors"); }),
                 "not a training checkpoint"));
  // A model key that would read back as a part is refused at save time.
  auto bad = small_state(1);
  bad.model.emplace_back("optimizer.x", ops::ones({1}));
  CHECK(contains(error_of([&] { nn::save_checkpoint(dir / "bad.safetensors", bad); }),
                 "would be read back as part 'optimizer'"));
}

TEST_CASE("checkpoint: a flipped data byte names the tensor and the file") {
  TempDir dir;
  const std::string path = dir / "c.safetensors";
  nn::save_checkpoint(path, small_state(3));
  std::string bytes = read_all(path);
  bytes[data_offset(bytes, "optimizer.state.0.momentum_buffer") + 5] ^= 0x10;
  write_all(path, bytes);
  std::string err = error_of([&] { nn::load_checkpoint(path); });
  CHECK(contains(err, "optimizer.state.0.momentum_buffer"));
  CHECK(contains(err, "CRC32"));
  CHECK(contains(err, path));
}

TEST_CASE("state_dict file: a CRC32 per tensor; a flipped data byte is refused, by tensor") {
  // nn::save (train --save) records every tensor's checksum; nn::load (train --init-from)
  // verifies them where present, and a file without them (as PyTorch writes it) still loads.
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  manual_seed(3);
  nn::Sequential net{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::BatchNorm2d>(3)};
  nn::save(net, path);
  std::map<std::string, std::string> meta;
  const auto saved = nn::load_safetensors(path, &meta);
  REQUIRE(meta.count("crc32") == 1);
  for (const auto& [name, t] : saved) CHECK(contains(meta["crc32"], "\"" + name + "\""));
  nn::load(net, path);  // intact: loads

  const std::string intact = read_all(path);
  std::string bytes = intact;
  bytes[data_offset(bytes, "0.bias") + 1] ^= 0x01;
  write_all(path, bytes);
  std::string err = error_of([&] { nn::load(net, path); });
  CHECK(contains(err, "tensor '0.bias'"));
  CHECK(contains(err, "checksum"));
  CHECK(contains(err, path));

  // A recorded checksum damaged: refused too.
  bytes = intact;
  const size_t at = bytes.find("\"crc32\"");
  REQUIRE(at != std::string::npos);
  const size_t digit = bytes.find("\\\":", at) + 3;  // the first tensor's recorded CRC32
  bytes[digit] = bytes[digit] == '1' ? '2' : '1';
  write_all(path, bytes);
  CHECK(contains(error_of([&] { nn::load(net, path); }), "checksum"));

  // Written without checksums (PyTorch's save_file writes none): loads, unchecked.
  nn::save_safetensors(path, net.state_dict());
  nn::load(net, path);
}

TEST_CASE("checkpoint: a truncated file or a flipped header byte names the file and offset") {
  TempDir dir;
  const std::string path = dir / "c.safetensors";
  nn::save_checkpoint(path, small_state(3));
  const std::string good = read_all(path);

  write_all(path, good.substr(0, good.size() - 3));
  std::string err = error_of([&] { nn::load_checkpoint(path); });
  CHECK(contains(err, path));
  CHECK(contains(err, "data buffer"));

  write_all(path, good.substr(0, 20));
  err = error_of([&] { nn::load_checkpoint(path); });
  CHECK(contains(err, path));
  CHECK(contains(err, "truncated"));
  CHECK(contains(err, "ends at offset 20"));

  // Byte 8 is the header's opening '{': flipping it breaks the JSON at file offset 8.
  std::string flipped = good;
  flipped[8] ^= 0x01;
  write_all(path, flipped);
  err = error_of([&] { nn::load_checkpoint(path); });
  CHECK(contains(err, path));
  CHECK(contains(err, "file offset 8"));

  // Every single-byte flip of the header is refused, never read as a different checkpoint: the
  // structure checks, the tensors' CRCs and the metadata's own CRC between them catch all. The
  // alignment padding (spaces after the JSON) is skipped: its content does not matter.
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(good[i])) << (8 * i);
  int refused = 0, accepted = 0;
  for (size_t pos = 0; pos < 8 + hlen; ++pos) {
    if (good[pos] == ' ') continue;
    std::string b = good;
    b[pos] ^= 0x04;
    write_all(path, b);
    if (error_of([&] { nn::load_checkpoint(path); }).empty()) {
      ++accepted;
    } else {
      ++refused;
    }
  }
  CHECK(refused > 400);
  CHECK(accepted == 0);
}

TEST_CASE("CheckpointManager: keep-K rotation, latest_valid skips a corrupt newest") {
  TempDir dir;
  nn::CheckpointManager ckpts(dir.path(), /*keep=*/2);
  CHECK_FALSE(ckpts.latest_valid().has_value());  // nothing yet: a fresh start
  for (int64_t s : {10, 20, 30}) ckpts.save(small_state(s));
  auto all = ckpts.list();
  REQUIRE(all.size() == 2);
  CHECK(fs::path(all[0]).filename() == "ckpt-step000020.safetensors");
  CHECK(fs::path(all[1]).filename() == "ckpt-step000030.safetensors");

  // Step 100 sorts after step 30 by number (not by name length or file time).
  ckpts.save(small_state(100));
  CHECK(ckpts.latest_valid() == ckpts.path_for_step(100));

  // Truncate the newest: the one before is used, and why is reported.
  const std::string newest = ckpts.path_for_step(100);
  fs::resize_file(newest, fs::file_size(newest) / 2);
  auto loaded = ckpts.load_latest();
  REQUIRE(loaded.has_value());
  CHECK(loaded->state.step == 30);
  REQUIRE(ckpts.skipped().size() == 1);
  CHECK(contains(ckpts.skipped()[0], newest));
  CHECK(contains(ckpts.skipped()[0], "truncated"));

  // Both corrupt: nothing valid, a fresh start.
  fs::resize_file(ckpts.path_for_step(30), 10);
  CHECK_FALSE(ckpts.latest_valid().has_value());
  CHECK(ckpts.skipped().size() == 2);

  // The best checkpoint is apart from the rolling ones and survives rotation.
  CHECK_FALSE(ckpts.load_best().has_value());
  ckpts.save_best(small_state(20));
  for (int64_t s : {200, 300, 400}) ckpts.save(small_state(s));
  CHECK(ckpts.list().size() == 2);
  auto best = ckpts.load_best();
  REQUIRE(best.has_value());
  CHECK(best->state.step == 20);
}

TEST_CASE("CheckpointManager: stale temporary files are removed at start") {
  TempDir dir;
  write_all(dir / "ckpt-step000005.safetensors.tmp", "half a checkpoint");
  write_all(dir / "best.safetensors.tmp", "x");
  write_all(dir / "notes.txt", "kept");
  nn::CheckpointManager ckpts(dir.path());
  CHECK_FALSE(fs::exists(dir / "ckpt-step000005.safetensors.tmp"));
  CHECK_FALSE(fs::exists(dir / "best.safetensors.tmp"));
  CHECK(fs::exists(dir / "notes.txt"));
  CHECK(ckpts.list().empty());
  CHECK(ckpts.clean_stale() == 0);
}

TEST_CASE("output checks: a missing folder or a path under a file fails at once, by flag") {
  TempDir dir;
  std::string err = error_of([&] { nn::check_output_dir(dir / "missing", "--checkpoint-dir"); });
  CHECK(contains(err, "--checkpoint-dir"));
  CHECK(contains(err, dir / "missing"));
  CHECK(contains(err, "does not exist"));
  nn::check_output_dir(dir.path(), "--checkpoint-dir");

  write_all(dir / "file", "x");
  err = error_of([&] { nn::CheckpointManager bad(dir / "file/sub"); });
  CHECK(contains(err, dir / "file/sub"));
  err = error_of([&] { nn::check_output_dir(dir / "file", "--checkpoint-dir"); });
  CHECK(contains(err, "is not a folder"));
  err = error_of([&] { nn::check_output_file(dir / "nope/model.safetensors", "--save"); });
  CHECK(contains(err, "--save"));
  CHECK(contains(err, dir / "nope"));
  err = error_of([&] { nn::check_output_file(dir.path(), "--save"); });
  CHECK(contains(err, "is a folder"));
  nn::check_output_file(dir / "model.safetensors", "--save");
  CHECK_FALSE(fs::exists(dir / "model.safetensors"));  // the check leaves nothing behind
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("output checks: a read-only folder (chmod 0555)") {
  // root ignores permission bits, so the chmod cannot make the folder unwritable there; the
  // path-under-a-file case above and the full-disk case below cover the errors for root.
  DDP_SKIP_IF(::geteuid() == 0, "running as root: chmod 0555 does not stop root from writing");
  TempDir dir;
  nn::CheckpointManager ckpts(dir.path());
  ckpts.save(small_state(1));
  fs::permissions(dir.path(), fs::perms(0555));
  std::string err = error_of([&] { ckpts.save(small_state(2)); });
  CHECK(contains(err, dir.path()));
  CHECK(contains(err, "Permission denied"));
  err = error_of([&] { nn::check_output_dir(dir.path(), "--checkpoint-dir"); });
  CHECK(contains(err, "--checkpoint-dir"));
  fs::permissions(dir.path(), fs::perms::owner_all, fs::perm_options::add);
  CHECK(ckpts.list().size() == 1);
  CHECK(nn::load_checkpoint(ckpts.path_for_step(1)).step == 1);
}

TEST_CASE("CheckpointManager: a full disk while saving leaves earlier checkpoints, no temp file") {
  TempDir dir;
  nn::CheckpointManager ckpts(dir.path(), /*keep=*/1);
  ckpts.save(small_state(1));
  const std::string before = read_all(ckpts.path_for_step(1));

  // RLIMIT_FSIZE makes write() fail past the limit (EFBIG) as a full disk would (ENOSPC), and
  // works for root too. SIGXFSZ would kill the process instead; ignore it for the test.
  nn::TrainingState big = small_state(2);
  big.model.emplace_back("big", ops::zeros({64 * 1024}));
  struct rlimit old {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string err = error_of([&] { ckpts.save(big); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);

  CHECK(contains(err, ckpts.path_for_step(2)));
  CHECK(contains(err, "File too large"));
  CHECK_FALSE(fs::exists(ckpts.path_for_step(2) + ".tmp"));
  CHECK_FALSE(fs::exists(ckpts.path_for_step(2)));
  CHECK(ckpts.list().size() == 1);  // rotation did not run: step 1 is still there, unchanged
  CHECK(read_all(ckpts.path_for_step(1)) == before);
  CHECK(nn::load_checkpoint(ckpts.path_for_step(1)).step == 1);
}

TEST_CASE("safetensors: save is atomic, a failed save leaves the old file and no temp") {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  nn::save_safetensors(path, {{"w", ops::ones({4})}});
  const std::string before = read_all(path);
  struct rlimit old {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string err = error_of([&] { nn::save_safetensors(path, {{"w", ops::ones({8192})}}); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  CHECK(contains(err, path));
  CHECK(contains(err, "File too large"));
  CHECK(read_all(path) == before);
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("safetensors: a shape whose byte count overflows 64 bits is refused") {
  TempDir dir;
  // 4 * 2^32 * 2^32 bytes wraps to 0, the size the offsets give: without the check, the reader
  // would accept it and allocate an impossible tensor.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_all(dir / "o.safetensors", bytes + header);
  std::string err = error_of([&] { nn::load_safetensors(dir / "o.safetensors"); });
  CHECK(contains(err, "overflows"));
  CHECK(contains(err, dir / "o.safetensors"));
}

TEST_CASE("checkpoint reader fuzz: random and mutated files give ddplab::Error, never a crash") {
  TempDir dir;
  const std::string path = dir / "f.safetensors";
  nn::save_checkpoint(path, small_state(3));
  const std::string good = read_all(path);
  std::mt19937_64 rng(12345);
  auto byte = [&] { return static_cast<char>(rng() & 0xff); };
  int errors = 0, loaded = 0, iterations = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (; iterations < 4000 && std::chrono::steady_clock::now() < deadline; ++iterations) {
    std::string b;
    switch (rng() % 5) {
      case 0:  // random bytes
        b.resize(rng() % 300);
        for (char& c : b) c = byte();
        break;
      case 1:  // a few flipped bytes anywhere
        b = good;
        for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i)
          b[rng() % b.size()] = byte();
        break;
      case 2:  // truncated
        b = good.substr(0, rng() % good.size());
        break;
      case 3: {  // a random header length over a real header
        b = good;
        uint64_t n = rng() >> (rng() % 64);
        for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
        break;
      }
      default: {  // a digit in the header replaced by another (offsets, shapes, CRCs)
        b = good;
        std::vector<size_t> digits;
        for (size_t i = 8; i < b.size() && i < 8 + 2000; ++i)
          if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
        if (!digits.empty()) b[digits[rng() % digits.size()]] = static_cast<char>('0' + rng() % 10);
        break;
      }
    }
    write_all(path, b);
    try {
      nn::load_checkpoint(path);
      ++loaded;
    } catch (const Error&) {
      ++errors;
    }
    // Any other exception type escapes and fails the test case; a crash ends the program.
  }
  CHECK(iterations >= 500);
  CHECK(errors > 0);
  MESSAGE(iterations << " fuzzed files: " << errors << " refused, " << loaded << " loaded");
}
