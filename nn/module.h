// nn::Module: the base class of layers and models (PyTorch's torch.nn.Module).
//
// A module owns named parameters (tensors that require gradients), named buffers (state that is
// saved but not trained, e.g. BatchNorm's running statistics) and named submodules. Names
// compose with dots exactly as in PyTorch (`layer1.0.conv1.weight`), so a ddplab state_dict and
// a torchvision state_dict use the same keys.
//
// Layers keep their parameters as `Tensor` handle members (`weight`, `bias`) that alias the
// registered tensors. `to(device)` and `load_state_dict()` therefore never swap a tensor for a
// new one: they rewrite its storage in place (like PyTorch's `param.data = ...`), so handles held
// by the layer, by an optimizer or by DDP's reducer stay valid.
//
// Modules are always held by std::shared_ptr (`std::make_shared<Linear>(...)`).
//
// Children and the members that point at them. A model keeps typed members for its children so
// that forward() reads naturally (`(*bn1)(x)`). Registering with the member itself,
//
//   register_module("bn1", bn1, std::make_shared<BatchNorm2d>(planes));
//
// binds the two: the registry remembers where `bn1` lives, and replace_module("bn1", other)
// re-points the member as well as the registry entry. That is how convert_sync_batchnorm swaps a
// BatchNorm2d inside a ResNet block for a SyncBatchNorm and the block's forward uses it. (The
// form `bn1 = register_module("bn1", m)` also works, but the registry cannot see that copy, so a
// later replacement would leave `bn1` pointing at the old module.)
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::nn {

// Ordered (name, tensor) pairs: the order of registration, as PyTorch's OrderedDict.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = NamedTensors;

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The default throws: containers without a single-input forward override it.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // The class name shown by repr() ("Linear", "BasicBlock").
  virtual std::string type_name() const { return "Module"; }
  // Constructor arguments shown by repr(), e.g. "in_features=4, out_features=2, bias=true".
  virtual std::string extra_repr() const { return ""; }
  // Whether this module's own forward or backward runs collectives across ranks in training
  // (SyncBatchNorm: its statistics). A rank that has run out of data under DDP's Join must then
  // replay whole iterations to match them, not only the gradient all-reduces (Note [Join] in
  // comm/join.cpp). Asked of each module, its children answer for themselves.
  virtual bool runs_collectives() const { return false; }
  // A PyTorch-style multi-line description of the module tree.
  std::string repr() const;

  // --- registration --------------------------------------------------------------------------
  // Registers `t` under `name` and returns it (a handle to the same tensor). An undefined tensor
  // registers nothing (PyTorch's `register_parameter(name, None)`, e.g. a bias-free conv).
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m, nullptr);
    return m;
  }
  // Registers `m` and points `member` (a data member of this module) at it, bound: see the file
  // comment. `member` may have a base type of M (e.g. a ModulePtr for an optional child).
  template <class Base, class M>
  void register_module(const std::string& name, std::shared_ptr<Base>& member,
                       std::shared_ptr<M> m) {
    member = m;
    add_child(name, std::move(m), [&member](const std::shared_ptr<Module>& replacement) {
      auto typed = std::dynamic_pointer_cast<Base>(replacement);
      if (typed) member = typed;
      return typed != nullptr;
    });
  }
  // Makes `m` the child `name` in place of the current one (same position, same dotted names),
  // re-pointing a bound member too; returns `m` (libtorch's replace_module). Throws, changing
  // nothing, when a bound member cannot hold `m`'s type.
  template <class M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> m) {
    replace_child(name, m);
    return m;
  }

  // --- introspection (recurse=false: this module's own entries only) -------------------------
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // This module ("" prefix) and every descendant, pre-order, with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  // Calls fn on every descendant, then on this module (PyTorch's `apply`, e.g. for custom
  // init). Usable inside a constructor, unlike named_modules() which needs a shared_ptr.
  void apply(const std::function<void(Module&)>& fn);
  // The child registered as `name` (one level), or null.
  std::shared_ptr<Module> child(const std::string& name) const;
  // Total number of parameter elements.
  int64_t num_parameters() const;

  // --- mode and placement ---------------------------------------------------------------------
  // Sets training mode on this module and every descendant (affects BatchNorm, Dropout).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter, gradient and buffer to `device`, in place (see the file comment).
  void to(Device device);
  // Converts floating parameters and buffers to `dtype`, in place (integer buffers are kept).
  void to(DType dtype);
  // Drops (set_to_none, PyTorch 2's default) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);

  // --- checkpoints ---------------------------------------------------------------------------
  // Parameters and buffers, module by module (own entries, then children), as PyTorch orders
  // them. The tensors share storage with the module (detached from autograd).
  StateDict state_dict() const;
  // Copies `state` into the module's tensors in place (converting dtype and device). With
  // `strict`, missing keys, unexpected keys and shape mismatches are all collected and reported
  // in one error; without it, only shape mismatches of present keys are errors.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  void load_state_dict(const StateDict& state, bool strict = true);

 protected:
  // Re-points a bound member at a replacement child; false (and no change) when the member's
  // type cannot hold it.
  using MemberBinder = std::function<bool(const std::shared_ptr<Module>&)>;
  void add_child(const std::string& name, std::shared_ptr<Module> m, MemberBinder bind = nullptr);
  void replace_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out) const;
  void repr_into(std::ostream& os, int indent) const;

  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::map<std::string, MemberBinder> member_binders_;  // children registered with their member
};

using ModulePtr = std::shared_ptr<Module>;

// state_dict <-> safetensors file (names as keys). `load` is strict by default.
void save(const Module& module, const std::string& path);
void load(Module& module, const std::string& path, bool strict = true);

}  // namespace ddplab::nn
