// Sequential and seeded random samplers.
#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "data/sample_rng.h"
#include "tensor/error.h"

namespace ddplab::data {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  DDP_CHECK(n >= 0, "SequentialSampler: size " << n << " is negative");
}

std::vector<int64_t> SequentialSampler::indices(int64_t /*epoch*/) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  DDP_CHECK(n >= 0, "RandomSampler: size " << n << " is negative");
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return random_permutation(n_, seed_, epoch);
}

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  // Fisher-Yates from the back: position i swaps with a uniform j in [0, i]. The random word
  // for step i is block i of the shuffle stream, so the permutation is fixed by (seed, epoch).
  // Two 32-bit words make a 64-bit draw; multiply-shift maps it to [0, i] with bias < 2^-32.
  for (int64_t i = n - 1; i > 0; --i) {
    Philox4x32 r = data_philox(seed, RngStream::kShuffle, static_cast<uint64_t>(epoch),
                               static_cast<uint64_t>(i), 0);
    uint64_t x = (uint64_t{r.c[0]} << 32) | r.c[1];
    auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(x) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

}  // namespace ddplab::data
