// The construction check of DistributedDataParallel: every rank must hold the same model.
#include "ddp/model_check.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "comm/collectives.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

namespace {

// One line per parameter and buffer: "param fc.weight [4, 8] float32". Equal text on every rank
// means the same model layout.
std::string model_signature(const nn::Module& m) {
  std::ostringstream os;
  for (const auto& [name, t] : m.named_parameters()) {
    os << "param " << name << " " << shape_str(t.shape()) << " " << dtype_name(t.dtype()) << "\n";
  }
  for (const auto& [name, t] : m.named_buffers()) {
    os << "buffer " << name << " " << shape_str(t.shape()) << " " << dtype_name(t.dtype()) << "\n";
  }
  return os.str();
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// "param fc.weight" -> "[4, 8] float32", in order.
std::vector<std::pair<std::string, std::string>> parse_signature(const std::string& sig) {
  std::vector<std::pair<std::string, std::string>> entries;
  std::istringstream is(sig);
  std::string line;
  while (std::getline(is, line)) {
    const size_t kind_end = line.find(' ');
    const size_t name_end = line.find(' ', kind_end + 1);
    entries.emplace_back(line.substr(0, name_end), line.substr(name_end + 1));
  }
  return entries;
}

// The differences of each rank's model from rank 0's, one line each.
std::string describe_differences(const std::vector<std::string>& sigs) {
  std::ostringstream os;
  const auto ref = parse_signature(sigs[0]);
  const std::map<std::string, std::string> ref_map(ref.begin(), ref.end());
  for (size_t r = 1; r < sigs.size(); ++r) {
    if (sigs[r] == sigs[0]) continue;
    const auto mine = parse_signature(sigs[r]);
    const std::map<std::string, std::string> mine_map(mine.begin(), mine.end());
    bool any = false;
    for (const auto& [key, what] : mine) {
      auto it = ref_map.find(key);
      if (it == ref_map.end()) {
        os << "\n  rank " << r << " has " << key << " " << what << ", which rank 0 lacks";
        any = true;
      } else if (it->second != what) {
        os << "\n  " << key << ": rank " << r << " has " << what << ", rank 0 has " << it->second;
        any = true;
      }
    }
    for (const auto& [key, what] : ref) {
      if (!mine_map.count(key)) {
        os << "\n  rank " << r << " lacks " << key << " " << what << ", which rank 0 has";
        any = true;
      }
    }
    if (!any) os << "\n  rank " << r << " has the same entries as rank 0 in a different order";
  }
  return os.str();
}

}  // namespace

void verify_same_model_on_all_ranks(const nn::Module& module, ProcessGroup& pg) {
  if (pg.size() == 1) return;
  // Cheap first: one 8-byte hash per rank. Only on a mismatch exchange the full lists.
  const std::string sig = model_signature(module);
  const auto h = static_cast<int64_t>(fnv1a(sig));
  // Every rank sees the same hashes, so every rank takes the same branch (and joins the same
  // collectives) here.
  bool all_same = true;
  for (const auto& v : all_gather_values(pg, {h})) all_same = all_same && v.at(0) == h;
  if (all_same) return;
  const std::vector<std::string> sigs = all_gather_strings(pg, sig);
  DDP_FAIL(
      "DistributedDataParallel: the ranks do not hold the same model (parameters and "
      "buffers must match in name, shape and dtype on every rank before rank 0's values "
      "are broadcast). Differences from rank 0:"
      << describe_differences(sigs)
      << "\nBuild the same model with the same arguments on every rank.");
}

}  // namespace ddplab::distributed
