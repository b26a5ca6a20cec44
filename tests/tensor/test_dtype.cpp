// float16/bfloat16 conversions against known bit patterns; dtype names and promotion.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tensor/dtype.h"
#include "tensor/error.h"

using namespace ddplab;

TEST_CASE("half: known bit patterns, rounding, subnormals, inf and nan") {
  CHECK(Half(1.0f).x == 0x3C00);
  CHECK(Half(-2.0f).x == 0xC000);
  CHECK(Half(65504.0f).x == 0x7BFF);                 // largest finite half
  CHECK(Half(65520.0f).x == 0x7C00);                 // rounds to inf
  CHECK(Half(5.9604644775390625e-08f).x == 0x0001);  // smallest subnormal
  CHECK(Half(0.0f).x == 0x0000);
  CHECK(Half(-0.0f).x == 0x8000);
  CHECK(Half(std::numeric_limits<float>::infinity()).x == 0x7C00);
  CHECK(std::isnan(static_cast<float>(Half(NAN))));
  // 1 + 2^-11 is exactly halfway between 1 and the next half (1 + 2^-10): ties to even -> 1.
  CHECK(Half(1.0f + 0.00048828125f).x == 0x3C00);
  CHECK(Half(1.0f + 3 * 0.00048828125f).x == 0x3C02);  // tie rounds up to the even 0x3C02
  for (uint32_t b = 0; b < 0x7C00; b += 7) {           // every finite half converts back exactly
    Half h = Half::from_bits(static_cast<uint16_t>(b));
    CHECK(Half(static_cast<float>(h)).x == b);
  }
}

TEST_CASE("bfloat16: known bit patterns and round to nearest even") {
  CHECK(BFloat16(1.0f).x == 0x3F80);
  CHECK(BFloat16(-3.0f).x == 0xC040);
  CHECK(static_cast<float>(BFloat16::from_bits(0x4049)) == doctest::Approx(3.140625));
  CHECK(BFloat16(1.0f + 1.0f / 256).x == 0x3F80);  // halfway: ties to even (down)
  CHECK(BFloat16(1.0f + 3.0f / 256).x == 0x3F82);  // halfway: ties to even (up)
  CHECK(std::isnan(static_cast<float>(BFloat16(NAN))));
}

TEST_CASE("dtype names, sizes and promotion") {
  CHECK(std::string(dtype_name(kBFloat16)) == "bfloat16");
  CHECK(dtype_from_name("int64") == kInt64);
  CHECK(element_size(kFloat16) == 2);
  CHECK(element_size(kInt64) == 8);
  CHECK(promote_types(kInt64, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kFloat16, kBFloat16) == kFloat32);
  CHECK(promote_types(kBool, kUInt8) == kUInt8);
  CHECK(promote_types(kInt32, kInt64) == kInt64);
  CHECK(promote_types(kFloat16, kFloat32) == kFloat32);
  CHECK_THROWS_AS(dtype_from_name("float8"), Error);
}
