// ProcessGroupGloo: rendezvous over our Store, a FIFO worker thread running Gloo's collectives,
// Work handles, and timeout messages that name the ranks that never arrived.
//
// Gloo facts this file relies on (Debian's 2022 snapshot): the "new" option-struct API
// (gloo::AllreduceOptions, BroadcastOptions, AllgatherOptions, BarrierOptions) takes a tag and a
// timeout per call and throws gloo::IoException when a peer does not answer in time; every rank
// must run the same collectives with the same tags in the same order.
#include "comm/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/flight_recorder.h"
#include "comm/store/gloo_store_adapter.h"
#include "tensor/error.h"
#include "tensor/half.h"

namespace ddplab::distributed {

namespace {

using ms = std::chrono::milliseconds;

std::string duration_str(ms t) {
  std::ostringstream os;
  if (t.count() % 1000 == 0)
    os << t.count() / 1000 << " s";
  else
    os << t.count() << " ms";
  return os.str();
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

class GlooWork;

struct Task {
  std::string name;
  uint64_t seq = 0;
  std::shared_ptr<GlooWork> work;
  ProcessGroupGloo::Body body;
};

}  // namespace

GlooInterface gloo_interface_from_environment(const std::string& master_addr) {
  GlooInterface itf;
  if (const char* v = std::getenv("DDPLAB_GLOO_IFNAME"); v != nullptr && *v != '\0') {
    itf.iface = v;
  } else if (const char* h = std::getenv("DDPLAB_GLOO_HOSTNAME"); h != nullptr && *h != '\0') {
    itf.hostname = h;
  } else if (master_addr.empty() || is_loopback(master_addr)) {
    itf.hostname = "127.0.0.1";
  } else {
    char name[256] = {};
    DDP_CHECK(::gethostname(name, sizeof(name) - 1) == 0,
              "ProcessGroupGloo: gethostname failed; set DDPLAB_GLOO_IFNAME or "
              "DDPLAB_GLOO_HOSTNAME");
    itf.hostname = name;
  }
  return itf;
}

// Everything the worker and publisher threads share with the group object. The threads hold it
// by shared_ptr, so a thread left behind by the destructor never touches freed memory.
struct ProcessGroupGloo::State {
  int rank = 0, size = 1;
  ms timeout{0};
  ms progress_interval{250};
  std::string name;
  std::shared_ptr<Store> store;  // PrefixStore(name, the caller's store): rendezvous
  // The same keys, through a connection of our own when the store is a TCPStore: progress
  // reports and the timeout diagnosis.
  std::shared_ptr<Store> monitor_store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<FlightRecorder> recorder;  // the ProcessGroup base's; dumped on a failure
  // Set once this rank has dumped because of its own failure or another rank's request: one
  // dump per rank, and never a requested one over the fuller dump of its own failure.
  std::atomic<bool> flight_dumped{false};

  std::mutex mu;
  std::condition_variable cv;  // signals queue, stop and thread-exit changes
  std::deque<Task> queue;
  uint64_t next_seq = 0;
  bool stop = false;
  bool worker_exited = false, publisher_exited = false;
  std::string broken;  // the first failure; later collectives fail with it
  std::thread worker, publisher;

  // How many collectives this rank's worker has started: collective `seq` was reached when
  // started > seq. Read by the publisher.
  std::atomic<uint64_t> started{0};

  void worker_loop();
  void publisher_loop();
  // Dumps the flight recorder if another rank asked for it (see publisher_loop).
  void answer_dump_request();
  // The full error message of a failed or timed-out collective.
  std::string describe(const std::string& what, uint64_t seq, const std::string& cause);
  // "rank 1 did not join all_reduce seq 3 (...)", from the peers' published counters, which it
  // also returns in `peers` (rank -> collectives started); the late ranks go to `missing`.
  std::string arrivals(const std::string& what, uint64_t seq, std::map<int, uint64_t>& peers,
                       std::vector<int>& missing);
};

namespace {

class GlooWork : public Work {
 public:
  GlooWork(std::string name, uint64_t seq, std::weak_ptr<ProcessGroupGloo::State> state,
           ms group_timeout)
      : name_(std::move(name)), seq_(seq), state_(std::move(state)), timeout_(group_timeout) {}

