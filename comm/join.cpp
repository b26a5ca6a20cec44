// Join: the joined rank's loop and the per-iteration count. Read the note first.
//
// Note [Join]
// ~~~~~~~~~~~
// Each iteration of a rank that still has data starts (DDP's training forward) with an
// all-reduce of 1 (notify_join_context). A rank that has run out sits in join() and, once per
// iteration of the others, all-reduces 0 in the same position: the sum is the number of ranks
// still running. While it is positive the joined rank runs every participant's main_hook, which
// issues the rest of that iteration's collectives with neutral values (DDP: whether the others
// will all-reduce gradients, the buffer broadcast, every bucket filled with zeros; the
// unused-parameter count), so every collective of the running ranks is matched. When the count
// is 0 every rank has joined: they all leave the loop at the same collective, and the
// post-hooks run (DDP: the model is copied from a rank that ran longest, because the joined
// ranks skipped optimizer steps).
//
// What the gradients are. A joined rank contributes zeros, and the hooks still divide by the
// full world size W, as PyTorch does by default (DDP.join(divide_by_initial_world_size=True)):
// with k ranks still running on batches of B samples, each gradient is
//   (1/W) sum_{running r} g_r = (k/W) * (gradient of the mean loss over those k*B samples),
// i.e. one process on the same k*B samples with its loss scaled by k/W: every sample of the epoch
// keeps the weight 1/(W*B) it has in a full step. (A hook with memory still runs on the joined
// rank's zero buckets: PowerSGD adds its stored error to them, so a joined rank hands in what
// compression had held back, as it would in PyTorch, where the same hook runs on zeros.) (PyTorch's divide_by_initial_world_size=False,
// dividing by k instead, is not offered: it would need the count inside every hook.)
//
// With throw_on_early_termination the first rank to run out all-reduces 1 in place of the
// count's 0 and throws; the running ranks learn it from the extra all-reduce of 0 that
// notify_join_context issues after the count when the option is on, and throw too. So every rank
// raises at the same iteration, and the caller decides what to do (e.g. stop the epoch there).
//
// The count is issued only by the first participant (is_first_joinable), once per iteration,
// however many participants there are. The collectives of a joined rank must be exactly those
// of an iteration of the running ranks, in the same order; Join relies on every participant's
// main_hook to reproduce its own part. A model with collectives inside its forward and backward
// (SyncBatchNorm) cannot be shadowed by all-reducing zero buckets, since its collectives are
// interleaved with the bucket all-reduces in an order only the autograd engine knows: for such a
// model DDP's join hook REPLAYS the rank's last training forward and backward under a
// JoinShadowGuard, in which SyncBatchNorm contributes a count of 0 samples and zero sums and the
// Reducer fills every bucket with zeros; the rank's own .grad is restored afterwards. Collectives
// outside the model have their own participant: the GradScaler's found-inf agreement is shadowed
// by the scaler's join hook, listed after the model (Note [GradScaler under Join] in
// optim/grad_scaler.cpp). Collectives that no participant knows about (a loss all-reduced for
// logging) are not shadowed: such a loop still hangs (or times out) with uneven inputs.
#include "comm/join.h"

#include <exception>
#include <sstream>

#include "comm/collectives.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ddplab::distributed {

namespace {

thread_local bool t_shadowing = false;

}  // namespace

bool is_join_shadowing() {
  return t_shadowing;
}
JoinShadowGuard::JoinShadowGuard() : prev_(t_shadowing) {
  t_shadowing = true;
}
JoinShadowGuard::~JoinShadowGuard() {
  t_shadowing = prev_;
}

Join::Join(std::vector<Joinable*> joinables, bool enable, bool throw_on_early_termination)
    : joinables_(std::move(joinables)),
      enable_(enable),
      throw_(throw_on_early_termination),
      uncaught_at_start_(std::uncaught_exceptions()) {
  DDP_CHECK(!joinables_.empty(), "Join: expected at least one joinable");
  for (Joinable* j : joinables_) DDP_CHECK(j != nullptr, "Join: a joinable is null");
  pg_ = joinables_.front()->join_process_group();
  device_ = joinables_.front()->join_device();
  DDP_CHECK(pg_ != nullptr, "Join: the first joinable has no process group");
  for (Joinable* j : joinables_) {
    DDP_CHECK(j->join_process_group().get() == pg_.get(),
              "Join: every joinable must use the same process group");
    DDP_CHECK(j->join_device() == device_, "Join: every joinable must use the same device");
  }
  for (size_t i = 0; i < joinables_.size(); ++i) {
    joinables_[i]->join_config = {enable_, throw_, /*is_first_joinable=*/i == 0};
  }
}

Join::~Join() noexcept(false) {
  // An exception already leaving the scope: the loop failed, shadowing would only add a hang.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_start_;
  if (!done_ && !unwinding) {
    join();
    return;
  }
  for (Joinable* j : joinables_) j->join_config = {};
}

void Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config;
  if (!config.enable || !config.is_first_joinable) return;
  ProcessGroup& pg = *joinable.join_process_group();
  all_reduce_value(pg, 1.0);  // "still running"
  if (config.throw_on_early_termination && all_reduce_value(pg, 0.0) > 0) {
    throw Error(
        "Join: detected at least one rank that exhausted its inputs; throwing on every "
        "rank (throw_on_early_termination=true)");
  }
}

void Join::join() {
  if (done_) return;
  done_ = true;
  if (!enable_) {
    for (Joinable* j : joinables_) j->join_config = {};
    return;
  }
  std::vector<std::unique_ptr<JoinHook>> hooks;
  for (Joinable* j : joinables_) hooks.push_back(j->join_hook());

  bool is_last_joiner = true;
  for (;;) {
    // Matches the running ranks' notify_join_context: they add 1 each, this rank 0.
    const double running = all_reduce_value(*pg_, 0.0);
    if (running == 0) break;
    if (throw_) {
      // Matches the running ranks' second all-reduce: 1 tells them to throw too.
      all_reduce_value(*pg_, 1.0);
      for (Joinable* j : joinables_) j->join_config = {};
      std::ostringstream os;
      os << "Join: rank " << pg_->rank() << " exhausted its inputs while " << running
         << " rank(s) still had some (throw_on_early_termination=true)";
      throw Error(os.str());
    }
    for (auto& h : hooks) h->main_hook();
    is_last_joiner = false;
  }
  for (auto& h : hooks) h->post_hook(is_last_joiner);
  for (Joinable* j : joinables_) j->join_config = {};
}

}  // namespace ddplab::distributed
