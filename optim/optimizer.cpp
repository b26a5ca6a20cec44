// Optimizer base: param groups, zero_grad and state_dict (see optim/optimizer.h).
#include "optim/optimizer.h"

#include <cstring>

#include "autograd/node.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace ddplab::optim {

double ParamGroup::get(const std::string& key) const {
  auto it = options.find(key);
  DDP_CHECK(it != options.end(), "param group has no option '" << key << "'");
  return it->second;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults)
    : defaults_(std::move(defaults)) {
  DDP_CHECK(!groups.empty(), "optimizer got an empty parameter list");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  for (const auto& [k, v] : defaults_) group.options.emplace(k, v);  // keeps explicit values
  DDP_CHECK(group.get("lr") >= 0, "invalid learning rate " << group.get("lr"));
  for (const Tensor& p : group.params) {
    DDP_CHECK(p.defined(), "optimizer: undefined tensor in a parameter group");
    DDP_CHECK(p.is_leaf(), "optimizer: can only optimize leaf tensors (parameters)");
  }
  state_.resize(state_.size() + group.params.size());
  steps_.resize(steps_.size() + group.params.size(), 0);
  groups_.push_back(std::move(group));
}

size_t Optimizer::num_params() const {
  size_t n = 0;
  for (const auto& g : groups_) n += g.params.size();
  return n;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        ops::zero_(grad);
      }
    }
  }
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.options["lr"] = lr;
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState out;
  out.meta["type"] = type_name();
  nlohmann::json groups = nlohmann::json::array();
  size_t idx = 0;
  for (const auto& g : groups_) {
    nlohmann::json jg = g.options;
    std::vector<size_t> ids;
    for (size_t i = 0; i < g.params.size(); ++i) ids.push_back(idx++);
    jg["params"] = ids;
    groups.push_back(jg);
  }
  out.meta["param_groups"] = groups;
  out.meta["steps"] = steps_;
  for (size_t i = 0; i < state_.size(); ++i) {
    for (const auto& [name, t] : state_[i]) {
      out.tensors.emplace_back("state." + std::to_string(i) + "." + name, t.detach());
    }
  }
  return out;
}

std::pair<size_t, std::string> split_state_name(const std::string& name) {
  const size_t dot = name.find('.', 6);
  const bool digits =
      dot != std::string::npos && dot > 6 && name.find_first_not_of("0123456789", 6) == dot;
  DDP_CHECK(name.rfind("state.", 0) == 0 && digits, "load_state_dict: unexpected tensor name '"
                                                        << name
                                                        << "' (expected state.<index>.<name>)");
  return {std::stoul(name.substr(6, dot - 6)), name.substr(dot + 1)};
}

void Optimizer::check_state_matches(const OptimizerState& st, const std::string& type) const {
  const auto& meta = st.meta;
  DDP_CHECK(meta.value("type", std::string()) == type, "load_state_dict: state is from a "
                                                           << meta.value("type", std::string("?"))
                                                           << " optimizer, this is " << type);
  DDP_CHECK(meta.contains("param_groups") && meta["param_groups"].size() == groups_.size(),
            "load_state_dict: state has " << meta["param_groups"].size()
                                          << " param groups, optimizer has " << groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& jg = meta["param_groups"][gi];
    DDP_CHECK(jg["params"].size() == groups_[gi].params.size(),
              "load_state_dict: group " << gi << " has " << jg["params"].size()
                                        << " parameters in the state, " << groups_[gi].params.size()
                                        << " in the optimizer");
  }
}

void Optimizer::load_state_dict(const OptimizerState& st) {
  const auto& meta = st.meta;
  check_state_matches(st, type_name());
  std::vector<std::map<std::string, Tensor>> state(num_params());
  std::vector<const Tensor*> flat;
  for (const auto& g : groups_) {
    for (const auto& p : g.params) flat.push_back(&p);
  }
  for (const auto& [name, t] : st.tensors) {
    const auto [i, key] = split_state_name(name);
    DDP_CHECK(i < flat.size(),
              "load_state_dict: '" << name << "' names parameter " << i << " of " << flat.size());
    const Tensor& p = *flat[i];
    DDP_CHECK(t.shape() == p.shape(), "load_state_dict: '"
                                          << name << "' has shape " << shape_str(t.shape())
                                          << ", parameter has " << shape_str(p.shape()));
    // State lives where (and in the type) the parameter does.
    Tensor c = ops::clone(ops::to(ops::to(t, p.dtype()), p.device()));
    state[i][key] = c;
  }
  // Options (lr, momentum, ...) come from the checkpoint, as PyTorch does.
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (auto it = meta["param_groups"][gi].begin(); it != meta["param_groups"][gi].end(); ++it) {
      if (it.key() != "params" && it->is_number())
        groups_[gi].options[it.key()] = it->get<double>();
    }
  }
  state_ = std::move(state);
  steps_ = meta.value("steps", std::vector<int64_t>(num_params(), 0));
  DDP_CHECK(steps_.size() == num_params(), "load_state_dict: step counts for "
                                               << steps_.size() << " parameters, expected "
                                               << num_params());
}

void Optimizer::save(const std::string& path) const {
  OptimizerState st = state_dict();
  std::string meta = st.meta.dump();
  // load_safetensors returns tensors only, so the metadata travels as a uint8 tensor.
  Tensor m = ops::empty({static_cast<int64_t>(meta.size())}, kUInt8);
  if (!meta.empty()) std::memcpy(m.raw_data(), meta.data(), meta.size());
  auto tensors = st.tensors;
  tensors.emplace_back("__optimizer_meta__", m);
  nn::save_safetensors(path, tensors, {{"format", "ddplab-optimizer"}});
}

void Optimizer::load(const std::string& path) {
  auto tensors = nn::load_safetensors(path);
  auto it = tensors.find("__optimizer_meta__");
  DDP_CHECK(it != tensors.end(), "Optimizer::load(" << path << "): not an optimizer checkpoint "
                                                    << "(no __optimizer_meta__)");
  OptimizerState st;
  const Tensor& m = it->second;
  st.meta = nlohmann::json::parse(
      std::string(static_cast<const char*>(m.raw_data()), static_cast<size_t>(m.numel())));
  for (const auto& [name, t] : tensors) {
    if (name != "__optimizer_meta__") st.tensors.emplace_back(name, t);
  }
  load_state_dict(st);
}

}  // namespace ddplab::optim