  void wait(ms timeout) override {
    const ms limit = timeout.count() > 0 ? timeout : timeout_;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
      lock.unlock();
      std::string cause = "Work::wait gave up after " + duration_str(limit);
      if (auto st = state_.lock()) throw Error(st->describe(name_, seq_, cause));
      throw Error(name_ + " (seq " + std::to_string(seq_) + ") did not finish: " + cause);
    }
    if (!error_.empty()) throw Error(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::string error() override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void finish(std::string error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  std::string name_;
  uint64_t seq_;
  std::weak_ptr<ProcessGroupGloo::State> state_;
  ms timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

}  // namespace

void ProcessGroupGloo::State::worker_loop() {
  for (;;) {
    Task task;
    std::string earlier_failure;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) break;  // stopping, and nothing left
      task = std::move(queue.front());
      queue.pop_front();
      earlier_failure = broken;
    }
    started.store(task.seq + 1);
    if (recorder) recorder->started(task.seq, task.name);
    std::string error;
    if (!earlier_failure.empty()) {
      // Gloo's pairs may hold half a message of the failed collective: running more would
      // mismatch data silently, so fail fast with the original cause.
      error =
          task.name + " (seq " + std::to_string(task.seq) +
          ") was not run because an earlier collective of this group failed: " + earlier_failure;
    } else {
      try {
        task.body(context, static_cast<uint32_t>(task.seq));
      } catch (const std::exception& e) {
        error = describe(task.name, task.seq, e.what());
        std::lock_guard<std::mutex> lock(mu);
        broken = error;
      }
    }
    if (recorder) recorder->finished(task.seq, error);
    task.work->finish(std::move(error));
  }
  std::lock_guard<std::mutex> lock(mu);
  worker_exited = true;
  cv.notify_all();
}

void ProcessGroupGloo::State::publisher_loop() {
  // A separate thread, because the worker may be blocked inside Gloo exactly when its progress
  // matters. One small store write per interval at most, and only when the counter moved: cheap
  // enough to leave on for every collective of DDP. About once a second it also looks for
  // another rank's request to dump the flight recorder (flight_recorder.h).
  const std::string key = "arrived/" + std::to_string(rank);
  uint64_t published = ~uint64_t{0};
  auto next_dump_check = std::chrono::steady_clock::now() + kFlightDumpPollInterval;
  std::unique_lock<std::mutex> lock(mu);
  while (!stop) {
    uint64_t now = started.load();
    const bool check_dump =
        recorder && !flight_dumped && std::chrono::steady_clock::now() >= next_dump_check;
    if (now != published || check_dump) {
      lock.unlock();
      try {
        if (now != published) {
          monitor_store->set(key, std::to_string(now));
          published = now;
        }
        if (check_dump) {
          next_dump_check = std::chrono::steady_clock::now() + kFlightDumpPollInterval;
          answer_dump_request();
        }
      } catch (const std::exception&) {
        // The store host (rank 0) is gone or slow; diagnostics degrade, collectives do not.
      }
      lock.lock();
    }
    cv.wait_for(lock, progress_interval, [&] { return stop; });
  }
  publisher_exited = true;
  cv.notify_all();
}

void ProcessGroupGloo::State::answer_dump_request() {
  const std::string path = answer_flight_dump_request(*monitor_store, *recorder);
  if (path.empty() || flight_dumped.exchange(true)) return;
  std::cerr << "ProcessGroupGloo '" << name << "': rank " << rank
            << " dumped its flight recorder to " << path << " at another rank's request"
            << std::endl;
}

std::string ProcessGroupGloo::State::arrivals(const std::string& what, uint64_t seq,
                                              std::map<int, uint64_t>& peers,
                                              std::vector<int>& missing_ranks) {
  if (size == 1) return "";
  // Let every peer's publisher run once more, so a rank that arrived just before the deadline
  // is not blamed.
  std::this_thread::sleep_for(progress_interval + ms(50));
  std::ostringstream missing;
  int n_missing = 0;
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string key = "arrived/" + std::to_string(r);
      uint64_t s = monitor_store->check({key}) ? std::stoull(monitor_store->get_string(key)) : 0;
      peers[r] = s;
      if (s > seq) continue;
      missing_ranks.push_back(r);
      missing << (n_missing++ ? "; " : "") << "rank " << r << " did not join " << what << " seq "
              << seq;
      // The counters are published at most every progress_interval, so they may lag by one
      // interval: "reported", not "started".
      if (s == 0)
        missing << " (it has reported starting no collective of this group)";
      else
        missing << " (the last collective it reported starting is seq " << s - 1 << ")";
    }
  } catch (const std::exception& e) {
    return std::string("Which ranks arrived is unknown: the store did not answer (") + e.what() +
           ").";
  }
  if (n_missing == 0) return "Every rank reached this collective; a peer failed or exited in it.";
  return missing.str() + ".";
}

std::string ProcessGroupGloo::State::describe(const std::string& what, uint64_t seq,
                                              const std::string& cause) {
  std::map<int, uint64_t> peers;
  std::vector<int> missing;
  const std::string who = arrivals(what, seq, peers, missing);
  std::ostringstream os;
  os << "ProcessGroupGloo '" << name << "': " << what << " (seq " << seq << ") failed on rank "
     << rank << " of a group of " << size << " ranks (timeout " << duration_str(timeout) << "). "
     << who << " Cause: " << cause << ".";
  // The recorder's view of this rank, next to the counters of the others: the input of
  // tools/flight_merge.py.
  if (recorder) {
    const std::string reason = what + " seq " + std::to_string(seq) + ": " + cause;
    flight_dumped = true;
    request_flight_dumps(*monitor_store, rank, reason);  // the other ranks dump their view too
    const std::string path = recorder->dump(reason, peers);
    if (!path.empty()) os << " Flight recorder dump: " << path << ".";
  }
  os << " The group cannot be used any more: let the error end the process (a non-zero exit "
        "makes ddprun restart the job).";
  write_hang_report(rank, what, seq, missing, os.str());
  return os.str();
}

// --- construction and teardown ------------------------------------------------------------------

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   const GlooOptions& options)
    : state_(std::make_shared<State>()) {
  DDP_CHECK(store != nullptr, "ProcessGroupGloo: a store is required");
  DDP_CHECK(size >= 1 && rank >= 0 && rank < size,
            "ProcessGroupGloo: rank " << rank << " is outside a group of size " << size);
  DDP_CHECK(options.timeout.count() > 0, "ProcessGroupGloo: the timeout must be positive");
  static std::atomic<int> groups_created{0};
  State& st = *state_;
  st.rank = rank;
  st.size = size;
  st.timeout = options.timeout;
  st.progress_interval = options.progress_interval;
  st.name = options.group_name.empty() ? "gloo_pg" + std::to_string(groups_created++)
                                       : options.group_name;
  // A TCPStore serves one request at a time per client object: a user blocked in get() on the
  // shared client would stall our progress reports exactly when a hang needs them. So the
  // monitor opens its own connection when it can (a PrefixStore hides its base's address).
  std::shared_ptr<Store> monitor_base = store;
  if (auto tcp = std::dynamic_pointer_cast<TCPStore>(store))
    monitor_base =
        std::make_shared<TCPStore>(tcp->host(), tcp->port(), false, tcp->timeout(), tcp->token());
  st.store = std::make_shared<PrefixStore>(st.name, std::move(store));
  st.monitor_store = std::make_shared<PrefixStore>(st.name, std::move(monitor_base));
  init_flight_recorder(st.name);
  st.recorder = flight_recorder();

  GlooInterface itf = options.interface;
  if (itf.hostname.empty() && itf.iface.empty()) {
    const char* master = std::getenv("MASTER_ADDR");
    itf = gloo_interface_from_environment(master != nullptr ? master : "127.0.0.1");
  }
  gloo::transport::tcp::attr attr;
  if (!itf.iface.empty()) {
    attr.iface = itf.iface;
  } else {
    attr.hostname = itf.hostname;
  }
  // IPv4 unless the address is an IPv6 literal: a host name resolving to both would otherwise
  // let the ranks pick different families.
  attr.ai_family = itf.hostname.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  const std::string where = itf.iface.empty() ? "host " + itf.hostname : "interface " + itf.iface;
  try {
    st.device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    DDP_FAIL("ProcessGroupGloo: cannot open a Gloo TCP device on "
             << where << ": " << e.what()
             << " (choose another with DDPLAB_GLOO_IFNAME=<interface> or "
                "DDPLAB_GLOO_HOSTNAME=<address>)");
  }
  st.context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  st.context->setTimeout(options.timeout);
  GlooStoreAdapter adapter(std::make_shared<PrefixStore>("gloo", st.store));
  try {
    st.context->connectFullMesh(adapter, st.device);
  } catch (const std::exception& e) {
    DDP_FAIL("ProcessGroupGloo '" << st.name << "': rank " << rank << " of " << size
                                  << " could not connect to its peers (its " << where
                                  << ", timeout " << duration_str(options.timeout)
                                  << "): " << e.what());
  }
  auto shared = state_;
  st.worker = std::thread([shared] { shared->worker_loop(); });
  st.publisher = std::thread([shared] { shared->publisher_loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  State& st = *state_;
  std::deque<Task> cancelled;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.stop = true;
    cancelled.swap(st.queue);
  }
  st.cv.notify_all();
  for (Task& t : cancelled)
    t.work->finish(t.name + " (seq " + std::to_string(t.seq) +
                   ") was cancelled: its process group was destroyed before it ran");
  // A collective already running normally ends in milliseconds. One whose peer never comes
  // would hold the process until Gloo's timeout: after a grace period the threads are detached
  // (they own the state through shared_ptr) so a failing process can exit at once.
  std::unique_lock<std::mutex> lock(st.mu);
  st.cv.wait_for(lock, std::chrono::seconds(2),
                 [&] { return st.worker_exited && st.publisher_exited; });
  const bool worker_done = st.worker_exited, publisher_done = st.publisher_exited;
  lock.unlock();
  if (worker_done)
    st.worker.join();
  else
    st.worker.detach();
  if (publisher_done)
    st.publisher.join();
  else
    st.publisher.detach();
}

int ProcessGroupGloo::rank() const {
  return state_->rank;
}
int ProcessGroupGloo::size() const {
  return state_->size;
}
std::chrono::milliseconds ProcessGroupGloo::timeout() const {
  return state_->timeout;
}
const std::string& ProcessGroupGloo::group_name() const {
  return state_->name;
}
uint64_t ProcessGroupGloo::sequence_number() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->next_seq;
}

