// Training checkpoints (see nn/checkpoint.h and docs/checkpoints.md).
//
// The file is plain safetensors; what makes it a checkpoint is one `__metadata__` entry,
// "ddplab_checkpoint", holding a JSON object:
//   {"version": 1, "step": S, "epoch": E, "parts": {name: part meta, ...},
//    "crc32": {tensor key: CRC32 of its bytes, ...}}
// The CRCs catch what the safetensors structure cannot: a flipped bit inside tensor data leaves
// every offset valid, and a resumed run would silently train from a corrupted weight.
#include "nn/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <regex>

#include <fcntl.h>
#include <unistd.h>

#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace ddplab::nn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kMetaKey = "ddplab_checkpoint";
// The CRC32 of the kMetaKey string itself: the tensors' CRCs cannot protect the JSON that holds
// them, nor the part metadata (a flipped letter in a hyper-parameter would otherwise pass).
constexpr const char* kMetaCrcKey = "ddplab_checkpoint_crc32";
constexpr int kVersion = 1;

bool is_rolling_name(const std::string& name, int64_t* step) {
  static const std::regex re(R"(ckpt-step(\d{1,18})\.safetensors)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  *step = std::stoll(m[1].str());
  return true;
}

}  // namespace

const CheckpointPart& TrainingState::part(const std::string& name) const {
  auto it = parts.find(name);
  if (it != parts.end()) return it->second;
  std::string have;
  for (const auto& [n, p] : parts) have += (have.empty() ? "" : ", ") + n;
  DDP_FAIL("checkpoint has no part '" << name << "' (it holds: " << (have.empty() ? "none" : have)
                                      << ")");
}

void save_checkpoint(const std::string& path, const TrainingState& state) {
  std::vector<std::pair<std::string, Tensor>> tensors(state.model.begin(), state.model.end());
  json parts = json::object();
  for (const auto& [name, part] : state.parts) {
    DDP_CHECK(!name.empty() && name.find('.') == std::string::npos,
              "save_checkpoint(" << path << "): part name '" << name
                                 << "' must be non-empty and without '.'");
    for (const auto& [key, t] : state.model) {
      DDP_CHECK(key.rfind(name + ".", 0) != 0,
                "save_checkpoint(" << path << "): model key '" << key
                                   << "' would be read back as part '" << name << "'");
    }
    parts[name] = part.meta;
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): once per tensor per save
    for (const auto& [key, t] : part.tensors) tensors.emplace_back(name + "." + key, t);
  }
  json crcs = json::object();
  for (const auto& [key, t] : tensors) {
    DDP_CHECK(t.defined(), "save_checkpoint(" << path << "): tensor '" << key << "' is undefined");
    crcs[key] = tensor_crc32(t);
  }
  json meta = {{"version", kVersion},
               {"step", state.step},
               {"epoch", state.epoch},
               {"parts", parts},
               {"crc32", crcs}};
  const std::string text = meta.dump();
  save_safetensors(path, tensors,
                   {{"format", "ddplab-checkpoint"},
                    {kMetaKey, text},
                    {kMetaCrcKey, std::to_string(bytes_crc32(text.data(), text.size()))}});
}

TrainingState load_checkpoint(const std::string& path) {
  std::map<std::string, std::string> strings;
  std::map<std::string, Tensor> tensors = load_safetensors(path, &strings);
  const std::string where = "checkpoint '" + path + "': ";
  auto it = strings.find(kMetaKey);
  DDP_CHECK(it != strings.end(), where << "no '" << kMetaKey << "' in __metadata__ (a plain "
                                       << "state dict, not a training checkpoint?)");
  auto fmt = strings.find("format");
  DDP_CHECK(fmt != strings.end() && fmt->second == "ddplab-checkpoint",
            where << "__metadata__ 'format' is not 'ddplab-checkpoint'");
  auto mcrc = strings.find(kMetaCrcKey);
  const std::string actual_crc = std::to_string(bytes_crc32(it->second.data(), it->second.size()));
  DDP_CHECK(mcrc != strings.end() && mcrc->second == actual_crc,
            where << "the '" << kMetaKey << "' metadata fails its CRC32 check (recorded "
                  << (mcrc == strings.end() ? std::string("none") : mcrc->second) << ", text gives "
                  << actual_crc << "): the header is corrupt");
  TrainingState st;
  json meta, crcs;
  try {
    meta = json::parse(it->second);
    DDP_CHECK(meta.is_object() && meta.value("version", 0) == kVersion,
              where << "unsupported checkpoint version (this reader knows " << kVersion << ")");
    st.step = meta.at("step").get<int64_t>();
    st.epoch = meta.at("epoch").get<int64_t>();
    crcs = meta.at("crc32");
    DDP_CHECK(crcs.is_object() && meta.at("parts").is_object(),
              where << "'crc32' and 'parts' must be objects");
    for (const auto& [name, pmeta] : meta.at("parts").items()) st.parts[name].meta = pmeta;
  } catch (const json::exception& e) {
    DDP_FAIL(where << "bad '" << kMetaKey << "' metadata: " << e.what());
  }

  for (const auto& [key, t] : tensors) {
    check_tensor_crc32(crcs, key, t, where);
    // "<part>.<name>" belongs to a part the metadata lists; anything else is the model's.
    const size_t dot = key.find('.');
    auto p = dot == std::string::npos ? st.parts.end() : st.parts.find(key.substr(0, dot));
    if (p != st.parts.end()) {
      p->second.tensors.emplace_back(key.substr(dot + 1), t);
    } else {
      st.model.emplace_back(key, t);
    }
  }
  DDP_CHECK(crcs.size() == tensors.size(), where << "the metadata lists " << crcs.size()
                                                 << " tensors, the file holds " << tensors.size());
  return st;
}

