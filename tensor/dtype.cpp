// DType names, sizes and promotion.
#include "tensor/dtype.h"

#include <iterator>

#include "tensor/error.h"

namespace ddplab {

namespace {

struct DTypeInfo {
  DType type;
  const char* name;  // PyTorch's spelling
  size_t size;       // bytes per element
  // Promotion order: by kind first (bool < integer < float), then by width within the kind.
  int rank;
};

// One row per DType, in the enum's order (so a DType indexes it).
constexpr DTypeInfo kDTypes[] = {
    {DType::Float32, "float32", 4, 5}, {DType::Float64, "float64", 8, 6},
    {DType::Float16, "float16", 2, 4}, {DType::BFloat16, "bfloat16", 2, 4},
    {DType::Int64, "int64", 8, 3},     {DType::Int32, "int32", 4, 2},
    {DType::UInt8, "uint8", 1, 1},     {DType::Bool, "bool", 1, 0},
};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].type) != i) return false;
  }
  return std::size(kDTypes) == static_cast<size_t>(DType::Bool) + 1;
}
static_assert(rows_in_enum_order(), "kDTypes must list every DType in the enum's order");

// The row of `t`, or nullptr for a value outside the enum (a corrupt or uninitialised DType).
const DTypeInfo* info(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

}  // namespace

size_t element_size(DType t) {
  const DTypeInfo* row = info(t);
  DDP_CHECK(row != nullptr, "element_size: bad dtype " << static_cast<int>(t));
  return row->size;
}

const char* dtype_name(DType t) {
  const DTypeInfo* row = info(t);
  return row != nullptr ? row->name : "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& row : kDTypes) {
    if (name == row.name) return row.type;
  }
  DDP_FAIL("unknown dtype '" << name << "'");
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    const DTypeInfo* row = info(t);
    return row != nullptr ? row->rank : 0;
  };
  // float16 with bfloat16 has no exact common 16-bit type: use float32, as PyTorch does.
  if ((a == DType::Float16 && b == DType::BFloat16) ||
      (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace ddplab