std::shared_ptr<Work> ProcessGroupGloo::enqueue(const std::string& name, Body body) {
  State& st = *state_;
  std::shared_ptr<GlooWork> work;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    DDP_CHECK(!st.stop, "ProcessGroupGloo: " << name << " issued while the group shuts down");
    const uint64_t seq = st.next_seq++;
    work = std::make_shared<GlooWork>(name, seq, state_, st.timeout);
    st.queue.push_back(Task{name, seq, work, std::move(body)});
  }
  st.cv.notify_all();
  return work;
}

// --- the collectives ----------------------------------------------------------------------------
// ProcessGroup's public methods checked the arguments (process_group.cpp) before calling these.

namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// gloo::sum etc. are overloaded (a 3- and a 4-argument form): the cast picks the 4-argument one.
template <class T>
ReduceFn reduce_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // the division follows the sum
      return static_cast<ReduceFn>(&gloo::sum<T>);
    case ReduceOp::Max:
      return static_cast<ReduceFn>(&gloo::max<T>);
    case ReduceOp::Min:
      return static_cast<ReduceFn>(&gloo::min<T>);
  }
  DDP_FAIL("unknown ReduceOp");
}

template <class T>
void gloo_allreduce(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t n, ReduceOp op,
                    uint32_t tag) {
  if (ctx->size == 1 || n == 0) return;
  gloo::AllreduceOptions o(ctx);
  o.setOutput(data, n);  // in place: the output doubles as the input
  o.setReduceFunction(reduce_fn<T>(op));
  o.setTag(tag);
  o.setTimeout(ctx->getTimeout());
  gloo::allreduce(o);
}

