// 16-bit floating types: IEEE half (float16) and bfloat16.
//
// They are storage formats: every op converts to float, computes, and rounds back (round to
// nearest even), on the CPU and on the GPU alike, so both executors give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/macros.h"

namespace ddplab {

namespace detail {
DDP_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
DDP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
}  // namespace detail

struct Half {
  uint16_t x = 0;
  Half() = default;
  DDP_HD Half(float f) : x(from_float(f)) {}  // NOLINT(google-explicit-constructor)
  template <class T>
  DDP_HD explicit Half(T v) : x(from_float(static_cast<float>(v))) {}
  DDP_HD operator float() const { return to_float(x); }  // NOLINT(google-explicit-constructor)

  static DDP_HD Half from_bits(uint16_t b) {
    Half h;
    h.x = b;
    return h;
  }
  // Bit-exact float -> half with round-to-nearest-even, subnormals, inf and NaN.
  static DDP_HD uint16_t from_float(float f) {
    uint32_t u = detail::float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u)
      return static_cast<uint16_t>(sign | (absu > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (absu < 0x38800000u) {                                               // subnormal half
      // Add 0.5 (as a float) so the FPU's own rounding performs round-to-nearest-even.
      float shifted = detail::bits_float(absu) + 0.5f;
      return static_cast<uint16_t>(sign | (detail::float_bits(shifted) - 0x3f000000u));
    }
    uint32_t mant_odd = (absu >> 13) & 1u;
    absu += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    return static_cast<uint16_t>(sign | (absu >> 13));
  }
  static DDP_HD float to_float(uint16_t h) {
    uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24
      return sign ? -v : v;
    }
    return detail::bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  DDP_HD BFloat16(float f) : x(from_float(f)) {}  // NOLINT(google-explicit-constructor)
  template <class T>
  DDP_HD explicit BFloat16(T v) : x(from_float(static_cast<float>(v))) {}
  DDP_HD operator float() const {
    return detail::bits_float(static_cast<uint32_t>(x) << 16);
  }  // NOLINT

  static DDP_HD BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.x = b;
    return h;
  }
  static DDP_HD uint16_t from_float(float f) {
    uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                   // round to nearest even
    return static_cast<uint16_t>(u >> 16);
  }
};

}  // namespace ddplab
