// Lab 2's point-to-point layer over Gloo's unbound buffers (the four calls that
// comm/ring_allreduce.cpp explains).
#include "comm.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "tensor/error.h"

namespace lab2 {

namespace {
// Gloo's collectives use slot prefixes 0x01-0x08 and the library's ring 0x41: 'L' is the lab's.
constexpr uint8_t kLabSlotPrefix = 0x4c;
}  // namespace

int Comm::rank() const {
  return ctx_.rank;
}
int Comm::size() const {
  return ctx_.size;
}

// One slot per message and direction: the k-th message of a pair gets the same slot on both
// sides, so a fast rank's next message can never be taken for the current one. 256 slots per tag
// wrap around safely, since each message is waited for before the next.
uint64_t Comm::next_slot(std::map<int, uint8_t>& count, int peer) {
  DDP_CHECK(peer >= 0 && peer < size() && peer != rank(),
            "lab2::Comm: peer " << peer << " is not another rank of " << size());
  return gloo::Slot::build(kLabSlotPrefix, tag_) + count[peer]++;
}

void Comm::send(const float* data, size_t n, int peer) {
  sendrecv(data, n, peer, nullptr, 0, -1);
}

void Comm::recv(float* data, size_t n, int peer) {
  sendrecv(nullptr, 0, -1, data, n, peer);
}

void Comm::sendrecv(const float* send_data, size_t send_n, int to, float* recv_data, size_t recv_n,
                    int from) {
  const auto timeout = ctx_.getTimeout();
  std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
  // An empty message still takes its slot on both sides, so the counts stay paired.
  if (to >= 0) {
    const uint64_t slot = next_slot(sends_, to);
    if (send_n > 0) {
      out = ctx_.createUnboundBuffer(const_cast<float*>(send_data), send_n * sizeof(float));
      out->send(to, slot);
      bytes_sent_ += send_n * sizeof(float);
    }
  }
  if (from >= 0) {
    const uint64_t slot = next_slot(recvs_, from);
    if (recv_n > 0) {
      in = ctx_.createUnboundBuffer(recv_data, recv_n * sizeof(float));
      in->recv(from, slot);
    }
  }
  DDP_CHECK(!out || out->waitSend(timeout), "lab2::Comm: send to rank " << to << " failed");
  DDP_CHECK(!in || in->waitRecv(timeout), "lab2::Comm: recv from rank " << from << " failed");
}

std::shared_ptr<ddplab::distributed::Work> run_collective(ddplab::distributed::ProcessGroupGloo& pg,
                                                          const std::string& name,
                                                          std::function<void(Comm&)> fn) {
  return pg.enqueue(name,
                    [fn = std::move(fn)](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
                      Comm comm(*ctx, tag);
                      fn(comm);
                    });
}

}  // namespace lab2
