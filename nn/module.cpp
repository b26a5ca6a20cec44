// nn::Module: registration, dotted names, modes, placement and state_dict (see nn/module.h).
#include "nn/module.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "autograd/node.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace ddplab::nn {

namespace {

// Makes `dst` view `src`'s memory: every handle to dst's TensorImpl sees the new data. This is
// how a module moves or converts its tensors without invalidating references held elsewhere.
void set_data(const Tensor& dst, const Tensor& src) {
  TensorImpl& d = dst.impl();
  const TensorImpl& s = src.impl();
  d.storage = s.storage;
  d.offset = s.offset;
  d.shape = s.shape;
  d.strides = s.strides;
  d.dtype = s.dtype;
}

void check_name(const std::string& name, const char* what) {
  DDP_CHECK(!name.empty() && name.find('.') == std::string::npos,
            what << ": name '" << name << "' must be non-empty and contain no '.'");
}

template <class Entries>
bool has_name(const Entries& entries, const std::string& name) {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const auto& e) { return e.first == name; });
}

}  // namespace

Tensor Module::forward(const Tensor& /*x*/) {
  DDP_FAIL(type_name() << " has no forward(const Tensor&): call its own methods instead");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_name(name, "register_parameter");
  DDP_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
            "register_parameter: '" << name << "' is already registered in " << type_name());
  if (!t.defined()) return t;
  DDP_CHECK(is_floating(t.dtype()), "register_parameter('" << name << "'): parameters must be "
                                                           << "floating point, got "
                                                           << dtype_name(t.dtype()));
  t.set_requires_grad(requires_grad);
  parameters_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name, "register_buffer");
  DDP_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
            "register_buffer: '" << name << "' is already registered in " << type_name());
  if (!t.defined()) return t;
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m, MemberBinder bind) {
  check_name(name, "register_module");
  DDP_CHECK(m != nullptr, "register_module('" << name << "'): null module");
  DDP_CHECK(!has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
            "register_module: '" << name << "' is already registered in " << type_name());
  children_.emplace_back(name, std::move(m));
  if (bind) member_binders_[name] = std::move(bind);
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> m) {
  DDP_CHECK(m != nullptr, "replace_module('" << name << "'): null module");
  auto entry = std::find_if(children_.begin(), children_.end(),
                            [&](const auto& e) { return e.first == name; });
  DDP_CHECK(entry != children_.end(),
            "replace_module: " << type_name() << " has no child '" << name << "'");
  // The member first: if its type cannot hold the replacement, nothing has changed yet.
  auto binder = member_binders_.find(name);
  if (binder != member_binders_.end()) {
    DDP_CHECK(binder->second(m), "replace_module('" << name << "'): the member of " << type_name()
                                                    << " that holds '" << name << "' cannot hold a "
                                                    << m->type_name());
  }
  entry->second = std::move(m);
}

void Module::collect(const std::string& prefix, bool recurse, bool params,
                     NamedTensors& out) const {
  for (const auto& [name, t] : params ? parameters_ : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, m] : children_) m->collect(prefix + name + ".", true, params, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, true, out);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back("", shared_from_this());
  for (const auto& [name, m] : children_) {
    for (auto& [sub, sm] : m->named_modules()) {
      out.emplace_back(sub.empty() ? name : std::string(name).append(".").append(sub), sm);
    }
  }
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, m] : children_) m->apply(fn);
  fn(*this);
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  for (const auto& [n, m] : children_) {
    if (n == name) return m;
  }
  return nullptr;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, m] : children_) m->train(on);
}

void Module::to(Device device) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& t : parameters()) {
    if (t.device() != device) set_data(t, ops::to(t, device));
    Tensor g = t.grad();
    if (g.defined() && g.device() != device) set_data(g, ops::to(g, device));
  }
  for (const Tensor& t : buffers()) {
    if (t.device() != device) set_data(t, ops::to(t, device));
  }
}

void Module::to(DType dtype) {
  autograd::NoGradGuard no_grad;
  DDP_CHECK(is_floating(dtype), "Module::to: only floating dtypes, got " << dtype_name(dtype));
  for (const Tensor& t : parameters()) {
    if (t.dtype() != dtype) set_data(t, ops::to(t, dtype));
    Tensor g = t.grad();
    if (g.defined() && g.dtype() != dtype) set_data(g, ops::to(g, dtype));
  }
  // Integer buffers (num_batches_tracked) keep their type, as in PyTorch.
  for (const Tensor& t : buffers()) {
    if (is_floating(t.dtype()) && t.dtype() != dtype) set_data(t, ops::to(t, dtype));
  }
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      ops::zero_(g);
    }
  }
}

