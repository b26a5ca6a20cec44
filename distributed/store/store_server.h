// The TCPStore server: one background thread that serves every client with poll() over
// non-blocking sockets.
//
// Why a single poll loop: a thread per connection would let a client that stalls mid-frame hold a
// thread forever; here a stalled client only keeps its own half-read buffer. get/wait requests
// whose keys do not exist yet are parked on their connection and answered when a later set/add/
// compare_set creates the keys; the client enforces its own timeout by closing the connection.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "distributed/store/store_socket.h"

namespace ddplab::distributed {

class TCPStoreServer {
 public:
  // Binds host:port (port 0 = pick a free one) and starts serving. `token`: when non-empty,
  // clients must present the same token in their hello (see DDPLAB_STORE_TOKEN).
  TCPStoreServer(const std::string& host, int port, std::string token);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void run();

  net::Fd listen_fd_;
  net::Fd wake_read_, wake_write_;  // self-pipe: the destructor wakes poll() to stop
  std::string token_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace ddplab::distributed
