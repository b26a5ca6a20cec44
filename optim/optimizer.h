// Optimizer: the base class of SGD, Adam and AdamW (PyTorch's torch.optim.Optimizer).
//
// An optimizer updates a list of parameter tensors in place from their `.grad`. Parameters come
// in groups, each with its own hyper-parameters (`lr`, `weight_decay`, `momentum`, ...) held in
// a string -> double map as PyTorch's param_group dicts are, so LR schedulers and checkpoints
// handle every optimizer alike. Per-parameter state (momentum buffers, Adam's moments, the step
// count) is indexed by the parameter's position in the flattened group list, as in PyTorch's
// state_dict.
//
// Updates run outside autograd (NoGradGuard) with the in-place kernels of tensor/ops.h (SGD's
// step with momentum on contiguous CPU tensors is one fused loop giving the same bits).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  // Hyper-parameters of this group. Keys missing here are filled from the optimizer's defaults.
  std::map<std::string, double> options;

  ParamGroup() = default;
  ParamGroup(std::vector<Tensor> params, std::map<std::string, double> options = {})  // NOLINT
      : params(std::move(params)), options(std::move(options)) {}
  double& lr() { return options.at("lr"); }
  double get(const std::string& key) const;
  bool has(const std::string& key) const { return options.count(key) != 0; }
};

// What state_dict() returns: JSON-able metadata (param groups, step counts) and named tensors
// ("state.<param index>.<name>", e.g. "state.3.momentum_buffer").
struct OptimizerState {
  nlohmann::json meta;
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// Splits a state tensor name "state.<flat index>.<name>" into {index, name}; throws naming it
// when it has another form.
std::pair<size_t, std::string> split_state_name(const std::string& name);

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without one are skipped).
  virtual void step() = 0;
  virtual std::string type_name() const = 0;
  // Drops (set_to_none, PyTorch 2's default) or zeroes the gradients of all parameters.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group; its missing options come from the defaults.
  void add_param_group(ParamGroup group);
  // The learning rate of group 0 (for logging) / of every group.
  double lr() const { return groups_.at(0).get("lr"); }
  void set_lr(double lr);

  // For an optimizer whose state is sharded across ranks (distributed::ZeroRedundancyOptimizer):
  // gathers it onto rank `to`, a collective every rank calls, after which state_dict() on `to`
  // returns the whole state. Returns whether this rank's state_dict() is then the whole state:
  // always, for an optimizer that keeps all of it (this default, which communicates nothing).
  virtual bool consolidate_state_dict(int to = 0) {
    (void)to;
    return true;
  }
  // Virtual so that a wrapper holding only part of the state (distributed::
  // ZeroRedundancyOptimizer) can answer, and save()/load() go through it.
  virtual OptimizerState state_dict() const;
  // Restores state saved from an optimizer over parameters of the same shapes, in the same order.
  virtual void load_state_dict(const OptimizerState& state);
  // The state as one safetensors file (metadata stored as a JSON string tensor) and back.
  void save(const std::string& path) const;
  void load(const std::string& path);

  // Per-parameter state and step count, by flat index, for inspection (the tests read step_count).
  std::map<std::string, Tensor>& state(size_t flat_index) { return state_.at(flat_index); }
  int64_t step_count(size_t flat_index) const { return steps_.at(flat_index); }

 protected:
  // Calls fn(group, param, flat_index) for every parameter with a defined gradient.
  template <class Fn>
  void for_each_param_with_grad(Fn&& fn) {
    size_t idx = 0;
    for (auto& g : groups_) {
      for (auto& p : g.params) {
        if (p.grad().defined()) fn(g, p, idx);
        ++idx;
      }
    }
  }

  // Throws unless `state` comes from a `type` optimizer with this one's groups and group sizes.
  void check_state_matches(const OptimizerState& state, const std::string& type) const;

  std::map<std::string, double> defaults_;
  std::vector<ParamGroup> groups_;
  std::vector<std::map<std::string, Tensor>> state_;  // per flat parameter index
  std::vector<int64_t> steps_;                        // per flat parameter index

 private:
  size_t num_params() const;
};

}  // namespace ddplab::optim
