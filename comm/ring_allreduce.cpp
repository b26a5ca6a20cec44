// The ring all-reduce over Gloo's point-to-point messages (see ring_allreduce.h for the idea).
//
// Gloo's point-to-point API, in four steps:
//   auto buf = ctx.createUnboundBuffer(ptr, bytes);   // register memory with the transport
//   buf->send(peer, slot, offset, nbytes);            // start sending a byte range (async)
//   buf->recv(peer, slot, offset, nbytes);            // start receiving into a byte range (async)
//   buf->waitSend(timeout) / buf->waitRecv(timeout)   // block until that transfer finished
// A message goes to the recv posted by the peer with the same slot. One buffer object may have
// only one send and one recv pending, so we use separate buffer objects for separate roles.
#include "comm/ring_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <vector>

#include "tensor/error.h"

namespace ddplab::distributed {

namespace {

// Slot prefix of this algorithm. Gloo's own collectives use 0x01-0x08; a different prefix keeps
// our messages from ever matching theirs.
constexpr uint8_t kRingSlotPrefix = 0x41;

template <class T>
void ring_allreduce_sum(gloo::Context& ctx, T* data, size_t n, uint32_t tag) {
  const int world = ctx.size;
  const int rank = ctx.rank;
  if (world == 1 || n == 0) return;  // nothing to exchange

  // Chunk c is elements [first(c), first(c + 1)): sizes differ by at most one element.
  auto first = [&](int c) { return n * static_cast<size_t>(c) / static_cast<size_t>(world); };
  auto length = [&](int c) { return first(c + 1) - first(c); };
  auto mod = [&](int c) { return ((c % world) + world) % world; };
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  const auto timeout = ctx.getTimeout();

  std::vector<T> incoming((n + world - 1) / world);  // room for the longest chunk
  auto send_buf = ctx.createUnboundBuffer(data, n * sizeof(T));
  auto incoming_buf = ctx.createUnboundBuffer(incoming.data(), incoming.size() * sizeof(T));
  auto gather_buf = ctx.createUnboundBuffer(data, n * sizeof(T));  // phase 2 lands in place

  // One slot per step, so a fast rank's next message can never be taken for this step's.
  const gloo::Slot base = gloo::Slot::build(kRingSlotPrefix, tag);
  int step = 0;

  // Sends chunk `send_c` to the right and receives chunk `recv_c` from the left into `into`
  // (at `into_offset` elements), then waits for both. Empty chunks (n < world) are skipped on
  // both sides: sender and receiver compute the same lengths.
  auto exchange = [&](int send_c, int recv_c, gloo::transport::UnboundBuffer& into,
                      size_t into_offset) {
    const uint64_t slot = base + static_cast<uint8_t>(step++);
    const bool sending = length(send_c) > 0, receiving = length(recv_c) > 0;
    if (sending) send_buf->send(right, slot, first(send_c) * sizeof(T), length(send_c) * sizeof(T));
    if (receiving) into.recv(left, slot, into_offset * sizeof(T), length(recv_c) * sizeof(T));
    DDP_CHECK(!sending || send_buf->waitSend(timeout), "ring_allreduce: send aborted");
    DDP_CHECK(!receiving || into.waitRecv(timeout), "ring_allreduce: receive aborted");
  };

  // Phase 1: reduce-scatter. Afterwards chunk (rank + 1) mod world holds the full sum here.
  for (int s = 0; s < world - 1; ++s) {
    const int send_c = mod(rank - s), recv_c = mod(rank - s - 1);
    exchange(send_c, recv_c, *incoming_buf, 0);
    T* mine = data + first(recv_c);
    for (size_t i = 0; i < length(recv_c); ++i) mine[i] += incoming[i];
  }

  // Phase 2: all-gather. Pass the complete chunks around until every rank has all of them.
  for (int s = 0; s < world - 1; ++s) {
    const int send_c = mod(rank + 1 - s), recv_c = mod(rank - s);
    exchange(send_c, recv_c, *gather_buf, first(recv_c));
  }
}

}  // namespace

std::shared_ptr<Work> ring_allreduce(ProcessGroupGloo& pg, const Tensor& t) {
  DDP_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(),
            "ring_allreduce: expected a contiguous CPU tensor, got shape "
                << (t.defined() ? shape_str(t.shape()) : "(undefined)") << " on "
                << (t.defined() ? t.device().str() : "-"));
  DDP_CHECK(
      t.dtype() == kFloat32 || t.dtype() == kFloat64 || t.dtype() == kInt64,
      "ring_allreduce: dtype " << dtype_name(t.dtype()) << " is not float32, float64 or int64");
  // 2 (W - 1) steps, one slot each, and Gloo allows 256 slots per tag.
  DDP_CHECK(pg.size() <= 128, "ring_allreduce: the teaching version supports up to 128 ranks");
  return pg.enqueue("ring_allreduce", [t](const std::shared_ptr<gloo::Context>& ctx, uint32_t tag) {
    const auto n = static_cast<size_t>(t.numel());
    switch (t.dtype()) {
      case DType::Float32:
        return ring_allreduce_sum(*ctx, t.data_ptr<float>(), n, tag);
      case DType::Float64:
        return ring_allreduce_sum(*ctx, t.data_ptr<double>(), n, tag);
      default:
        return ring_allreduce_sum(*ctx, t.data_ptr<int64_t>(), n, tag);
    }
  });
}

}  // namespace ddplab::distributed
