// DType names, sizes and promotion.
#include "tensor/dtype.h"

#include "tensor/error.h"

namespace ddplab {

size_t element_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::Float16:
      return 2;
    case DType::BFloat16:
      return 2;
    case DType::Int64:
      return 8;
    case DType::Int32:
      return 4;
    case DType::UInt8:
      return 1;
    case DType::Bool:
      return 1;
  }
  DDP_FAIL("element_size: bad dtype " << static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int64:
      return "int64";
    case DType::Int32:
      return "int32";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool}) {
    if (name == dtype_name(t)) return t;
  }
  DDP_FAIL("unknown dtype '" << name << "'");
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Rank by "kind" first (bool < integer < float), then by width within the kind.
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool:
        return 0;
      case DType::UInt8:
        return 1;
      case DType::Int32:
        return 2;
      case DType::Int64:
        return 3;
      case DType::Float16:
        return 4;
      case DType::BFloat16:
        return 4;
      case DType::Float32:
        return 5;
      case DType::Float64:
        return 6;
    }
    return 0;
  };
  // float16 with bfloat16 has no exact common 16-bit type: use float32, as PyTorch does.
  if ((a == DType::Float16 && b == DType::BFloat16) ||
      (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace ddplab
