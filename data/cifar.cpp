// CIFAR-10/100 binary readers.
#include "data/cifar.h"

#include <cstring>
#include <fstream>

#include "data/file_io.h"
#include "tensor/error.h"

namespace ddplab::data {

namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

// The folder holding `probe`: root itself, or the tarball's folder under root.
std::string find_root(const std::string& root, const std::string& subdir, const std::string& probe,
                      const char* name, const char* url) {
  if (file_exists(join_path(root, probe))) return root;
  std::string nested = join_path(root, subdir);
  if (file_exists(join_path(nested, probe))) return nested;
  DDP_FAIL(name << " not found: neither " << join_path(root, probe) << " nor "
                << join_path(nested, probe) << " exists. Download the binary version from " << url
                << " and extract it under " << root << " (tar xzf " << std::strrchr(url, '/') + 1
                << " -C " << root << ").");
}

}  // namespace

void read_cifar_file(const std::string& path, int label_bytes, int64_t num_classes,
                     int64_t expected_records, std::vector<uint8_t>& pixels,
                     std::vector<int64_t>& labels) {
  const std::vector<uint8_t> bytes = read_file(path);
  const int64_t rec = label_bytes + kPixels;
  const int64_t n = static_cast<int64_t>(bytes.size()) / rec;
  const int64_t tail = static_cast<int64_t>(bytes.size()) % rec;
  DDP_CHECK(tail == 0, path << ": truncated: record " << n << " at byte offset " << n * rec
                            << " has only " << tail << " of its " << rec << " bytes (file size "
                            << bytes.size() << ")");
  DDP_CHECK(expected_records == 0 || n == expected_records,
            path << ": record count mismatch: the file holds " << n << " records of " << rec
                 << " bytes, expected " << expected_records);
  DDP_CHECK(n > 0, path << ": the file is empty");
  const size_t base = pixels.size();
  pixels.resize(base + static_cast<size_t>(n * kPixels));
  labels.reserve(labels.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* r = bytes.data() + i * rec;
    // CIFAR-100: byte 0 is the coarse label, byte 1 the fine one; CIFAR-10 has only byte 0.
    const int64_t label = r[label_bytes - 1];
    DDP_CHECK(label < num_classes, path << ": record " << i << " at byte offset " << i * rec
                                        << " has label " << label << ", expected below "
                                        << num_classes << " (is this the right dataset?)");
    if (label_bytes == 2)
      DDP_CHECK(r[0] < 20, path << ": record " << i << " at byte offset " << i * rec
                                << " has coarse label " << int{r[0]} << ", expected below 20");
    labels.push_back(label);
    std::memcpy(pixels.data() + base + static_cast<size_t>(i * kPixels), r + label_bytes,
                static_cast<size_t>(kPixels));
  }
}

CIFAR10::CIFAR10(const std::string& root, bool train, Transform transform, bool check_counts) {
  const std::string dir =
      find_root(root, "cifar-10-batches-bin", train ? "data_batch_1.bin" : "test_batch.bin",
                "CIFAR-10", kUrl);
  std::vector<std::string> files;
  if (train) {
    for (int k = 1; k <= 5; ++k) files.push_back("data_batch_" + std::to_string(k) + ".bin");
  } else {
    files.push_back("test_batch.bin");
  }
  for (const auto& f : files) {
    std::string path = join_path(dir, f);
    DDP_CHECK(file_exists(path), "CIFAR-10: " << path << " is missing (the training set is "
                                              << "data_batch_1.bin .. data_batch_5.bin); "
                                              << "download " << kUrl << " again");
    read_cifar_file(path, 1, 10, check_counts ? 10000 : 0, pixels_, labels_);
  }
  shape_ = {3, 32, 32};
  layout_ = Layout::kCHW;
  classes_ = {"airplane", "automobile", "bird",  "cat",  "deer",
              "dog",      "frog",       "horse", "ship", "truck"};
  transform_ = std::move(transform);
  finish_loading("CIFAR-10");
}

CIFAR100::CIFAR100(const std::string& root, bool train, Transform transform, bool check_counts) {
  const std::string file = train ? "train.bin" : "test.bin";
  const std::string dir = find_root(root, "cifar-100-binary", file, "CIFAR-100", kUrl);
  read_cifar_file(join_path(dir, file), 2, 100, check_counts ? (train ? 50000 : 10000) : 0, pixels_,
                  labels_);
  shape_ = {3, 32, 32};
  layout_ = Layout::kCHW;
  // The tarball names the fine classes one per line; fall back to numbers without it.
  std::ifstream names(join_path(dir, "fine_label_names.txt"));
  for (std::string line; std::getline(names, line);)
    if (!line.empty()) classes_.push_back(line);
  if (classes_.size() != 100) {
    classes_.clear();
    for (int k = 0; k < 100; ++k) classes_.push_back(std::to_string(k));
  }
  transform_ = std::move(transform);
  finish_loading("CIFAR-100");
}

}  // namespace ddplab::data
