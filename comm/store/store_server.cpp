// The TCPStore server loop (see store_server.h): accept, read frames, execute, reply, park waiters.
#include "comm/store/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "comm/store/store_protocol.h"
#include "tensor/error.h"

namespace ddplab::distributed {

using protocol::Op;
using protocol::ProtocolError;
using protocol::Reader;
using protocol::Status;
using protocol::Writer;
using Bytes = std::vector<uint8_t>;

namespace {

using Clock = net::Clock;

struct Conn {
  net::Fd fd;
  std::string peer;
  Bytes in;   // bytes received but not yet parsed (at most one frame plus a read)
  Bytes out;  // reply being written; no new request is parsed until it drains
  size_t out_off = 0;
  bool authed = false;
  bool close_after_flush = false;
  // A parked kGet/kWait: answered when all `wait_keys` exist.
  bool parked = false;
  Op parked_op = Op::kWait;
  std::vector<std::string> wait_keys;
  Clock::time_point accepted;      // the hello must arrive within hello_timeout of this
  Clock::time_point out_progress;  // when the pending reply was queued or last moved
};

// One-line messages on stderr, rate-limited so that a flood of bad clients cannot flood the log:
// the first 20, then every 1000th with the running count.
class ServerLog {
 public:
  void line(const std::string& msg) {
    ++lines_;
    if (lines_ <= 20 || lines_ % 1000 == 0)
      std::cerr << "ddplab store: " << msg
                << (lines_ > 20 ? " (" + std::to_string(lines_) + " such messages so far)" : "")
                << std::endl;
  }
  void close(const Conn& c, const std::string& reason) {
    line("closing connection from " + c.peer + ": " + reason);
  }

 private:
  uint64_t lines_ = 0;
};

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  return std::string(buf) + ":" + std::to_string(port);
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

std::string to_string(const Bytes& b) {
  return std::string(b.begin(), b.end());
}
Bytes to_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

// StoreState: the key-value map and the execution of requests against it (replies, parked
// waiters, the token check). No sockets here: TCPStoreServer::run owns those.
class StoreState {
 public:
  StoreState(std::string token, ServerLog& log) : token_(std::move(token)), log_(log) {}

