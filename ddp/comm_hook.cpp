// Future and CommHookState: the small machinery under every communication hook.
#include "ddp/comm_hook.h"

#include "tensor/error.h"

namespace ddplab::distributed {

FuturePtr Future::completed(Tensor value) {
  auto f = std::make_shared<Future>();
  f->value_ = std::move(value);
  f->done_ = true;
  return f;
}

FuturePtr Future::from_work(std::shared_ptr<Work> work, Tensor value) {
  auto f = std::make_shared<Future>();
  f->work_ = std::move(work);
  f->value_ = std::move(value);
  return f;
}

FuturePtr Future::then(std::function<Tensor(const Tensor&)> fn) {
  auto f = std::make_shared<Future>();
  f->parent_ = shared_from_this();
  f->fn_ = std::move(fn);
  return f;
}

Tensor Future::wait() {
  if (done_) return value_;
  if (parent_) {
    value_ = fn_(parent_->wait());
    parent_.reset();  // the chain has run: drop what it held
    fn_ = nullptr;
  } else if (work_) {
    work_->wait();
    work_.reset();
  }
  done_ = true;
  return value_;
}

bool Future::is_completed() {
  if (done_) return true;
  if (parent_) return false;  // continuations run only in wait()
  return !work_ || work_->is_completed();
}

void Future::wait_for_collective() {
  if (parent_) {
    parent_->wait_for_collective();
  } else if (work_) {
    work_->wait();
  }
}

CommHookState::CommHookState(std::shared_ptr<ProcessGroup> pg) : process_group(std::move(pg)) {
  DDP_CHECK(process_group != nullptr, "CommHookState: no process group");
}

std::shared_ptr<Work> CommHookState::all_reduce(const Tensor& t) {
  bytes_all_reduced += static_cast<int64_t>(t.nbytes());
  return process_group->all_reduce(t, ReduceOp::Sum);
}

}  // namespace ddplab::distributed
