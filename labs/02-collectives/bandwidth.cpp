// Lab 2's measurement: algorithm and bus bandwidth of Gloo's all_reduce, your ring and your tree
// against the message size, the table nccl-tests prints. Run it under ddprun (README.md):
//   ddprun --standalone --nproc-per-node 4 build/labs/lab02_bandwidth_starter [max MiB]
// Rank 0 prints one row per size: time per all-reduce, algbw = bytes / time, busbw (part 3).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "collectives_lab.h"
#include "comm/init_process_group.h"
#include "tensor/ops.h"

using namespace ddplab;

namespace {

// Seconds per call of `run`, the median of `iters` timed calls after one warm-up, each ended by
// a barrier so that all ranks time the same interval.
double time_per_call(distributed::ProcessGroup& pg, const std::function<void()>& run, int iters) {
  run();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    pg.barrier()->wait();
    auto start = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto pg = distributed::init_process_group();
  auto* gloo = dynamic_cast<distributed::ProcessGroupGloo*>(pg.get());
  if (gloo == nullptr) {
    std::fprintf(stderr, "bandwidth: needs the gloo backend, got %s\n", pg->backend_name().c_str());
    return 2;
  }
  const double max_mib = argc > 1 ? std::atof(argv[1]) : 64;
  const int w = pg->size();
  if (pg->rank() == 0)
    std::printf("%12s | %9s %9s | %9s %9s | %9s %9s   (GB/s, %d ranks)\n", "bytes", "gloo alg",
                "bus", "ring alg", "bus", "tree alg", "bus", w);
  for (size_t bytes = 4096; bytes <= max_mib * (1 << 20); bytes *= 4) {
    const size_t n = bytes / sizeof(float);
    Tensor t = ops::ones({static_cast<int64_t>(n)});
    float* p = t.data_ptr<float>();
    auto mine = [&](lab2::AllReduceFn fn) {
      return [&, fn] {
        lab2::run_collective(*gloo, "lab", [&](lab2::Comm& c) { fn(c, p, n); })->wait();
      };
    };
    const int iters = bytes < (1 << 20) ? 20 : 5;
    const double secs[3] = {time_per_call(
                                *pg, [&] { pg->all_reduce(t)->wait(); }, iters),
                            time_per_call(*pg, mine(lab2::ring_allreduce), iters),
                            time_per_call(*pg, mine(lab2::tree_allreduce), iters)};
    if (pg->rank() == 0) {
      std::printf("%12zu", bytes);
      for (double s : secs) {
        const double alg = static_cast<double>(bytes) / s / 1e9;
        std::printf(" | %9.3f %9.3f", alg, lab2::allreduce_bus_bandwidth(alg, w));
      }
      std::printf("\n");
    }
  }
  pg->barrier()->wait();
  return 0;
}
