// Join: training with uneven inputs, PyTorch's torch.distributed.algorithms.Join.
//
// Every DDP iteration is a sequence of collectives that all ranks must issue together. When the
// ranks hold different numbers of batches, the one that runs out first would leave the others
// waiting in their next all-reduce forever. Inside a Join, a rank that has run out "joins": until
// every rank is done it keeps issuing the collectives of an iteration with neutral inputs
// (zero gradients), so the others finish their batches, and then all ranks leave together.
//
//   distributed::Join join({ddp.get()});        // enable=true, throw_on_early_termination=false
//   for (auto& batch : loader) { ...forward, backward, step... }
//   join.join();   // this rank is out of data: shadow the others (the destructor does it too)
//
// Joinable is the interface a participant implements (DDP does, ddp/ddp.h; so does
// optim::GradScaler, listed after the model: Join({ddp.get(), &scaler})); its
// JoinHook says what one shadowed iteration is. How it works, and what the gradients then are:
// Note [Join] in join.cpp.
#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace ddplab::distributed {

// What a joined rank does for one participant.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Once for every iteration the other ranks still run: the collectives of one iteration.
  virtual void main_hook() {}
  // Once when every rank has joined. is_last_joiner: this rank was among the last to run out.
  virtual void post_hook(bool is_last_joiner) { (void)is_last_joiner; }
};

// Set by Join on its participants.
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;  // the one that issues the per-iteration "still here" count
};

class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook() = 0;
  virtual Device join_device() const = 0;
  virtual std::shared_ptr<ProcessGroup> join_process_group() const = 0;

  JoinConfig join_config;
};

// True while a joined rank replays one of the others' iterations (DDP's join hook, for a model
// with collectives of its own): a module such as SyncBatchNorm then issues its collectives as
// usual but contributes nothing to them (a count of 0 samples, zero sums). Thread-local.
bool is_join_shadowing();
class JoinShadowGuard {
 public:
  JoinShadowGuard();
  ~JoinShadowGuard();
  JoinShadowGuard(const JoinShadowGuard&) = delete;
  JoinShadowGuard& operator=(const JoinShadowGuard&) = delete;

 private:
  bool prev_;
};

class Join {
 public:
  // `joinables`: every participant of the loop (the same list, in the same order, on every
  // rank), all on one process group. enable=false makes the Join do nothing.
  explicit Join(std::vector<Joinable*> joinables, bool enable = true,
                bool throw_on_early_termination = false);
  // Runs join() unless it ran, or an exception is leaving the scope. May throw (with
  // throw_on_early_termination), like the end of PyTorch's `with Join(...)` block.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has no more inputs: shadow the others' iterations until every rank has joined,
  // then run the post-hooks. With throw_on_early_termination it throws instead, on every rank.
  void join();

  // Called by a participant at the start of each of its iterations (DDP: each training forward):
  // the first joinable all-reduces 1 ("still running"), matched by the 0 of every joined rank.
  // With throw_on_early_termination, a second all-reduce learns whether some rank has joined,
  // and then every rank throws.
  static void notify_join_context(Joinable& joinable);

 private:
  std::vector<Joinable*> joinables_;
  bool enable_;
  bool throw_;
  bool done_ = false;
  int uncaught_at_start_;
  std::shared_ptr<ProcessGroup> pg_;
  Device device_;
};

}  // namespace ddplab::distributed
