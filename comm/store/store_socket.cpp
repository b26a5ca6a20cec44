// TCP helpers (see store_socket.h). All waits go through poll() with a deadline.
#include "comm/store/store_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tensor/error.h"

namespace ddplab::distributed::net {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

namespace {

struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) freeaddrinfo(head);
  }
};

void resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out.head);
  DDP_CHECK(rc == 0, "cannot resolve host '" << host << "': " << gai_strerror(rc));
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

}  // namespace

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfo ai;
  resolve(host, port, /*passive=*/true, ai);
  std::string last = "no address";
  for (addrinfo* a = ai.head; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    int one = 1;
    // SO_REUSEADDR lets a restarted job rebind a port whose old connections are in TIME_WAIT.
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), backlog) == 0) {
      set_nonblocking(fd.get());
      return fd;
    }
    last = std::strerror(errno);
  }
  DDP_FAIL("cannot listen on " << host << ":" << port << ": " << last);
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  DDP_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0,
            "getsockname failed: " << std::strerror(errno));
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

int pick_free_port(const std::string& host) {
  Fd fd = listen_tcp(host, 0, 1);
  return local_port(fd.get());
}

Fd connect_tcp(const std::string& host, int port, Clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(10);
  std::string last = "timed out";
  for (;;) {
    AddrInfo ai;
    resolve(host, port, /*passive=*/false, ai);
    for (addrinfo* a = ai.head; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd) continue;
      set_nonblocking(fd.get());
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, std::max(1, remaining_ms(deadline))) == 1) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
      }
      last = std::strerror(errno);
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  DDP_FAIL("could not connect to " << host << ":" << port << " before the timeout (last error: "
                                   << last << "); is the store server running there?");
}

bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline,
              const std::string& where) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    DDP_CHECK(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
              "send to " << where << " failed: " << std::strerror(errno));
    pollfd pfd{fd, POLLOUT, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) return false;
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& where) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    DDP_CHECK(k != 0, "connection to " << where << " closed by the peer");
    if (errno == EINTR) continue;
    DDP_CHECK(errno == EAGAIN || errno == EWOULDBLOCK,
              "recv from " << where << " failed: " << std::strerror(errno));
    pollfd pfd{fd, POLLIN, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) return false;
  }
  return true;
}

}  // namespace ddplab::distributed::net
