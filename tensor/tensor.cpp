// Tensor metadata, element access for tests, and printing.
#include "tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "tensor/ops.h"

namespace ddplab {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return st;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  DDP_CHECK(dim >= lo && dim <= hi, what << ": dim " << dim << " out of range for a " << ndim
                                         << "-d tensor (expected " << lo << " to " << hi << ")");
  return dim < 0 ? dim + (ndim == 0 ? 1 : ndim) : dim;
}

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[wrap_dim(d, dim(), "stride")];
}
int64_t Tensor::numel() const {
  return shape_numel(shape());
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  storage().ensure_strided();  // Note [Blocked activations] in tensor/blocked.cpp
  return static_cast<char*>(storage().data()) + offset_bytes();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = ops::contiguous(ops::to(ops::to(*this, kCPU), dtype_of<T>::value));
  std::vector<T> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(static_cast<void*>(out.data()), c.raw_data(), c.nbytes());
  return out;
}

template <>
std::vector<bool> Tensor::to_vector() const {
  std::vector<uint8_t> bytes = to_vector<uint8_t>();
  return std::vector<bool>(bytes.begin(), bytes.end());
}

template <class T>
T Tensor::item() const {
  DDP_CHECK(numel() == 1,
            "item: expected a tensor with one element, got shape " << shape_str(shape()));
  return to_vector<T>()[0];
}

#define DDP_INSTANTIATE_ACCESS(T)                    \
  template std::vector<T> Tensor::to_vector() const; \
  template T Tensor::item() const;
template bool Tensor::item() const;
DDP_INSTANTIATE_ACCESS(float)
DDP_INSTANTIATE_ACCESS(double)
DDP_INSTANTIATE_ACCESS(Half)
DDP_INSTANTIATE_ACCESS(BFloat16)
DDP_INSTANTIATE_ACCESS(int64_t)
DDP_INSTANTIATE_ACCESS(int32_t)
DDP_INSTANTIATE_ACCESS(uint8_t)
#undef DDP_INSTANTIATE_ACCESS

// --- printing
// --------------------------------------------------------------------------------------
namespace {

constexpr int64_t kPrintThreshold = 1000;  // above this many elements, elide the middle
constexpr int64_t kEdgeItems = 3;

struct Printer {
  const std::vector<double>& v;
  const Shape& shape;
  Shape strides;
  bool floating, boolean, elide;
  int width;
  int precision;
  bool scientific;

  std::string fmt(double x) const {
    std::ostringstream os;
    if (boolean) return x != 0 ? "True" : "False";
    if (!floating) {
      os << static_cast<long long>(x);
    } else if (std::isnan(x)) {
      os << "nan";
    } else if (std::isinf(x)) {
      os << (x > 0 ? "inf" : "-inf");
    } else if (scientific) {
      os << std::scientific << std::setprecision(precision) << x;
    } else {
      os << std::fixed << std::setprecision(precision) << x;
    }
    return os.str();
  }

  void print(std::ostream& os, size_t dim, int64_t base, int indent) const {
    if (dim == shape.size()) {
      std::string s = fmt(v[base]);
      os << std::string(width > static_cast<int>(s.size()) ? width - s.size() : 0, ' ') << s;
      return;
    }
    os << '[';
    int64_t n = shape[dim];
    for (int64_t i = 0; i < n; ++i) {
      if (elide && n > 2 * kEdgeItems && i == kEdgeItems) {
        os << "...";
        i = n - kEdgeItems - 1;
        os << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
        continue;
      }
      print(os, dim + 1, base + i * strides[dim], indent + 1);
      if (i + 1 < n) {
        if (dim + 1 == shape.size()) {
          os << ", ";
        } else {
          os << ',' << std::string(shape.size() - dim - 1, '\n') << std::string(indent + 1, ' ');
        }
      }
    }
    os << ']';
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> values = to_vector<double>();
  Printer p{values,
            shape(),
            contiguous_strides(shape()),
            is_floating(dtype()),
            dtype() == kBool,
            numel() > kPrintThreshold,
            0,
            4,
            false};
  // Pick fixed or scientific notation from the range of finite magnitudes, as PyTorch does.
  double lo = INFINITY, hi = 0;
  for (double x : values) {
    if (std::isfinite(x) && x != 0) {
      lo = std::min(lo, std::fabs(x));
      hi = std::max(hi, std::fabs(x));
    }
  }
  if (p.floating && hi > 0 && (hi >= 1e8 || lo < 1e-4 || hi / lo > 1e3)) {
    p.scientific = true;
  }
  for (double x : values) p.width = std::max(p.width, static_cast<int>(p.fmt(x).size()));
  std::ostringstream os;
  os << "tensor(";
  p.print(os, 0, 0, 7);
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype())
     << ", device=" << device() << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.str();
}

}  // namespace ddplab
