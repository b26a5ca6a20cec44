// ZeroRedundancyOptimizer (see ddp/zero_redundancy_optimizer.h and Note [ZeRO-1]).
#include "ddp/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "autograd/node.h"
#include "comm/collectives.h"
#include "ddp/ddp.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

// Note [ZeRO-1]
// ~~~~~~~~~~~~~
// What it saves. Training memory per rank is, besides activations: parameters (N elements),
// gradients (N) and optimizer state (K * N: K = 1 for SGD's momentum buffer, 2 for Adam's two
// moments, 3 with amsgrad). Under plain DDP all three are replicated on every rank, and the state
// is the largest part for Adam. Yet the state is only read and written by the update of its own
// parameter, and the update needs nothing from the other parameters. So ZeRO stage 1 gives each
// parameter one owner rank; only the owner keeps the parameter's state and runs its update. The
// state per rank drops from K * N to about K * N / W; parameters and gradients stay replicated
// (ZeRO-2 also shards gradients, ZeRO-3 parameters).
//
// The step, on every rank:
//   1. backward: DDP all-reduces the gradients as usual, so every rank has the whole averaged
//      gradient (it needs only its shard's part; see the cost below);
//   2. the local optimizer, built over this rank's shard only, updates those parameters;
//   3. each rank r broadcasts its shard's new values, so every rank again holds identical
//      parameters for the next forward. Nothing else changes: rounding included, each parameter
//      gets exactly the update plain DDP would give it (the same arithmetic on the same
//      gradient), computed once instead of W times.
//
// What it costs. A ring all-reduce sends about 2 * N * (W - 1) / W elements per rank; the
// broadcasts add N * (W - 1) / W (each rank receives everyone else's shard): 1.5x the traffic
// of plain DDP, and a step cannot end before the last broadcast. The ZeRO paper keeps the
// traffic at 2x by replacing the all-reduce with a reduce-scatter (each rank receives only its
// shard's gradient sum) followed by an all-gather of the parameters, which is what an
// all-reduce does internally anyway; that needs the Reducer to reduce-scatter its buckets along
// shard boundaries (as PyTorch's overlap_with_ddp hooks do), so this class keeps DDP as it is.
// The broadcasts are coalesced per rank (one flat buffer per shard and dtype,
// broadcast_coalesced), W collectives per step rather than one per parameter.
//
// The partition rule (partition_parameters), PyTorch's sorted greedy: within each param group,
// largest parameter first, each goes to the rank holding the fewest elements so far; ties go to
// the lowest rank, and the counts carry over between groups. Sorting first is what makes greedy
// good: placing the big tensors while every rank still has room, then filling the gaps with
// small ones, keeps the largest shard close to N / W whenever no single parameter exceeds it.
// Every rank runs the same rule on the same shapes, so all agree on the owners without talking.
//
// Checkpoints. A plain optimizer's state_dict names its state by flat parameter index
// ("state.<i>.momentum_buffer"). Each local optimizer numbers only its shard, so
// consolidate_state_dict translates local indices back to flat ones and gathers every shard on
// one rank, producing exactly the plain layout: a checkpoint written under ZeRO loads into a
// plain optimizer and the other way round; load_state_dict keeps each rank's own entries. The
// process groups have no gather or point-to-point send, so, as in PyTorch, each rank broadcasts
// its shard in turn and the ranks other than the target drop what they receive.

std::vector<int> partition_parameters(const std::vector<optim::ParamGroup>& groups, int world) {
  DDP_CHECK(world >= 1, "partition_parameters: world size " << world);
  std::vector<int64_t> elements(world, 0);  // elements assigned to each rank so far
  std::vector<int> owner;
  for (const auto& g : groups) {
    const size_t first = owner.size();
    owner.resize(first + g.params.size(), -1);
    std::vector<size_t> order(g.params.size());
    std::iota(order.begin(), order.end(), 0);
    // Stable: equal sizes keep their order, so every rank sorts identically.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return g.params[a].numel() > g.params[b].numel(); });
    for (size_t i : order) {
      const int r = static_cast<int>(std::min_element(elements.begin(), elements.end()) -
                                     elements.begin());  // the first minimum: lowest rank
      owner[first + i] = r;
      elements[r] += g.params[i].numel();
    }
  }
  return owner;
}

