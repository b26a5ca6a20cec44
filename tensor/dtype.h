// Element types of a tensor and the compile-time map between DType and C++ types.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "tensor/half.h"

namespace ddplab {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8, Bool };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kBool = DType::Bool;

size_t element_size(DType t);
const char* dtype_name(DType t);  // PyTorch's spelling: "float32", "int64", ...
DType dtype_from_name(const std::string& name);
bool is_floating(DType t);
// The type two operands compute in: the wider float wins, float beats int (as in PyTorch).
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

// C++ type <-> DType: dtype_of<float>::value == kFloat32, and so on.
template <class T>
struct dtype_of;
#define DDP_DEFINE_DTYPE_OF(TYPE, ENUM)         \
  template <>                                   \
  struct dtype_of<TYPE> {                       \
    static constexpr DType value = DType::ENUM; \
  };
DDP_DEFINE_DTYPE_OF(float, Float32)
DDP_DEFINE_DTYPE_OF(double, Float64)
DDP_DEFINE_DTYPE_OF(Half, Float16)
DDP_DEFINE_DTYPE_OF(BFloat16, BFloat16)
DDP_DEFINE_DTYPE_OF(int64_t, Int64)
DDP_DEFINE_DTYPE_OF(int32_t, Int32)
DDP_DEFINE_DTYPE_OF(uint8_t, UInt8)
DDP_DEFINE_DTYPE_OF(bool, Bool)
#undef DDP_DEFINE_DTYPE_OF

// The type arithmetic is done in: 16-bit floats compute in float32.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

}  // namespace ddplab

// Runs the body with `scalar_t` bound to the C++ type of `dtype`.
#define DDP_DTYPE_CASE(ENUM, TYPE, ...) \
  case ::ddplab::DType::ENUM: {         \
    using scalar_t = TYPE;              \
    __VA_ARGS__;                        \
    break;                              \
  }

// The case lists: the floating dtypes, the numeric ones (floating and integer, not bool), all.
#define DDP_FLOATING_CASES(...)                        \
  DDP_DTYPE_CASE(Float32, float, __VA_ARGS__)          \
  DDP_DTYPE_CASE(Float64, double, __VA_ARGS__)         \
  DDP_DTYPE_CASE(Float16, ::ddplab::Half, __VA_ARGS__) \
  DDP_DTYPE_CASE(BFloat16, ::ddplab::BFloat16, __VA_ARGS__)

#define DDP_NUMERIC_CASES(...)                \
  DDP_FLOATING_CASES(__VA_ARGS__)             \
  DDP_DTYPE_CASE(Int64, int64_t, __VA_ARGS__) \
  DDP_DTYPE_CASE(Int32, int32_t, __VA_ARGS__) \
  DDP_DTYPE_CASE(UInt8, uint8_t, __VA_ARGS__)

#define DDP_ALL_CASES(...)       \
  DDP_NUMERIC_CASES(__VA_ARGS__) \
  DDP_DTYPE_CASE(Bool, bool, __VA_ARGS__)

#define DDP_DISPATCH_FLOATING(dtype, what, ...)                                             \
  switch (dtype) {                                                                          \
    DDP_FLOATING_CASES(__VA_ARGS__)                                                         \
    default:                                                                                \
      DDP_FAIL(what << ": expected a floating dtype, got " << ::ddplab::dtype_name(dtype)); \
  }

// Arithmetic dispatch: every dtype except bool (bool only flows through copy, fill, where and the
// outputs of predicates). Used by both executors.
#define DDP_DISPATCH_NUMERIC(dtype, what, ...)                                       \
  switch (dtype) {                                                                   \
    DDP_NUMERIC_CASES(__VA_ARGS__)                                                   \
    default:                                                                         \
      DDP_FAIL(what << ": not supported for dtype " << ::ddplab::dtype_name(dtype)); \
  }

#define DDP_DISPATCH_ALL(dtype, what, ...)     \
  switch (dtype) {                             \
    DDP_ALL_CASES(__VA_ARGS__)                 \
    default:                                   \
      DDP_FAIL(what << ": unsupported dtype"); \
  }
