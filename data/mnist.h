// MNIST and Fashion-MNIST, from IDX files (http://yann.lecun.com/exdb/mnist/), gzipped or not.
//
// IDX: a 4-byte magic number (two zero bytes, a type code, 0x08 = unsigned byte, and the number
// of dimensions), then one big-endian 32-bit size per dimension, then the data row-major.
// Images are magic 0x00000803 with dims [N, 28, 28]; labels 0x00000801 with dims [N].
//
// File names are the official ones: {train,t10k}-images-idx3-ubyte and
// {train,t10k}-labels-idx1-ubyte, each optionally ending in .gz. Debian's dataset-fashion-mnist
// package installs Fashion-MNIST at /usr/share/datasets/fashion-mnist.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace ddplab::data {

// A decoded IDX file of unsigned bytes.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
// Reads an IDX file of type 0x08 (unsigned byte); `expected_ndim` > 0 checks the magic number's
// dimension count. Throws naming the file and what is wrong (magic, truncation, extra bytes).
IdxArray read_idx(const std::string& path, int expected_ndim = 0);

class MNIST : public ImageDataset {
 public:
  MNIST(const std::string& root, bool train, Transform transform = {});
  static constexpr const char* kUrl = "http://yann.lecun.com/exdb/mnist/";

 protected:
  // Shared by the Fashion-MNIST subclass: `name` and `hint` go into the error messages.
  MNIST(const std::string& root, bool train, Transform transform, const char* name,
        const char* hint, std::vector<std::string> classes);
};

class FashionMNIST : public MNIST {
 public:
  FashionMNIST(const std::string& root, bool train, Transform transform = {});
  static constexpr const char* kDebianRoot = "/usr/share/datasets/fashion-mnist";
};

}  // namespace ddplab::data
