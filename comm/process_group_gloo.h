// ProcessGroupGloo: the CPU process group, built on Facebook's Gloo library over TCP.
//
// How it works, in the order a reader meets it:
//  1. Rendezvous. Every rank creates a Gloo TCP device (a listening socket on one interface) and
//     calls connectFullMesh, which exchanges the addresses through our Store (GlooStoreAdapter,
//     keys under "<group>/gloo/") and opens one connection per pair of ranks.
//  2. One worker thread per group runs the collectives from a FIFO queue. Every rank issues the
//     same collectives in the same order, so every rank's worker runs them in that shared order
//     and the n-th collective meets the n-th collective of every peer. Its sequence number n is
//     also its Gloo tag.
//  3. Each collective returns a Work at once; Work::wait blocks until the worker finished it.
//  4. Diagnosis. A small publisher thread writes "<group>/arrived/<rank>" = how many collectives
//     this rank's worker has started (at most every progress_interval, only when it changed).
//     When a collective times out, the failing rank reads the peers' counters and names the
//     ranks that never reached it, dumps the group's flight recorder (flight_recorder.h) and
//     writes the hang report a launcher reads. After a failure the group is broken: later
//     collectives fail at once with the first error, because Gloo's pairs are in an unknown state.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace ddplab::distributed {

// Which local address Gloo binds and advertises to the peers.
struct GlooInterface {
  std::string hostname;  // an address or a host name that resolves to this host's interface
  std::string iface;     // or an interface name (eth0, ib0); wins when set
};
// DDPLAB_GLOO_IFNAME (an interface name) wins; then DDPLAB_GLOO_HOSTNAME; then 127.0.0.1 when
// `master_addr` is a loopback address (a one-machine job); else this machine's host name, which
// must resolve to an address the other nodes can reach (as Gloo's default in PyTorch).
GlooInterface gloo_interface_from_environment(const std::string& master_addr);

struct GlooOptions {
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // Store prefix of this group; every rank must pass the same. Empty: "gloo_pg<k>" for the k-th
  // group this process creates (ranks create groups in the same order, as in PyTorch).
  std::string group_name;
  // Empty: gloo_interface_from_environment(MASTER_ADDR, default 127.0.0.1).
  GlooInterface interface;
  // How often each rank publishes its progress counter (for the timeout message).
  std::chrono::milliseconds progress_interval{250};
};

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Connects the full mesh through `store`; blocks until all `size` ranks joined (or throws
  // after options.timeout).
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                   const GlooOptions& options = {});
  // Finishes the queued collectives; a worker stuck in a peerless collective is left to Gloo's
  // timeout (detached after a short grace, so a failing process can still exit).
  ~ProcessGroupGloo() override;
  ProcessGroupGloo(const ProcessGroupGloo&) = delete;
  ProcessGroupGloo& operator=(const ProcessGroupGloo&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "gloo"; }
  Device device() const override { return kCPU; }

  uint64_t sequence_number() const override;
  std::chrono::milliseconds timeout() const override;
  const std::string& group_name() const;

  // Runs `body` on the worker thread as collective `name`, after every collective issued before
  // it: the hook for algorithms written outside this file (ring_allreduce.cpp). `tag` is unique
  // to this collective and equal on every rank; use it to build Gloo slots.
  using Body = std::function<void(const std::shared_ptr<gloo::Context>& ctx, uint32_t tag)>;
  std::shared_ptr<Work> enqueue(const std::string& name, Body body);

  struct State;  // defined in process_group_gloo.cpp

 protected:
  // Float32, float64, int64, int32 and uint8 reduce natively; float16 and bfloat16 are widened
  // to float32, reduced, and rounded back (one rounding, as if the sum were done in float32).
  std::shared_ptr<Work> do_all_reduce(const Tensor& t, ReduceOp op) override;
  // Bytes are copied, so any dtype works.
  std::shared_ptr<Work> do_broadcast(const Tensor& t, int root) override;
  std::shared_ptr<Work> do_all_gather(const std::vector<Tensor>& outputs,
                                      const Tensor& input) override;
  std::shared_ptr<Work> do_reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                          ReduceOp op) override;
  std::shared_ptr<Work> do_barrier() override;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ddplab::distributed
