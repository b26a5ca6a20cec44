// The TCPStore server loop (see store_server.h): accept, read frames, execute, reply, park waiters.
#include "distributed/store/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "distributed/store/store_protocol.h"
#include "tensor/error.h"

namespace ddplab::distributed {

using protocol::Op;
using protocol::ProtocolError;
using protocol::Reader;
using protocol::Status;
using protocol::Writer;
using Bytes = std::vector<uint8_t>;

namespace {

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
  explicit StoreState(std::string token) : token_(std::move(token)) {}

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
          log_close(c, "wrong store token");
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

  // Rate-limited one-line log, so a flood of bad clients cannot flood stderr.
  void log_close(const Conn& c, const std::string& reason) {
    ++closed_;
    if (closed_ <= 20 || closed_ % 1000 == 0)
      std::cerr << "ddplab store: closing connection from " << c.peer << ": " << reason
                << (closed_ > 20 ? " (" + std::to_string(closed_) + " closed so far)" : "")
                << std::endl;
  }

 private:
  static std::string key_of(Reader& r) { return r.str(protocol::kMaxKeyBytes, "key"); }
  static void end(const Reader& r) {
    if (!r.done()) throw ProtocolError{"trailing bytes after the request"};
  }
  static void reply(Conn& c, Writer& w) { c.out = w.finish(), c.out_off = 0; }
  static void reply(Conn& c, Writer&& w) { reply(c, w); }
  static void reply_error(Conn& c, const std::string& msg) {
    reply(c, Writer().u8(uint8_t(Status::kError)).str(msg));
  }

  std::map<std::string, Bytes> data_;
  std::string token_;
  uint64_t closed_ = 0;
};

}  // namespace

TCPStoreServer::TCPStoreServer(const std::string& host, int port, std::string token)
    : token_(std::move(token)) {
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

void TCPStoreServer::run() {
  StoreState state(token_);
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<pollfd> fds;
  std::vector<uint8_t> chunk(64 * 1024);
  for (;;) {
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    for (auto& c : conns) {
      // Read only when ready for the next request: bounds each connection's buffer to one frame.
      bool want_read = !c->parked && c->out.empty() && !c->close_after_flush;
      short ev = POLLRDHUP | (want_read ? POLLIN : 0) | (c->out.empty() ? 0 : POLLOUT);
      fds.push_back({c->fd.get(), ev, 0});
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        auto c = std::make_unique<Conn>();
        c->fd.reset(fd);
        c->peer = peer_name(fd);
        conns.push_back(std::move(c));
      }
    }
    bool data_changed = false;
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      Conn& c = *conns[i];
      short re = fds[i + 2].revents;
      bool drop = false;
      if (re & POLLOUT) {
        ssize_t k = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0)
          c.out_off += size_t(k);
        else if (errno != EAGAIN && errno != EINTR)
          drop = true;
        if (c.out_off == c.out.size()) {
          c.out.clear();
          c.out_off = 0;
          drop = drop || c.close_after_flush;
        }
      }
      if (!drop && (re & POLLIN)) {
        ssize_t k = ::recv(c.fd.get(), chunk.data(), chunk.size(), MSG_DONTWAIT);
        if (k == 0)
          drop = true;  // orderly close; not worth a log line
        else if (k > 0)
          c.in.insert(c.in.end(), chunk.begin(), chunk.begin() + k);
        else if (errno != EAGAIN && errno != EINTR)
          drop = true;
      } else if (!drop && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
        drop = true;  // e.g. a client that gave up on a parked get
      }
      // Execute at most one complete request; the next waits until its reply has drained. This
      // runs even without new input: a pipelined frame may already sit in the buffer.
      if (!drop && c.in.size() >= 4 && !c.parked && c.out.empty()) {
        uint32_t len = protocol::decode_u32(c.in.data());
        if (len == 0 || len > protocol::kMaxFrameBytes) {
          state.log_close(c, "frame length " + std::to_string(len) + " is out of bounds");
          drop = true;
        } else if (c.in.size() >= 4 + size_t(len)) {
          try {
            state.execute(c, c.in.data() + 4, len);
            data_changed = true;
            c.in.erase(c.in.begin(), c.in.begin() + 4 + len);
          } catch (const ProtocolError& e) {
            state.log_close(c, e.reason);
            drop = true;
          }
        }
      }
      if (drop) c.fd.reset();
    }
    // Drop closed connections; answer parked waiters whose keys now exist.
    std::vector<std::unique_ptr<Conn>> alive;
    for (auto& c : conns) {
      if (!c->fd) continue;
      if (data_changed && c->parked) state.try_unpark(*c);
      alive.push_back(std::move(c));
    }
    conns.swap(alive);
  }
}

}  // namespace ddplab::distributed