namespace {

// The factory's optimizer over all parameters, built only to fill each group's missing options
// with that optimizer's defaults (and to validate them) on every rank alike. It allocates no
// state: the optimizers create theirs at the first step.
std::vector<optim::ParamGroup> with_defaults(std::vector<optim::ParamGroup> groups,
                                             const OptimizerFactory& factory) {
  DDP_CHECK(factory != nullptr, "ZeroRedundancyOptimizer: null optimizer factory");
  return factory(std::move(groups))->param_groups();
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 const OptimizerFactory& factory,
                                                 std::shared_ptr<ProcessGroup> pg)
    : Optimizer(with_defaults(std::move(groups), factory), {}), pg_(std::move(pg)) {
  DDP_CHECK(pg_ != nullptr, "ZeroRedundancyOptimizer: null process group");
  for (const auto& g : groups_) {
    for (const Tensor& p : g.params) {
      DDP_CHECK(p.device() == pg_->device(),
                "ZeroRedundancyOptimizer: a parameter of shape "
                    << shape_str(p.shape()) << " is on " << p.device().str() << ", the "
                    << pg_->backend_name() << " group communicates on " << pg_->device().str());
    }
  }
  owner_ = partition_parameters(groups_, pg_->size());
  // The local optimizer sees the same groups (same options), each cut down to this rank's
  // parameters; a group may be empty here.
  std::vector<optim::ParamGroup> mine;
  size_t flat = 0;
  for (const auto& g : groups_) {
    optim::ParamGroup local({}, g.options);
    for (const Tensor& p : g.params) {
      if (owner_[flat] == pg_->rank()) {
        local.params.push_back(p);
        local_to_flat_.push_back(flat);
      }
      ++flat;
    }
    mine.push_back(std::move(local));
  }
  local_ = factory(std::move(mine));
}

void ZeroRedundancyOptimizer::sync_options_to_local() {
  auto& local_groups = local_->param_groups();
  for (size_t gi = 0; gi < groups_.size(); ++gi) local_groups[gi].options = groups_[gi].options;
}

std::vector<Tensor> ZeroRedundancyOptimizer::shard_params(int r) const {
  std::vector<Tensor> out;
  size_t flat = 0;
  for (const auto& g : groups_) {
    for (const Tensor& p : g.params) {
      if (owner_[flat++] == r) out.push_back(p);
    }
  }
  return out;
}

void ZeroRedundancyOptimizer::step() {
  autograd::NoGradGuard no_grad;
  consolidated_.reset();  // the state moves on; a consolidated copy would be stale
  consolidated_to_ = -1;
  sync_options_to_local();
  local_->step();
  // Every rank takes part in every broadcast, as root of its own shard and receiver of the rest.
  if (pg_->size() > 1) {
    for (int r = 0; r < pg_->size(); ++r) broadcast_coalesced(*pg_, shard_params(r), r);
  }
}

size_t ZeroRedundancyOptimizer::local_state_bytes() const {
  size_t bytes = 0;
  for (const auto& [name, t] : local_->state_dict().tensors) bytes += t.nbytes();
  return bytes;
}

bool ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = pg_->size(), me = pg_->rank();
  DDP_CHECK(to >= 0 && to < world, "consolidate_state_dict: to=" << to << " is not a rank of the "
                                                                 << world << "-rank group");
  sync_options_to_local();
  // This rank's shard, renamed from local to flat indices, and described for the receivers:
  // {"steps": {"<flat>": count}, "tensors": [[name, dtype, shape], ...]}.
  const optim::OptimizerState local = local_->state_dict();
  nlohmann::json mine;
  mine["steps"] = nlohmann::json::object();
  mine["tensors"] = nlohmann::json::array();
  const auto local_steps = local.meta.at("steps").get<std::vector<int64_t>>();
  for (size_t i = 0; i < local_steps.size(); ++i)
    mine["steps"][std::to_string(local_to_flat_[i])] = local_steps[i];
  std::vector<Tensor> my_tensors;
  for (const auto& [name, t] : local.tensors) {
    const auto [i, key] = optim::split_state_name(name);
    const std::string flat_name = "state." + std::to_string(local_to_flat_[i]) + "." + key;
    mine["tensors"].push_back({flat_name, dtype_name(t.dtype()), t.shape()});
    my_tensors.push_back(ops::clone(t));  // a snapshot: the live buffer changes at the next step
  }

