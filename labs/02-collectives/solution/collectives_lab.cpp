// Lab 2, the reference solution (course staff). The library's own ring, with Gloo's buffers
// used directly, is comm/ring_allreduce.cpp.
#include "collectives_lab.h"

#include <vector>

namespace lab2 {

void ring_allreduce(Comm& comm, float* data, size_t n) {
  const int w = comm.size(), r = comm.rank();
  if (w == 1) return;
  // Chunk c holds elements [begin(c), begin(c + 1)); the sizes differ by at most one.
  auto begin = [&](int c) { return n * static_cast<size_t>(c) / static_cast<size_t>(w); };
  auto len = [&](int c) { return begin(c + 1) - begin(c); };
  auto mod = [&](int c) { return ((c % w) + w) % w; };
  const int right = mod(r + 1), left = mod(r - 1);
  std::vector<float> incoming(n / static_cast<size_t>(w) + 1);
  // Reduce-scatter: in step s, pass chunk r-s on and add chunk r-s-1 arriving from the left.
  // After W-1 steps chunk r+1 has collected every rank's contribution here.
  for (int s = 0; s < w - 1; ++s) {
    const int out = mod(r - s), in = mod(r - s - 1);
    comm.sendrecv(data + begin(out), len(out), right, incoming.data(), len(in), left);
    for (size_t i = 0; i < len(in); ++i) data[begin(in) + i] += incoming[i];
  }
  // All-gather: pass the complete chunks around; each lands in its place.
  for (int s = 0; s < w - 1; ++s) {
    const int out = mod(r + 1 - s), in = mod(r - s);
    comm.sendrecv(data + begin(out), len(out), right, data + begin(in), len(in), left);
  }
}

void tree_allreduce(Comm& comm, float* data, size_t n) {
  const int w = comm.size(), r = comm.rank();
  std::vector<float> incoming(n);
  // Reduce: in round k (mask = 2^k), a rank with that bit set sends to rank - mask and is done;
  // a rank without it receives from rank + mask, if that rank exists.
  int mask = 1;
  for (; mask < w; mask <<= 1) {
    if (r & mask) {
      comm.send(data, n, r - mask);
      break;
    }
    if (r + mask < w) {
      comm.recv(incoming.data(), n, r + mask);
      for (size_t i = 0; i < n; ++i) data[i] += incoming[i];
    }
  }
  // Broadcast: the same tree backwards. A rank first receives the total from the parent it sent
  // to (rank 0 has none), then passes it to the children it received from, largest first.
  if (r != 0) comm.recv(data, n, r - mask);
  for (mask >>= 1; mask >= 1; mask >>= 1)
    if (r + mask < w) comm.send(data, n, r + mask);
}

double allreduce_bus_bandwidth(double algorithm_bandwidth, int world_size) {
  return algorithm_bandwidth * 2.0 * (world_size - 1) / world_size;
}

}  // namespace lab2
