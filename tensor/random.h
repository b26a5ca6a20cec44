// Counter-based random numbers: Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011).
//
// Philox maps (counter, key) to four random 32-bit words with no state to carry between calls, so
// element i of a random tensor is a pure function of (seed, offset, i). The CPU loop and the CUDA
// kernel therefore produce the same numbers, in any order, on any number of threads. A Generator
// only remembers the seed and how many counters earlier calls consumed.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/macros.h"

namespace ddplab {

struct Philox4x32 {
  uint32_t c[4];
};

// One Philox 4x32-10 block: 10 rounds of multiply-xor with a Weyl-sequence key schedule.
DDP_HD Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key increments (golden ratio, sqrt 3)
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.c[1] ^ k0, lo1, hi0 ^ ctr.c[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The four words of block `index` of the stream (seed, offset).
DDP_HD Philox4x32 philox_block(uint64_t seed, uint64_t offset, uint64_t index) {
  uint64_t n = offset + index;
  Philox4x32 ctr{{static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A uniform float in [0, 1) from 24 random bits (every value exactly representable).
DDP_HD float uint_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * 5.9604644775390625e-08f;
}
// A uniform double in [0, 1) from 53 random bits.
DDP_HD double uints_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((uint64_t{1} << 53) - 1)) * 1.1102230246251565e-16;
}

// The random distributions, and element i of each as a pure function of (seed, offset, i): the
// CPU loop and the CUDA kernel both call random_element, so they produce the same tensor.
enum class RandomKind { Uniform, Normal, Bernoulli, UniformInt };

// Philox blocks a tensor of n elements consumes (4 words per block; Normal and UniformInt use 2).
DDP_HD uint64_t random_blocks(RandomKind kind, uint64_t n) {
  return (kind == RandomKind::Normal || kind == RandomKind::UniformInt) ? (n + 1) / 2 : (n + 3) / 4;
}

// Uniform: a + (b - a) u; Normal: mean a, std b (Box-Muller); Bernoulli: 1 with probability a;
// UniformInt: an integer in [a, b).
DDP_HD double random_element(RandomKind kind, uint64_t seed, uint64_t offset, uint64_t i, double a,
                             double b) {
  switch (kind) {
    case RandomKind::Uniform: {
      Philox4x32 r = philox_block(seed, offset, i / 4);
      return a + (b - a) * static_cast<double>(uint_to_unit_float(r.c[i % 4]));
    }
    case RandomKind::Bernoulli: {
      Philox4x32 r = philox_block(seed, offset, i / 4);
      return static_cast<double>(uint_to_unit_float(r.c[i % 4])) < a ? 1.0 : 0.0;
    }
    case RandomKind::Normal: {
      Philox4x32 r = philox_block(seed, offset, i / 2);
      uint32_t w0 = r.c[2 * (i % 2)], w1 = r.c[2 * (i % 2) + 1];
      // u1 in (0, 1] so that log(u1) is finite.
      double u1 = (static_cast<double>(w0 >> 8) + 1.0) * 5.9604644775390625e-08;
      double u2 = static_cast<double>(w1 >> 8) * 5.9604644775390625e-08;
      return a + b * ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
    }
    case RandomKind::UniformInt: {
      Philox4x32 r = philox_block(seed, offset, i / 2);
      uint64_t v = (static_cast<uint64_t>(r.c[2 * (i % 2)]) << 32) | r.c[2 * (i % 2) + 1];
      uint64_t range = static_cast<uint64_t>(b - a);
      return a + static_cast<double>(v % range);
    }
  }
  return 0;
}

// Seed and consumed-counter offset. Each random op advances the offset past the blocks it used.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Reserves `blocks` Philox blocks; returns the offset of the first.
  uint64_t consume(uint64_t blocks) {
    uint64_t o = offset_;
    offset_ += blocks;
    return o;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide default generator (seed 0 until manual_seed is called).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace ddplab
