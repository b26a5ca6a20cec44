// Small TCP helpers for the store and the launcher: an owning fd, listen/connect with deadlines,
// and send/recv loops that give up at a deadline instead of blocking forever.
#pragma once

#include <chrono>
#include <string>

namespace ddplab::distributed::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Binds and listens on host:port (port 0 = any free port), non-blocking. `host` is an address or
// name; "0.0.0.0" / "::" bind all interfaces and only when asked for explicitly.
Fd listen_tcp(const std::string& host, int port, int backlog = 128);

// The port a bound socket got.
int local_port(int fd);

// A currently free port on `host` (bound and released at once; a race is possible but rare).
int pick_free_port(const std::string& host);

// Connects to host:port, retrying with exponential back-off (10 ms .. 1 s) until `deadline`.
// Throws ddplab::Error naming host:port and the last error when the deadline passes.
Fd connect_tcp(const std::string& host, int port, Clock::time_point deadline);

// Send/receive exactly `n` bytes before `deadline`. Return false on timeout; throw ddplab::Error
// when the peer closes or the socket fails (`where` names the peer in the message).
bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline,
              const std::string& where);
bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& where);

void set_nonblocking(int fd);

}  // namespace ddplab::distributed::net