  // Executes one request payload for `c`; leaves a reply in c.out or parks c.
  void execute(Conn& c, const uint8_t* payload, size_t n) {
    Reader r(payload, n);
    uint8_t raw = r.u8();
    if (raw < uint8_t(Op::kHello) || raw > uint8_t(Op::kNumKeys))
      throw ProtocolError{"unknown opcode " + std::to_string(raw)};
    Op op = static_cast<Op>(raw);
    if (!c.authed && op != Op::kHello)
      throw ProtocolError{"first request must be hello, got opcode " + std::to_string(raw)};
    switch (op) {
      case Op::kHello: {
        if (c.authed) throw ProtocolError{"second hello"};
        uint32_t magic = r.u32(), version = r.u32();
        std::string token = r.str(protocol::kMaxTokenBytes, "token");
        end(r);
        if (magic != protocol::kMagic || version != protocol::kVersion)
          throw ProtocolError{"bad magic or protocol version " + std::to_string(version)};
        if (!equal_constant_time(token, token_)) {
          reply_error(c, "store token mismatch: set the same DDPLAB_STORE_TOKEN on every process");
          c.close_after_flush = true;
          log_.close(c, "wrong store token");
          return;
        }
        c.authed = true;
        reply(c, Writer().u8(uint8_t(Status::kOk)));
        return;
      }
      case Op::kSet: {
        std::string key = key_of(r);
        Bytes value = r.bytes(protocol::kMaxValueBytes, "value");
        end(r);
        data_[key] = std::move(value);
        reply(c, Writer().u8(uint8_t(Status::kOk)));
        return;
      }
      case Op::kGet:
      case Op::kWait: {
        std::vector<std::string> keys;
        if (op == Op::kGet) {
          keys.push_back(key_of(r));
        } else {
          uint32_t count = r.u32();
          if (count > protocol::kMaxKeysPerRequest)
            throw ProtocolError{"wait on " + std::to_string(count) + " keys exceeds the limit"};
          for (uint32_t i = 0; i < count; ++i) keys.push_back(key_of(r));
        }
        end(r);
        c.parked = true;
        c.parked_op = op;
        c.wait_keys = std::move(keys);
        try_unpark(c);
        return;
      }
      case Op::kAdd: {
        std::string key = key_of(r);
        int64_t delta = r.i64();
        end(r);
        int64_t value = delta;
        auto it = data_.find(key);
        if (it != data_.end()) {
          try {
            value = std::stoll(to_string(it->second)) + delta;
          } catch (const std::exception&) {
            reply_error(c, "add: the value of key '" + key + "' is not an integer");
            return;
          }
        }
        data_[key] = to_bytes(std::to_string(value));
        reply(c, Writer().u8(uint8_t(Status::kOk)).i64(value));
        return;
      }
      case Op::kCompareSet: {
        std::string key = key_of(r);
        Bytes expected = r.bytes(protocol::kMaxValueBytes, "expected value");
        Bytes desired = r.bytes(protocol::kMaxValueBytes, "desired value");
        end(r);
        // PyTorch semantics: a missing key counts as matching an empty `expected`.
        auto it = data_.find(key);
        Bytes current;
        if (it == data_.end()) {
          if (expected.empty())
            current = data_[key] = desired;
          else
            current = expected;
        } else if (it->second == expected) {
          current = it->second = desired;
        } else {
          current = it->second;
        }
        reply(c, Writer().u8(uint8_t(Status::kOk)).bytes(current));
        return;
      }
      case Op::kCheck: {
        uint32_t count = r.u32();
        if (count > protocol::kMaxKeysPerRequest)
          throw ProtocolError{"check on " + std::to_string(count) + " keys exceeds the limit"};
        bool all = true;
        for (uint32_t i = 0; i < count; ++i) all = data_.count(key_of(r)) > 0 && all;
        end(r);
        reply(c, Writer().u8(uint8_t(Status::kOk)).u8(all));
        return;
      }
      case Op::kDelete: {
        std::string key = key_of(r);
        end(r);
        bool erased = data_.erase(key) > 0;
        reply(c, Writer().u8(uint8_t(Status::kOk)).u8(erased));
        return;
      }
      case Op::kNumKeys:
        end(r);
        reply(c, Writer().u8(uint8_t(Status::kOk)).i64(int64_t(data_.size())));
        return;
    }
  }

  // Answers a parked get/wait when its keys exist now.
  void try_unpark(Conn& c) {
    for (const auto& k : c.wait_keys)
      if (!data_.count(k)) return;
    c.parked = false;
    Writer w;
    w.u8(uint8_t(Status::kOk));
    if (c.parked_op == Op::kGet) w.bytes(data_[c.wait_keys[0]]);
    c.wait_keys.clear();
    reply(c, w);
  }

 private:
  static std::string key_of(Reader& r) { return r.str(protocol::kMaxKeyBytes, "key"); }
  static void end(const Reader& r) {
    if (!r.done()) throw ProtocolError{"trailing bytes after the request"};
  }
  static void reply(Conn& c, Writer& w) {
    c.out = w.finish();
    c.out_off = 0;
    c.out_progress = Clock::now();
  }
  static void reply(Conn& c, Writer&& w) { reply(c, w); }
  static void reply_error(Conn& c, const std::string& msg) {
    reply(c, Writer().u8(uint8_t(Status::kError)).str(msg));
  }

  std::map<std::string, Bytes> data_;
  std::string token_;
  ServerLog& log_;
};

}  // namespace

StoreServerOptions StoreServerOptions::from_environment() {
  StoreServerOptions o;
  if (const char* v = std::getenv("DDPLAB_STORE_MAX_CONNECTIONS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    DDP_CHECK(end != v && *end == '\0' && n >= 1,
              "DDPLAB_STORE_MAX_CONNECTIONS='" << v << "' is not a positive number");
    o.max_connections = static_cast<size_t>(n);
  }
  return o;
}

TCPStoreServer::TCPStoreServer(const std::string& host, int port, std::string token,
                               StoreServerOptions options)
    : token_(std::move(token)), options_(options) {
  listen_fd_ = net::listen_tcp(host, port);
  port_ = net::local_port(listen_fd_.get());
  int p[2];
  DDP_CHECK(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0, "TCPStore: pipe failed");
  wake_read_.reset(p[0]);
  wake_write_.reset(p[1]);
  thread_ = std::thread([this] { run(); });
}

TCPStoreServer::~TCPStoreServer() {
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &b, 1);
  if (thread_.joinable()) thread_.join();
}

