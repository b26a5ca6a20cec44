// IDX reader and the MNIST / Fashion-MNIST datasets.
#include "data/mnist.h"

#include <cstdint>
#include <cstdio>

#include "data/file_io.h"
#include "tensor/error.h"

namespace ddplab::data {

namespace {

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_ndim) {
  std::vector<uint8_t> bytes = read_file(path);
  DDP_CHECK(bytes.size() >= 4, path << ": truncated: " << bytes.size()
                                    << " bytes, too short for the 4-byte IDX magic number");
  const uint32_t magic = read_be32(bytes.data());
  const int ndim = static_cast<int>(magic & 0xFF);
  DDP_CHECK((magic >> 8) == 0x08 && ndim >= 1,
            path << ": wrong magic number 0x" << hex8(magic)
                 << " at offset 0: an IDX file of unsigned bytes starts with 0x0000080N "
                 << "(N = number of dimensions); is this an IDX file?");
  DDP_CHECK(expected_ndim == 0 || ndim == expected_ndim,
            path << ": wrong magic number 0x" << hex8(magic) << " at offset 0: " << ndim
                 << " dimensions, expected " << expected_ndim << " (0x0000080" << expected_ndim
                 << "); images and labels swapped?");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  DDP_CHECK(bytes.size() >= header, path << ": truncated: the header needs " << header
                                         << " bytes, the file has " << bytes.size());
  IdxArray out;
  size_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    out.dims.push_back(read_be32(bytes.data() + 4 + 4 * d));
    // A crafted header's sizes can multiply past 2^64 and wrap to a small count that the file
    // size would then "confirm"; refuse the overflow before it happens.
    const size_t dim = out.dims.back();
    DDP_CHECK(dim == 0 || count <= (SIZE_MAX - header) / dim,
              path << ": the header's dimensions overflow (dimension " << d << " = " << dim
                   << " at offset " << 4 + 4 * d << "); the file is corrupt or not IDX");
    count *= dim;
  }
  DDP_CHECK(bytes.size() >= header + count, path << ": truncated: the header promises " << count
                                                 << " data bytes from offset " << header
                                                 << ", the data ends at offset " << bytes.size());
  DDP_CHECK(bytes.size() == header + count,
            path << ": " << bytes.size() - header - count << " unexpected bytes after offset "
                 << header + count << " (the header promises " << count << " data bytes)");
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

MNIST::MNIST(const std::string& root, bool train, Transform transform)
    : MNIST(root, train, std::move(transform), "MNIST",
            "Download the four files from http://yann.lecun.com/exdb/mnist/ (or a mirror) into ",
            {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}) {}

FashionMNIST::FashionMNIST(const std::string& root, bool train, Transform transform)
    : MNIST(root, train, std::move(transform), "Fashion-MNIST",
            "On Debian: apt install dataset-fashion-mnist (installs it at "
            "/usr/share/datasets/fashion-mnist); or download the four files from "
            "https://github.com/zalandoresearch/fashion-mnist into ",
            {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
             "Bag", "Ankle boot"}) {}

MNIST::MNIST(const std::string& root, bool train, Transform transform, const char* name,
             const char* hint, std::vector<std::string> classes) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_name = prefix + "-images-idx3-ubyte";
  const std::string labels_name = prefix + "-labels-idx1-ubyte";
  DDP_CHECK(dir_exists(root), name << " not found: the directory " << root << " does not exist. "
                                   << hint << root << ".");
  const std::string images = first_existing(root, {images_name, images_name + ".gz"});
  const std::string labels = first_existing(root, {labels_name, labels_name + ".gz"});
  DDP_CHECK(!images.empty() && !labels.empty(),
            name << " not found: " << join_path(root, images.empty() ? images_name : labels_name)
                 << "[.gz] does not exist. " << hint << root << ".");

  IdxArray im = read_idx(images, 3);
  IdxArray lb = read_idx(labels, 1);
  DDP_CHECK(im.dims[0] == lb.dims[0], name << ": record count mismatch: " << images << " holds "
                                           << im.dims[0] << " images but " << labels << " holds "
                                           << lb.dims[0] << " labels");
  labels_.reserve(lb.data.size());
  for (size_t i = 0; i < lb.data.size(); ++i) {
    DDP_CHECK(lb.data[i] < classes.size(), labels << ": label " << int{lb.data[i]}
                                                  << " at byte offset " << 8 + i
                                                  << " is not a class 0-9");
    labels_.push_back(lb.data[i]);
  }
  pixels_ = std::move(im.data);
  shape_ = {1, im.dims[1], im.dims[2]};
  layout_ = Layout::kCHW;
  classes_ = std::move(classes);
  transform_ = std::move(transform);
  finish_loading(name);
}

}  // namespace ddplab::data