template <class T>
void native_allreduce(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t n, ReduceOp op,
                      uint32_t tag) {
  gloo_allreduce(ctx, data, n, op, tag);
  // Integer division truncates toward zero, as NCCL's ncclAvg does on integers. The divisor
  // stays an int: as a uint8_t it would wrap for groups of 256 ranks or more.
  if (op == ReduceOp::Avg)
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / ctx->size);
}

// 16-bit floats: Gloo's own float16 math rounds after every partial sum; widening to float32 and
// rounding once at the end is both more accurate and identical on every rank.
template <class H>
void widened_allreduce(const std::shared_ptr<gloo::Context>& ctx, H* data, size_t n, ReduceOp op,
                       uint32_t tag) {
  std::vector<float> wide(data, data + n);
  native_allreduce(ctx, wide.data(), n, op, tag);
  for (size_t i = 0; i < n; ++i) data[i] = H(wide[i]);
}

void allreduce_buffer(const std::shared_ptr<gloo::Context>& ctx, void* data, DType dt, size_t n,
                      ReduceOp op, uint32_t tag) {
  switch (dt) {
    case DType::Float32:
      return native_allreduce(ctx, static_cast<float*>(data), n, op, tag);
    case DType::Float64:
      return native_allreduce(ctx, static_cast<double*>(data), n, op, tag);
    case DType::Int64:
      return native_allreduce(ctx, static_cast<int64_t*>(data), n, op, tag);
    case DType::Int32:
      return native_allreduce(ctx, static_cast<int32_t*>(data), n, op, tag);
    case DType::UInt8:
      return native_allreduce(ctx, static_cast<uint8_t*>(data), n, op, tag);
    case DType::Float16:
      return widened_allreduce(ctx, static_cast<Half*>(data), n, op, tag);
    case DType::BFloat16:
      return widened_allreduce(ctx, static_cast<BFloat16*>(data), n, op, tag);
    default:
      DDP_FAIL("all_reduce: unsupported dtype " << dtype_name(dt));
  }
}

}  // namespace