StoreServerStats TCPStoreServer::stats() const {
  StoreServerStats s;
  s.connections = connections_.load();
  s.buffered_bytes = buffered_bytes_.load();
  s.peak_unauthenticated_bytes = peak_unauthenticated_bytes_.load();
  s.refused_connections = refused_.load();
  s.hello_timeouts = hello_timeouts_.load();
  s.send_timeouts = send_timeouts_.load();
  s.accept_failures = accept_failures_.load();
  return s;
}

namespace {

// Why a connection must be closed before its next request is even parsed, or "" when it is fine.
// Before the hello is accepted only a small hello frame is allowed, so that a client without the
// token cannot make the server hold a large frame.
std::string check_next_frame(const Conn& c) {
  if (c.in.size() < 4) return "";
  const uint32_t len = protocol::decode_u32(c.in.data());
  if (len == 0 || len > protocol::kMaxFrameBytes)
    return "frame length " + std::to_string(len) + " is out of bounds";
  if (c.authed) return "";
  if (4 + size_t(len) > kMaxUnauthenticatedBytes)
    return "a frame of " + std::to_string(len) + " bytes before the hello (a hello is at most " +
           std::to_string(kMaxUnauthenticatedBytes) + ")";
  if (c.in.size() > 4 && c.in[4] != uint8_t(Op::kHello))
    return "first request must be hello, got opcode " + std::to_string(c.in[4]);
  return "";
}

int poll_timeout_ms(Clock::time_point next, Clock::time_point now) {
  if (next == Clock::time_point::max()) return -1;
  if (next <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

}  // namespace

void TCPStoreServer::run() {
  ServerLog log;
  StoreState state(token_, log);
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<pollfd> fds;
  std::vector<uint8_t> chunk(64 * 1024);
  // While accept() fails for lack of descriptors the listening socket stays readable; polling it
  // would spin. So it is left out of poll() for a pause that doubles up to 1 s.
  constexpr std::chrono::milliseconds kFirstPause{50}, kMaxPause{1000};
  std::chrono::milliseconds accept_pause = kFirstPause;
  Clock::time_point accept_paused_until{};
  for (;;) {
    Clock::time_point now = Clock::now();
    const bool accepting = now >= accept_paused_until;
    Clock::time_point next = accepting ? Clock::time_point::max() : accept_paused_until;
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), short(accepting ? POLLIN : 0), 0});
    for (auto& c : conns) {
      // Read only when ready for the next request: bounds each connection's buffer to one frame.
      bool want_read = !c->parked && c->out.empty() && !c->close_after_flush;
      short ev = POLLRDHUP | (want_read ? POLLIN : 0) | (c->out.empty() ? 0 : POLLOUT);
      fds.push_back({c->fd.get(), ev, 0});
      if (!c->authed) next = std::min(next, c->accepted + options_.hello_timeout);
      if (!c->out.empty()) next = std::min(next, c->out_progress + options_.send_timeout);
    }
    if (::poll(fds.data(), fds.size(), poll_timeout_ms(next, now)) < 0) continue;  // EINTR
    if (fds[0].revents) return;
    now = Clock::now();
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;  // try the next one
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;     // none left
          ++accept_failures_;
          const bool out_of_fds = errno == EMFILE || errno == ENFILE;
          log.line(std::string("cannot accept a connection: ") + std::strerror(errno) + " (" +
                   std::to_string(conns.size()) + " connections open" +
                   (out_of_fds ? "; raise the limit with `ulimit -n`" : "") +
                   "); not accepting for " + std::to_string(accept_pause.count()) + " ms");
          accept_paused_until = now + accept_pause;
          accept_pause = std::min(accept_pause * 2, kMaxPause);
          break;
        }
        accept_pause = kFirstPause;
        auto c = std::make_unique<Conn>();
        c->fd.reset(fd);
        c->peer = peer_name(fd);
        if (conns.size() >= options_.max_connections) {
          ++refused_;
          log.close(*c, std::to_string(conns.size()) +
                            " connections are open, the most allowed "
                            "(DDPLAB_STORE_MAX_CONNECTIONS)");
          continue;  // c's destructor closes it
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->accepted = now;
        conns.push_back(std::move(c));
      }
    }
    bool data_changed = false;
    size_t peak_unauthenticated = peak_unauthenticated_bytes_.load();
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      Conn& c = *conns[i];
      short re = fds[i + 2].revents;
      bool drop = false;
      if (re & POLLOUT) {
        ssize_t k = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
          c.out_off += size_t(k);
          c.out_progress = now;
        } else if (errno != EAGAIN && errno != EINTR) {
          drop = true;
        }
        if (c.out_off == c.out.size()) {
          c.out.clear();
          c.out_off = 0;
          drop = drop || c.close_after_flush;
        }
      }
      if (!drop && (re & POLLIN)) {
        // Before the hello, read no more than the small bound allows (check_next_frame rejects a
        // longer frame as soon as its length prefix is in).
        size_t room = chunk.size();
        if (!c.authed)
          room = kMaxUnauthenticatedBytes - std::min(c.in.size(), kMaxUnauthenticatedBytes);
        ssize_t k = room == 0 ? 0 : ::recv(c.fd.get(), chunk.data(), room, MSG_DONTWAIT);
        if (k == 0)
          drop = true;  // orderly close (or an unauthenticated client over its bound)
        else if (k > 0)
          c.in.insert(c.in.end(), chunk.begin(), chunk.begin() + k);
        else if (errno != EAGAIN && errno != EINTR)
          drop = true;
        if (!c.authed) peak_unauthenticated = std::max(peak_unauthenticated, c.in.size());
      } else if (!drop && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
        drop = true;  // e.g. a client that gave up on a parked get
      }
      // Execute at most one complete request; the next waits until its reply has drained. This
      // runs even without new input: a pipelined frame may already sit in the buffer.
      if (!drop && !c.parked && c.out.empty()) {
        if (std::string why = check_next_frame(c); !why.empty()) {
          log.close(c, why);
          drop = true;
        } else if (c.in.size() >= 4) {
          const uint32_t len = protocol::decode_u32(c.in.data());
          if (c.in.size() >= 4 + size_t(len)) {
            try {
              state.execute(c, c.in.data() + 4, len);
              data_changed = true;
              c.in.erase(c.in.begin(), c.in.begin() + 4 + len);
            } catch (const ProtocolError& e) {
              log.close(c, e.reason);
              drop = true;
            }
          }
        }
      }
      // The deadlines: a hello that never comes, a reply that is never read.
      if (!drop && !c.authed && now - c.accepted >= options_.hello_timeout) {
        ++hello_timeouts_;
        log.close(c, "no hello within " + std::to_string(options_.hello_timeout.count()) + " ms");
        drop = true;
      }
      if (!drop && !c.out.empty() && now - c.out_progress >= options_.send_timeout) {
        ++send_timeouts_;
        log.close(c, "it has not read its reply for " +
                         std::to_string(options_.send_timeout.count()) + " ms");
        drop = true;
      }
      if (drop) c.fd.reset();
    }
    // Drop closed connections; answer parked waiters whose keys now exist.
    std::vector<std::unique_ptr<Conn>> alive;
    size_t buffered = 0;
    for (auto& c : conns) {
      if (!c->fd) continue;
      if (data_changed && c->parked) state.try_unpark(*c);
      buffered += c->in.size() + c->out.size();
      alive.push_back(std::move(c));
    }
    conns.swap(alive);
    connections_ = conns.size();
    buffered_bytes_ = buffered;
    peak_unauthenticated_bytes_ = peak_unauthenticated;
  }
}

}  // namespace ddplab::distributed
