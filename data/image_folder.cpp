// ImageFolder: decode a class-per-folder tree with stb_image.
#include "data/image_folder.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>

#include <stb/stb_image.h>

#include "data/file_io.h"
#include "tensor/error.h"

namespace ddplab::data {

namespace {

// Entries of `dir` (no "." or ".."), sorted so labels and sample order do not depend on the
// file system's listing order.
std::vector<std::string> list_dir(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), &closedir);
  DDP_CHECK(d != nullptr, "ImageFolder: cannot list " << dir << ": " << std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = readdir(d.get())) {
    if (e->d_name[0] == '.') continue;  // ".", "..", and hidden files
    names.emplace_back(e->d_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_image_name(const std::string& name) {
  static const char* kExts[] = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".pgm", ".ppm"};
  std::string lower = name;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* ext : kExts) {
    size_t n = std::strlen(ext);
    if (lower.size() > n && lower.compare(lower.size() - n, n, ext) == 0) return true;
  }
  return false;
}

}  // namespace

ImageFolder::ImageFolder(const std::string& root, Transform transform, int channels) {
  DDP_CHECK(channels == 1 || channels == 3,
            "ImageFolder: channels must be 1 or 3, got " << channels);
  DDP_CHECK(dir_exists(root), "ImageFolder: the directory "
                                  << root << " does not exist. Put one subfolder per class "
                                  << "in it, holding that class's images (root/cat/1.png, ...)");
  for (const auto& name : list_dir(root))
    if (dir_exists(join_path(root, name))) classes_.push_back(name);
  DDP_CHECK(!classes_.empty(), "ImageFolder: " << root << " has no class subfolders; expected "
                                               << "root/<class>/<image>.png");
  for (size_t label = 0; label < classes_.size(); ++label) {
    const std::string dir = join_path(root, classes_[label]);
    size_t found = 0;
    for (const auto& name : list_dir(dir)) {
      const std::string path = join_path(dir, name);
      if (!is_image_name(name) || !file_exists(path)) continue;
      int w = 0, h = 0, file_channels = 0;
      // stb converts to the requested channel count, so gray and RGB files can be mixed.
      std::unique_ptr<stbi_uc, void (*)(void*)> img(
          stbi_load(path.c_str(), &w, &h, &file_channels, channels), &stbi_image_free);
      DDP_CHECK(img != nullptr,
                "ImageFolder: cannot decode " << path << ": " << stbi_failure_reason());
      if (paths_.empty()) {
        shape_ = {channels, h, w};
      } else {
        DDP_CHECK(h == shape_.height && w == shape_.width,
                  "ImageFolder: " << path << " is " << w << "x" << h << " (width x height) but "
                                  << paths_.front() << " is " << shape_.width << "x"
                                  << shape_.height << "; all images must have one size "
                                  << "(resize them beforehand)");
      }
      const size_t n = static_cast<size_t>(shape_.numel());
      pixels_.insert(pixels_.end(), img.get(), img.get() + n);
      labels_.push_back(static_cast<int64_t>(label));
      paths_.push_back(path);
      ++found;
    }
    DDP_CHECK(found > 0, "ImageFolder: the class folder " << dir << " has no images "
                                                          << "(.png, .jpg, .jpeg, .bmp, ...)");
  }
  layout_ = Layout::kHWC;
  transform_ = std::move(transform);
  finish_loading("ImageFolder " + root);
}

}  // namespace ddplab::data