std::shared_ptr<Work> ProcessGroupGloo::do_all_reduce(const Tensor& t, ReduceOp op) {
  // The Tensor handle is captured by value: its storage stays alive until the worker is done.
  return enqueue("all_reduce", [t, op](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
    allreduce_buffer(ctx, t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), op, tag);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::do_broadcast(const Tensor& t, int root) {
  return enqueue("broadcast", [t, root](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
    if (ctx->size == 1 || t.nbytes() == 0) return;
    gloo::BroadcastOptions o(ctx);
    // Raw bytes: broadcast needs no arithmetic, so every dtype goes the same way.
    o.setOutput(static_cast<uint8_t*>(t.raw_data()), t.nbytes());
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(ctx->getTimeout());
    gloo::broadcast(o);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::do_all_gather(const std::vector<Tensor>& outputs,
                                                      const Tensor& input) {
  return enqueue("all_gather",
                 [outputs, input](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
                   const size_t n = input.nbytes();
                   if (n == 0) return;
                   if (ctx->size == 1) {
                     std::memmove(outputs[0].raw_data(), input.raw_data(), n);
                     return;
                   }
                   // Gloo gathers into one buffer of size * n bytes, rank r's part at offset r * n.
                   std::vector<uint8_t> gathered(n * static_cast<size_t>(ctx->size));
                   gloo::AllgatherOptions o(ctx);
                   o.setInput(static_cast<uint8_t*>(input.raw_data()), n);
                   o.setOutput(gathered.data(), gathered.size());
                   o.setTag(tag);
                   o.setTimeout(ctx->getTimeout());
                   gloo::allgather(o);
                   for (size_t r = 0; r < outputs.size(); ++r)
                     std::memcpy(outputs[r].raw_data(), gathered.data() + r * n, n);
                 });
}

std::shared_ptr<Work> ProcessGroupGloo::do_reduce_scatter(const Tensor& output,
                                                          const std::vector<Tensor>& inputs,
                                                          ReduceOp op) {
  // Gloo's reduce-scatter in this snapshot exists only as the old templated algorithm class
  // (ReduceScatterHalvingDoubling: pointers fixed at construction, no tag, no timeout). So we
  // all-reduce the concatenation of the inputs and keep our slice: the same result, at about
  // twice the traffic of a true reduce-scatter (a ring all-reduce is a reduce-scatter plus an
  // all-gather). Good enough for its only caller today, the collective tests.
  return enqueue("reduce_scatter", [output, inputs, op](const std::shared_ptr<gloo::Context>& ctx,
                                                        uint32_t tag) {
    const size_t n = static_cast<size_t>(output.numel());
    const size_t bytes = output.nbytes();
    if (n == 0) return;
    // uint64_t words keep the buffer 8-byte aligned for every dtype.
    std::vector<uint64_t> flat((bytes * inputs.size() + 7) / 8);
    auto* base = reinterpret_cast<uint8_t*>(flat.data());
    for (size_t r = 0; r < inputs.size(); ++r)
      std::memcpy(base + r * bytes, inputs[r].raw_data(), bytes);
    allreduce_buffer(ctx, base, output.dtype(), n * inputs.size(), op, tag);
    std::memcpy(output.raw_data(), base + static_cast<size_t>(ctx->rank) * bytes, bytes);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::do_barrier() {
  return enqueue("barrier", [](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
    if (ctx->size == 1) return;
    gloo::BarrierOptions o(ctx);
    o.setTag(tag);
    o.setTimeout(ctx->getTimeout());
    gloo::barrier(o);
  });
}

}  // namespace ddplab::distributed
