// ImageFolder: images sorted into one subfolder per class, as torchvision.datasets.ImageFolder.
//
//   root/cat/001.png
//   root/cat/002.jpg
//   root/dog/xyz.png
//
// Class names are the subfolder names sorted; a class's label is its position in that order.
// Files are decoded once, at construction, with stb_image (PNG, JPEG, BMP, GIF, TGA, PNM), and
// kept as uint8 HWC bytes. Every image must have the same size (there is no resize: resize the
// images beforehand); a different one is an error naming its path.
#pragma once

#include <string>

#include "data/dataset.h"

namespace ddplab::data {

class ImageFolder : public ImageDataset {
 public:
  // channels: 3 (RGB; gray images are expanded) or 1 (gray; color images are converted).
  explicit ImageFolder(const std::string& root, Transform transform = {}, int channels = 3);
  // The file each sample came from.
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::vector<std::string> paths_;
};

}  // namespace ddplab::data
