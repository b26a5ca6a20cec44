// Lab 2's point-to-point layer: blocking send and receive between the ranks of a Gloo process
// group, the only communication the lab's all-reduces may use.
//
//   auto work = lab2::run_collective(pg, "my_allreduce", [&](lab2::Comm& comm) {
//     comm.sendrecv(out, n, right, in, n, left);  // what a ring step does
//   });
//   work->wait();
//
// Messages between two ranks pair up in order: the k-th send from rank a to rank b is the k-th
// recv of rank b from rank a, and their lengths must match. A send may wait for the matching
// recv to be posted, so two ranks that both send to each other first deadlock: use sendrecv.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "comm/process_group_gloo.h"

namespace gloo {
class Context;
}

namespace lab2 {

class Comm {
 public:
  Comm(gloo::Context& ctx, uint32_t tag) : ctx_(ctx), tag_(tag) {}
  int rank() const;
  int size() const;
  // Blocks until `n` floats from `data` have been handed to rank `peer`.
  void send(const float* data, size_t n, int peer);
  // Blocks until `n` floats from rank `peer` have arrived in `data`.
  void recv(float* data, size_t n, int peer);
  // Sends to `to` and receives from `from` at the same time; returns when both are done.
  void sendrecv(const float* send_data, size_t send_n, int to, float* recv_data, size_t recv_n,
                int from);
  // Bytes this rank has sent through this Comm (for the bandwidth questions).
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  uint64_t next_slot(std::map<int, uint8_t>& count, int peer);

  gloo::Context& ctx_;
  uint32_t tag_;
  std::map<int, uint8_t> sends_, recvs_;  // messages so far, per peer and direction
  size_t bytes_sent_ = 0;
};

// Runs fn as one collective of `pg`: on its worker thread, in order with its other collectives,
// under its timeout.
std::shared_ptr<ddplab::distributed::Work> run_collective(ddplab::distributed::ProcessGroupGloo& pg,
                                                          const std::string& name,
                                                          std::function<void(Comm&)> fn);

}  // namespace lab2
