// Lab 7's file operations (fileio.h).
#include "fileio.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "nn/safetensors.h"
#include "tensor/error.h"

namespace lab7::io {

namespace {

std::vector<std::string> g_log;
std::map<int, std::string> g_open;  // fd -> path, so the log names files, not numbers
bool g_crash = false;               // crash_halfway_through_next_write
int g_delay_ms = 0;

const std::string& path_of(int fd) {
  auto it = g_open.find(fd);
  DDP_CHECK(it != g_open.end(), "lab7::io: file descriptor " << fd << " is not open");
  return it->second;
}

}  // namespace

int create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0, "cannot create '" << path << "': " << std::strerror(errno));
  g_open[fd] = path;
  g_log.push_back("create " + path);
  return fd;
}

void write_all(int fd, const std::string& bytes) {
  const std::string& path = path_of(fd);
  g_log.push_back("write " + path + " " + std::to_string(bytes.size()));
  if (g_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(g_delay_ms));
  size_t left = g_crash ? bytes.size() / 2 : bytes.size();
  const char* p = bytes.data();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    DDP_CHECK(w > 0, "cannot write '" << path << "': " << std::strerror(w == 0 ? ENOSPC : errno));
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (g_crash) {
    std::fprintf(stderr, "lab7::io: SIGKILL after writing %zu of %zu bytes of %s\n",
                 bytes.size() / 2, bytes.size(), path.c_str());
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

void fsync(int fd) {
  const std::string& path = path_of(fd);
  DDP_CHECK(::fsync(fd) == 0, "fsync of '" << path << "' failed: " << std::strerror(errno));
  g_log.push_back("fsync " + path);
}

void close(int fd) {
  const std::string path = path_of(fd);
  g_open.erase(fd);
  DDP_CHECK(::close(fd) == 0, "closing '" << path << "' failed: " << std::strerror(errno));
  g_log.push_back("close " + path);
}

void rename(const std::string& from, const std::string& to) {
  DDP_CHECK(std::rename(from.c_str(), to.c_str()) == 0,
            "cannot rename '" << from << "' to '" << to << "': " << std::strerror(errno));
  g_log.push_back("rename " + from + " " + to);
}

void fsync_dir(const std::string& dir) {
  // The library fsyncs the folder a path is in; "dir/" is a path in `dir`.
  ddplab::nn::fsync_parent_dir(dir + "/");
  g_log.push_back("fsync_dir " + dir);
}

void remove(const std::string& path) {
  DDP_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT,
            "cannot remove '" << path << "': " << std::strerror(errno));
  g_log.push_back("remove " + path);
}

const std::vector<std::string>& log() {
  return g_log;
}
void clear_log() {
  g_log.clear();
}
void crash_halfway_through_next_write() {
  g_crash = true;
}
void delay_writes(int milliseconds) {
  g_delay_ms = milliseconds;
}

}  // namespace lab7::io
