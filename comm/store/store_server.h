// The TCPStore server: one background thread that serves every client with poll() over
// non-blocking sockets.
//
// Why a single poll loop: a thread per connection would let a client that stalls mid-frame hold a
// thread forever; here a stalled client only keeps its own half-read buffer. get/wait requests
// whose keys do not exist yet are parked on their connection and answered when a later set/add/
// compare_set creates the keys; the client enforces its own timeout by closing the connection.
//
// Hostile or broken clients (see docs/store.md, "Security model") cost the server little:
//   - before its hello is accepted a connection may make the server buffer at most
//     kMaxUnauthenticatedBytes, and it is closed if the hello does not come within hello_timeout;
//   - at most max_connections are open; more are closed at once, with a log line;
//   - a connection holds at most one request and one reply at a time; a client that stops reading
//     its replies is closed once a reply has made no progress for send_timeout;
//   - when accept() fails for lack of file descriptors, the server logs it and stops accepting
//     for a growing pause (up to 1 s) instead of spinning on a listening socket that stays ready.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "comm/store/store_socket.h"

namespace ddplab::distributed {

// What an unauthenticated connection may make the server buffer: a hello frame is about 1 KiB
// (its token at most protocol::kMaxTokenBytes), so 4 KiB is plenty and costs nothing.
constexpr size_t kMaxUnauthenticatedBytes = 4096;

struct StoreServerOptions {
  // Open connections at most; each rank and agent holds one or two. DDPLAB_STORE_MAX_CONNECTIONS.
  size_t max_connections = 1024;
  // A connection that has not sent an accepted hello by then is closed.
  std::chrono::milliseconds hello_timeout{10000};
  // A connection whose pending reply has made no progress for this long is closed: its client
  // does not read (a client that timed out closes its connection instead).
  std::chrono::milliseconds send_timeout{60000};

  // The defaults, with max_connections from DDPLAB_STORE_MAX_CONNECTIONS when set.
  static StoreServerOptions from_environment();
};

// Counters for tests and diagnostics; read while the server runs.
struct StoreServerStats {
  size_t connections = 0;                 // open now
  size_t buffered_bytes = 0;              // request and reply bytes held for all connections now
  size_t peak_unauthenticated_bytes = 0;  // the most one unauthenticated connection ever held
  uint64_t refused_connections = 0;       // closed at accept: max_connections reached
  uint64_t hello_timeouts = 0;            // closed: no hello within hello_timeout
  uint64_t send_timeouts = 0;             // closed: the client did not read its reply
  uint64_t accept_failures = 0;           // accept() failed for lack of descriptors or memory
};

class TCPStoreServer {
 public:
  // Binds host:port (port 0 = pick a free one) and starts serving. `token`: when non-empty,
  // clients must present the same token in their hello (see DDPLAB_STORE_TOKEN).
  TCPStoreServer(const std::string& host, int port, std::string token,
                 StoreServerOptions options = StoreServerOptions::from_environment());
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }
  StoreServerStats stats() const;

 private:
  void run();

  net::Fd listen_fd_;
  net::Fd wake_read_, wake_write_;  // self-pipe: the destructor wakes poll() to stop
  std::string token_;
  StoreServerOptions options_;
  int port_ = 0;
  // Written by the server thread once per loop, read by stats().
  std::atomic<size_t> connections_{0}, buffered_bytes_{0}, peak_unauthenticated_bytes_{0};
  std::atomic<uint64_t> refused_{0}, hello_timeouts_{0}, send_timeouts_{0}, accept_failures_{0};
  std::thread thread_;
};

}  // namespace ddplab::distributed
