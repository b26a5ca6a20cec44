// Whole-file reads with transparent gzip, through zlib.
#include "data/file_io.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "tensor/error.h"

namespace ddplab::data {

namespace {

// zlib prefixes its messages with the path; ours already start with it.
std::string strip_path(const std::string& msg, const std::string& path) {
  const std::string prefix = path + ": ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
}

}  // namespace

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string first_existing(const std::string& dir, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    std::string p = join_path(dir, n);
    if (file_exists(p)) return p;
  }
  return "";
}

std::vector<uint8_t> read_file(const std::string& path) {
  DDP_CHECK(file_exists(path), path << ": no such file");
  // gzopen reads plain files unchanged too ("transparent" mode), so one path serves both.
  gzFile f = gzopen(path.c_str(), "rb");
  DDP_CHECK(f != nullptr, path << ": cannot open: " << std::strerror(errno));
  gzbuffer(f, 1 << 20);
  std::vector<uint8_t> out;
  constexpr size_t kChunk = 1 << 22;
  for (;;) {
    size_t old = out.size();
    out.resize(old + kChunk);
    int n = gzread(f, out.data() + old, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int code = 0;
      std::string msg = strip_path(gzerror(f, &code), path);
      gzclose(f);
      DDP_FAIL(path << ": read failed after " << old << " decompressed bytes: " << msg
                    << " (the file is corrupt or truncated; download it again)");
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) break;
  }
  // A gzip stream cut short reads as a clean end of file on some zlib versions; gzerror then
  // reports Z_BUF_ERROR ("unexpected end of file").
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  std::string err = strip_path(msg ? msg : "", path);
  gzclose(f);
  DDP_CHECK(code == Z_OK || code == Z_STREAM_END,
            path << ": read failed after " << out.size() << " decompressed bytes: " << err
                 << " (the file is corrupt or truncated; download it again)");
  return out;
}

}  // namespace ddplab::data