  std::vector<int64_t> steps(owner_.size(), 0);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int r = 0; r < world; ++r) {
    const nlohmann::json shard =
        nlohmann::json::parse(broadcast_bytes(*pg_, r == me ? mine.dump() : std::string(), r));
    std::vector<Tensor> received = my_tensors;
    if (r != me) {
      received.clear();
      for (const auto& d : shard["tensors"]) {
        received.push_back(ops::empty(d[2].get<Shape>(),
                                      {dtype_from_name(d[1].get<std::string>()), pg_->device()}));
      }
    }
    if (!received.empty()) broadcast_coalesced(*pg_, received, r);
    if (me != to) continue;
    for (auto it = shard["steps"].begin(); it != shard["steps"].end(); ++it)
      steps.at(std::stoul(it.key())) = it->get<int64_t>();
    // Kept on the CPU: the whole state on one GPU is the very peak ZeRO avoids.
    for (size_t k = 0; k < received.size(); ++k)
      tensors.emplace_back(shard["tensors"][k][0].get<std::string>(), ops::to(received[k], kCPU));
  }
  consolidated_to_ = to;
  consolidated_.reset();
  if (me != to) return false;

  // The layout of the plain optimizer's state_dict (optim/optimizer.cpp): its type, the groups
  // with their options and flat indices, the step counts, the tensors by index then name.
  optim::OptimizerState whole;
  whole.meta["type"] = local_->type_name();
  nlohmann::json groups = nlohmann::json::array();
  size_t flat = 0;
  for (const auto& g : groups_) {
    nlohmann::json jg = g.options;
    std::vector<size_t> ids(g.params.size());
    std::iota(ids.begin(), ids.end(), flat);
    flat += ids.size();
    jg["params"] = ids;
    groups.push_back(jg);
  }
  whole.meta["param_groups"] = groups;
  whole.meta["steps"] = steps;
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return optim::split_state_name(a.first) < optim::split_state_name(b.first);
  });
  whole.tensors = std::move(tensors);
  consolidated_ = std::move(whole);
  return true;
}

optim::OptimizerState ZeroRedundancyOptimizer::state_dict() const {
  const int me = pg_->rank();
  DDP_CHECK(consolidated_to_ >= 0,
            "ZeroRedundancyOptimizer::state_dict() on rank "
                << me << ": each rank holds only its shard of the state; call "
                << "consolidate_state_dict(to) on every rank (again after each step()), then "
                << "state_dict() on rank `to`");
  DDP_CHECK(consolidated_to_ == me, "ZeroRedundancyOptimizer::state_dict() on rank "
                                        << me << ": the state was consolidated on rank "
                                        << consolidated_to_ << "; call state_dict() there");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const optim::OptimizerState& st) {
  // The whole state, checked against the whole parameter list, then cut down to this shard.
  check_state_matches(st, local_->type_name());
  const auto steps = st.meta.value("steps", std::vector<int64_t>(owner_.size(), 0));
  DDP_CHECK(steps.size() == owner_.size(), "load_state_dict: step counts for "
                                               << steps.size() << " parameters, expected "
                                               << owner_.size());
  std::vector<int64_t> flat_to_local(owner_.size(), -1);
  for (size_t i = 0; i < local_to_flat_.size(); ++i)
    flat_to_local[local_to_flat_[i]] = static_cast<int64_t>(i);

  optim::OptimizerState local;
  local.meta["type"] = st.meta["type"];
  local.meta["param_groups"] = nlohmann::json::array();
  size_t next_local = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    nlohmann::json jg = st.meta["param_groups"][gi];
    std::vector<size_t> ids(local_->param_groups()[gi].params.size());
    std::iota(ids.begin(), ids.end(), next_local);
    next_local += ids.size();
    jg["params"] = ids;
    local.meta["param_groups"].push_back(jg);
  }
  std::vector<int64_t> local_steps;
  for (size_t flat : local_to_flat_) local_steps.push_back(steps[flat]);
  local.meta["steps"] = local_steps;
  for (const auto& [name, t] : st.tensors) {
    const auto [i, key] = optim::split_state_name(name);
    DDP_CHECK(i < owner_.size(),
              "load_state_dict: '" << name << "' names parameter " << i << " of " << owner_.size());
    if (flat_to_local[i] >= 0)
      local.tensors.emplace_back("state." + std::to_string(flat_to_local[i]) + "." + key, t);
  }
  local_->load_state_dict(local);
  // The checkpoint's options (lr, momentum, ...) now rule, here as in the local optimizer.
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    groups_[gi].options = local_->param_groups()[gi].options;
  consolidated_.reset();
  consolidated_to_ = -1;
}

}  // namespace ddplab::distributed
