// ImageFolder: class-per-folder PNGs written with stb_image_write, decoded with stb_image.
#include <filesystem>

#include <doctest/doctest.h>
#include <stb/stb_image_write.h>

#include "data/image_folder.h"
#include "test_util.h"

using namespace ddplab;
using namespace ddplab::data;
using namespace ddplab::data::testing;

namespace {

// A width x height RGB image whose bytes encode (seed, position), written as PNG.
void write_png(const std::string& path, int width, int height, int seed) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::vector<uint8_t> px(static_cast<size_t>(width * height * 3));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(seed * 50 + i * 3);
  REQUIRE(stbi_write_png(path.c_str(), width, height, 3, px.data(), width * 3) != 0);
}

}  // namespace

TEST_CASE("ImageFolder: sorted class names become labels; HWC pixels become CHW floats") {
  TempDir dir;
  // Written out of order on purpose: classes and files are sorted by name.
  write_png(dir / "dog/b.png", 4, 3, 3);
  write_png(dir / "dog/a.png", 4, 3, 2);
  write_png(dir / "cat/2.png", 4, 3, 1);
  write_png(dir / "cat/1.png", 4, 3, 0);
  write_bytes(dir / "cat/notes.txt", {'h', 'i'});  // not an image: skipped
  ImageFolder ds(dir.path());
  REQUIRE(ds.size() == 4);
  CHECK(ds.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(ds.labels() == std::vector<int64_t>{0, 0, 1, 1});
  CHECK(ds.paths()[2] == dir / "dog/a.png");
  CHECK(ds.sample_shape() == Shape{3, 3, 4});
  for (int64_t i = 0; i < 4; ++i) {
    Example ex = ds.get(i);
    const float* p = ex.image.data_ptr<float>();
    // Pixel (y, x) channel c was byte (y*4 + x)*3 + c of image i's file.
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 4; ++x) {
          auto byte = static_cast<uint8_t>(i * 50 + ((y * 4 + x) * 3 + c) * 3);
          REQUIRE(p[(c * 3 + y) * 4 + x] == static_cast<float>(byte) / 255.0f);
        }
  }
  ImageFolder gray(dir.path(), Transform(), 1);
  CHECK(gray.sample_shape() == Shape{1, 3, 4});
}

TEST_CASE("ImageFolder errors") {
  TempDir dir;
  SUBCASE("an image of another size names its path") {
    write_png(dir / "a/1.png", 4, 3, 0);
    write_png(dir / "b/1.png", 4, 3, 0);
    write_png(dir / "b/2.png", 5, 3, 0);
    std::string err = error_of([&] { ImageFolder(dir.path()); });
    CHECK(contains(err, dir / "b/2.png"));
    CHECK(contains(err, "5x3"));
    CHECK(contains(err, "4x3"));
  }
  SUBCASE("an undecodable file names its path") {
    write_png(dir / "a/1.png", 4, 3, 0);
    write_bytes(dir / "a/2.png", {1, 2, 3, 4});
    std::string err = error_of([&] { ImageFolder(dir.path()); });
    CHECK(contains(err, dir / "a/2.png"));
  }
  SUBCASE("missing root, no classes, empty class") {
    CHECK(contains(error_of([&] { ImageFolder(dir / "nowhere"); }), "does not exist"));
    CHECK(contains(error_of([&] { ImageFolder(dir.path()); }), "no class subfolders"));
    write_png(dir / "a/1.png", 4, 3, 0);
    std::filesystem::create_directories(dir / "b");
    CHECK(contains(error_of([&] { ImageFolder(dir.path()); }), dir / "b"));
  }
}
