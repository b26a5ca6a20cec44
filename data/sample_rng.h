// The seeding rule of the data pipeline: every random choice is a pure function of
// (seed, epoch, index).
//
// A DataLoader may assemble batches on 0, 1 or 8 worker threads, in any order. If augmentation
// drew from a shared generator, the crop of image 17 would depend on which thread got there
// first. Instead each sample gets its own counter-based stream: Philox 4x32-10 (tensor/random.h)
// keyed by the seed, with the counter holding (block, index, epoch). The same (seed, epoch,
// index) therefore always gives the same crop and flip, whatever the thread count.
//
// Counter layout (128 bits): word 0 = block number (low 28 bits) | stream tag (high 4 bits),
// words 1-2 = the 64-bit sample index, word 3 = the epoch (low 32 bits). The stream tag keeps the
// augmentation randomness apart from the shuffle randomness drawn with the same seed.
#pragma once

#include <cstdint>

#include "tensor/random.h"

namespace ddplab::data {

enum class RngStream : uint32_t {
  kAugment = 0,  // per-sample transforms (crop offsets, flips)
  kShuffle = 1,  // the per-epoch permutation of RandomSampler
};

// Block `block` of stream (seed, stream, epoch, index).
inline Philox4x32 data_philox(uint64_t seed, RngStream stream, uint64_t epoch, uint64_t index,
                              uint32_t block) {
  Philox4x32 ctr{{(block & 0x0FFFFFFFu) | (static_cast<uint32_t>(stream) << 28),
                  static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                  static_cast<uint32_t>(epoch)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The random words of one sample in one epoch. Cheap to copy; block 0 (four words) is computed
// up front because the standard transforms use at most three words.
class SampleRng {
 public:
  SampleRng() : SampleRng(0, 0, 0) {}
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index)
      : seed_(seed),
        epoch_(epoch),
        index_(index),
        first_(data_philox(seed, RngStream::kAugment, epoch, index, 0)) {}

  uint64_t seed() const { return seed_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t index() const { return index_; }

  // The k-th random 32-bit word of this sample.
  uint32_t word(uint32_t k) const {
    if (k < 4) return first_.c[k];
    return data_philox(seed_, RngStream::kAugment, epoch_, index_, k / 4).c[k % 4];
  }
  // A uniform integer in [0, n) from word k (multiply-shift: no modulo, bias below 2^-32 * n).
  uint32_t below(uint32_t k, uint32_t n) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(word(k)) * n) >> 32);
  }
  // A uniform float in [0, 1) from word k.
  float uniform(uint32_t k) const { return uint_to_unit_float(word(k)); }

 private:
  uint64_t seed_, epoch_, index_;
  Philox4x32 first_;
};

}  // namespace ddplab::data
