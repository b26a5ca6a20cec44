// DistributedDataParallel: construction checks, the initial broadcast, and forward.
// The gradient side (buckets, hooks, averaging) is the Reducer's: distributed/reducer.cpp.
#include "distributed/ddp.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "autograd/node.h"
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

// Every rank's copy of `local` (variable-length bytes): gather the lengths, then the bytes padded
// to the longest.
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& local) {
  const int w = pg.size();
  std::vector<Tensor> lengths(w);
  for (auto& t : lengths) t = ops::zeros({1}, kInt64);
  pg.all_gather(lengths,
                ops::from_vector<int64_t>({static_cast<int64_t>(local.size())}, {1}, kInt64))
      ->wait();
  int64_t longest = 1;
  for (const auto& t : lengths) longest = std::max(longest, t.item<int64_t>());
  Tensor mine = ops::zeros({longest}, kUInt8);
  std::copy(local.begin(), local.end(), mine.data_ptr<uint8_t>());
  std::vector<Tensor> all(w);
  for (auto& t : all) t = ops::zeros({longest}, kUInt8);
  pg.all_gather(all, mine)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < w; ++r) {
    const auto* p = all[r].data_ptr<uint8_t>();
    out.emplace_back(p, p + lengths[r].item<int64_t>());
  }
  return out;
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

void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root) {
  // Group by dtype (in first-seen order, the same on every rank since the models match).
  std::vector<DType> dtypes;
  for (const Tensor& t : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) {
      dtypes.push_back(t.dtype());
    }
  }
  for (DType dt : dtypes) {
    std::vector<Tensor> group;
    int64_t numel = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dt) continue;
      group.push_back(t);
      numel += t.numel();
    }
    Tensor flat = ops::empty({numel}, group.front().options());
    int64_t offset = 0;
    for (const Tensor& t : group) {
      ops::copy_(ops::view(ops::narrow(flat, 0, offset, t.numel()), t.shape()), t);
      offset += t.numel();
    }
    pg.broadcast(flat, root)->wait();
    offset = 0;
    for (const Tensor& t : group) {
      ops::copy_(t, ops::view(ops::narrow(flat, 0, offset, t.numel()), t.shape()));
      offset += t.numel();
    }
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 DDPOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options) {
  DDP_CHECK(module_ != nullptr, "DistributedDataParallel: null module");
  DDP_CHECK(pg_ != nullptr, "DistributedDataParallel: null process group");
  register_module("module", module_);
  verify_same_model_on_all_ranks();

  // Every replica starts from rank 0's values (whatever each rank initialised).
  std::vector<Tensor> state = module_->parameters();
  for (const Tensor& b : module_->buffers()) state.push_back(b);
  if (pg_->size() > 1 && !state.empty()) broadcast_coalesced(*pg_, state, 0);

  ReducerOptions ro;
  ro.bucket_cap_mb = options.bucket_cap_mb;
  ro.first_bucket_cap_mb = options.first_bucket_cap_mb;
  ro.gradient_as_bucket_view = options.gradient_as_bucket_view;
  reducer_ = std::make_unique<Reducer>(module_->named_parameters(), pg_, ro);
}

void DistributedDataParallel::verify_same_model_on_all_ranks() {
  if (pg_->size() == 1) return;
  // Cheap first: one 8-byte hash per rank. Only on a mismatch exchange the full lists.
  const std::string sig = model_signature(*module_);
  std::vector<Tensor> hashes(pg_->size());
  for (auto& t : hashes) t = ops::zeros({1}, kInt64);
  const auto h = static_cast<int64_t>(fnv1a(sig));
  pg_->all_gather(hashes, ops::from_vector<int64_t>({h}, {1}, kInt64))->wait();
  // Every rank sees the same hashes, so every rank takes the same branch (and joins the same
  // collectives) here.
  bool all_same = true;
  for (const Tensor& t : hashes) all_same = all_same && t.item<int64_t>() == h;
  if (all_same) return;
  const std::vector<std::string> sigs = all_gather_strings(*pg_, sig);
  DDP_FAIL(
      "DistributedDataParallel: the ranks do not hold the same model (parameters and "
      "buffers must match in name, shape and dtype on every rank before rank 0's values "
      "are broadcast). Differences from rank 0:"
      << describe_differences(sigs)
      << "\nBuild the same model with the same arguments on every rank.");
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  // Communication happens only in training forwards (grad mode on) outside no_sync(); an
  // evaluation under NoGradGuard is purely local.
  const bool training_step = autograd::grad_enabled();
  const bool sync = training_step && sync_grads_;
  // Before any communication: a reduction left unfinished would otherwise be silently mixed
  // into this iteration (and its hooks would fire even inside no_sync()).
  if (training_step) reducer_->ensure_prior_reduction_finished();
  if (sync && options_.broadcast_buffers && pg_->size() > 1) {
    const std::vector<Tensor> bufs = module_->buffers();
    if (!bufs.empty()) broadcast_coalesced(*pg_, bufs, 0);
  }
  Tensor out = module_->forward(x);
  if (sync) reducer_->prepare_for_backward({out}, options_.find_unused_parameters);
  return out;
}

}  // namespace ddplab::distributed