StateDict Module::state_dict() const {
  // PyTorch's order: a module's parameters, then its buffers, then each child's entries.
  StateDict out;
  struct Walk {
    static void run(const Module& m, const std::string& prefix, StateDict& out) {
      for (const auto& [n, t] : m.parameters_) out.emplace_back(prefix + n, t.detach());
      for (const auto& [n, t] : m.buffers_) out.emplace_back(prefix + n, t.detach());
      for (const auto& [n, c] : m.children_) run(*c, prefix + n + ".", out);
    }
  };
  Walk::run(*this, "", out);
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : state) m[n] = t;
  load_state_dict(m, strict);
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  StateDict mine = state_dict();
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> known;
  for (const auto& [name, t] : mine) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != t.shape()) {
      mismatched.push_back(name + " (checkpoint " + shape_str(it->second.shape()) + ", model " +
                           shape_str(t.shape()) + ")");
    }
  }
  for (const auto& [name, t] : state) {
    if (!known.count(name)) unexpected.push_back(name);
  }
  // Report everything at once: fixing a checkpoint one key per run is miserable.
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::ostringstream os;
    os << "load_state_dict: error(s) loading state_dict for " << type_name() << ":";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      os << "\n  " << what << " (" << keys.size() << "):";
      for (const auto& k : keys) os << " " << k << ";";
    };
    if (strict) list("missing keys", missing);
    if (strict) list("unexpected keys", unexpected);
    list("size mismatch", mismatched);
    if (!unexpected.empty() && unexpected.front().rfind("module.", 0) == 0) {
      os << "\n  (keys start with 'module.': the checkpoint was saved from a DDP wrapper; save "
            "the inner module, or strip the prefix)";
    }
    throw Error(os.str());
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    if (it != state.end()) ops::copy_(t, it->second);
  }
}

std::string Module::repr() const {
  std::ostringstream os;
  repr_into(os, 0);
  return os.str();
}

void Module::repr_into(std::ostream& os, int indent) const {
  os << type_name() << "(" << extra_repr();
  if (children_.empty()) {
    os << ")";
    return;
  }
  os << "\n";
  for (const auto& [name, m] : children_) {
    os << std::string(indent + 2, ' ') << "(" << name << "): ";
    m->repr_into(os, indent + 2);
    os << "\n";
  }
  os << std::string(indent, ' ') << ")";
}

// A state_dict file records a CRC32 of every tensor's bytes in its metadata, as the checkpoints
// do (nn/checkpoint.cpp): "crc32" holds the JSON object {name: CRC32}. A flipped bit inside a
// weight leaves a valid safetensors file behind, and a run started from it would train on the
// corrupted value without a word; with the checksums, `load` refuses it and names the tensor.
// Files without the entry (PyTorch's `safetensors.torch.save_file` writes none) load unchecked.
constexpr const char* kCrcKey = "crc32";

void save(const Module& module, const std::string& path) {
  const NamedTensors state = module.state_dict();
  nlohmann::json crcs = nlohmann::json::object();
  for (const auto& [name, t] : state) crcs[name] = tensor_crc32(t);
  save_safetensors(path, state, {{"format", "ddplab-state-dict"}, {kCrcKey, crcs.dump()}});
}

namespace {

// Checks `tensors` against the checksums in the file's metadata, when it has them.
void verify_crc32(const std::map<std::string, Tensor>& tensors,
                  const std::map<std::string, std::string>& metadata, const std::string& path) {
  auto it = metadata.find(kCrcKey);
  if (it == metadata.end()) return;
  const std::string where = "'" + path + "': ";
  nlohmann::json crcs;
  try {
    crcs = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    DDP_FAIL(where << "the '" << kCrcKey << "' metadata (the tensors' checksums) is not valid "
                   << "JSON: the header is corrupt (" << e.what() << ")");
  }
  DDP_CHECK(crcs.is_object() && crcs.size() == tensors.size(),
            where << "the '" << kCrcKey << "' metadata lists "
                  << (crcs.is_object() ? crcs.size() : 0) << " tensor checksums, the file holds "
                  << tensors.size() << " tensors: the header is corrupt");
  for (const auto& [name, t] : tensors) check_tensor_crc32(crcs, name, t, where);
}

}  // namespace

void load(Module& module, const std::string& path, bool strict) {
  try {
    std::map<std::string, std::string> metadata;
    std::map<std::string, Tensor> tensors = load_safetensors(path, &metadata);
    verify_crc32(tensors, metadata, path);
    module.load_state_dict(tensors, strict);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "\n  (while loading '" + path + "')");
  }
}

}  // namespace ddplab::nn