// --- CheckpointManager -----------------------------------------------------------------------

CheckpointManager::CheckpointManager(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(keep) {
  DDP_CHECK(keep >= 1, "CheckpointManager: keep must be at least 1, got " << keep);
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  check_output_dir(dir_, "checkpoint folder", /*create=*/true);
  clean_stale();
}

std::string CheckpointManager::path_for_step(int64_t step) const {
  DDP_CHECK(step >= 0, "CheckpointManager: negative step " << step);
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-step%06" PRId64 ".safetensors", step);
  return dir_ + "/" + name;
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    int64_t step = 0;
    if (is_rolling_name(entry.path().filename().string(), &step))
      found.emplace_back(step, entry.path().string());
  }
  DDP_CHECK(!ec, "CheckpointManager: cannot list '" << dir_ << "': " << ec.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

int CheckpointManager::clean_stale() {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        entry.is_regular_file()) {
      if (fs::remove(entry.path(), ec)) ++removed;
    }
  }
  return removed;
}

std::string CheckpointManager::save(const TrainingState& state) {
  std::string path = path_for_step(state.step);
  save_checkpoint(path, state);
  // Rotation only after the new checkpoint is durable: a crash in between leaves one extra.
  std::vector<std::string> all = list();
  bool removed = false;
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) {
    if (all[i] == path) continue;
    removed |= std::remove(all[i].c_str()) == 0;
  }
  if (removed) fsync_parent_dir(path);
  return path;
}

std::string CheckpointManager::save_best(const TrainingState& state) {
  save_checkpoint(best_path(), state);
  return best_path();
}

std::optional<CheckpointManager::Loaded> CheckpointManager::load_latest() {
  skipped_.clear();
  std::vector<std::string> all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return Loaded{*it, load_checkpoint(*it)};
    } catch (const Error& e) {
      skipped_.push_back(*it + ": " + e.what());
      std::cerr << "[checkpoint] skipping " << *it << ": " << e.what() << "\n";
    }
  }
  return std::nullopt;
}

std::optional<std::string> CheckpointManager::latest_valid() {
  auto loaded = load_latest();
  if (!loaded) return std::nullopt;
  return loaded->path;
}

std::optional<CheckpointManager::Loaded> CheckpointManager::load_best() {
  skipped_.clear();
  std::error_code ec;
  if (!fs::exists(best_path(), ec)) return std::nullopt;
  return Loaded{best_path(), load_checkpoint(best_path())};
}

// --- output path checks ----------------------------------------------------------------------

void check_output_dir(const std::string& path, const std::string& what, bool create) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    DDP_CHECK(create, what << ": folder '" << path << "' does not exist");
    // One level only: a typo in a parent folder should be an error, not a new tree.
    fs::create_directory(path, ec);
    DDP_CHECK(!ec, what << ": cannot create folder '" << path << "': " << ec.message());
  }
  DDP_CHECK(fs::is_directory(path, ec), what << ": '" << path << "' is not a folder");
  // Permission bits do not tell (root ignores them; a read-only mount has writable bits), so
  // try what saving will do: create a file there.
  const std::string probe = path + "/.ddplab-write-check-" + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0,
            what << ": cannot create files in folder '" << path << "': " << std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  DDP_CHECK(!fs::is_directory(path, ec), what << ": '" << path << "' is a folder, not a file");
  const std::string parent = fs::path(path).parent_path().string();
  check_output_dir(parent.empty() ? "." : parent, what, /*create=*/false);
}

}  // namespace ddplab::nn
