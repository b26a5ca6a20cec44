// CIFAR-10 and CIFAR-100, binary versions (https://www.cs.toronto.edu/~kriz/cifar.html).
//
// CIFAR-10 binary: data_batch_1.bin .. data_batch_5.bin (train, 10000 records each) and
// test_batch.bin (10000). A record is 1 label byte then 3072 pixel bytes: the 1024 red values of
// the 32x32 image row by row, then the 1024 green, then the 1024 blue. That is channel-major
// (CHW) already, so a record's pixels are copied as they are.
// CIFAR-100 binary: train.bin (50000) and test.bin (10000); a record has 2 label bytes, the
// coarse (superclass, 0-19) then the fine label (0-99). We use the fine label, as torchvision.
//
// `root` is the extracted folder (cifar-10-batches-bin/, cifar-100-binary/) or its parent.
#pragma once

#include <string>

#include "data/dataset.h"

namespace ddplab::data {

class CIFAR10 : public ImageDataset {
 public:
  // check_counts: require the official record counts (10000 per file); off for small test files.
  CIFAR10(const std::string& root, bool train, Transform transform = {}, bool check_counts = true);
  static constexpr const char* kUrl = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
};

class CIFAR100 : public ImageDataset {
 public:
  CIFAR100(const std::string& root, bool train, Transform transform = {}, bool check_counts = true);
  static constexpr const char* kUrl = "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz";
};

// The records of one CIFAR binary file appended to `pixels`/`labels`. label_bytes is 1 (CIFAR-10)
// or 2 (CIFAR-100, the second byte is used); labels must be below num_classes; expected_records
// 0 accepts any count. Throws naming the file and byte offset of what is wrong.
void read_cifar_file(const std::string& path, int label_bytes, int64_t num_classes,
                     int64_t expected_records, std::vector<uint8_t>& pixels,
                     std::vector<int64_t>& labels);

}  // namespace ddplab::data
