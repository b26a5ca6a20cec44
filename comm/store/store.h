// Key-value stores through which processes find each other (rendezvous): the Store interface,
// TCPStore (a client, optionally hosting the server in a background thread), and PrefixStore.
//
// Like PyTorch's c10d stores: get() and wait() block until the keys exist or the store's timeout
// passes; add() is an atomic integer counter stored as decimal text; compare_set() is atomic.
// Process groups use a PrefixStore per group so their keys never collide.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/store_socket.h"

namespace ddplab::distributed {

class TCPStoreServer;

constexpr std::chrono::milliseconds kDefaultStoreTimeout{300000};  // 5 min, as in PyTorch

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until `key` exists, then returns its value; throws ddplab::Error after timeout().
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer at `key` (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value equals `expected` (a missing key equals an empty
  // `expected`); returns the value after the operation.
  virtual std::vector<uint8_t> compare_set(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) = 0;
  // Blocks until every key exists; throws ddplab::Error naming the keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // True when every key exists right now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  virtual std::chrono::milliseconds timeout() const { return timeout_; }
  virtual void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // String conveniences over the byte API.
  void set(const std::string& key, const std::string& value);
  std::string get_string(const std::string& key);

 private:
  std::chrono::milliseconds timeout_;
};

// A TCP client of a TCPStoreServer; with is_server it also hosts the server in this process.
// Thread-safe: one request at a time per TCPStore object. The token defaults to the env var
// DDPLAB_STORE_TOKEN (empty when unset); client and server must agree. A server with a token
// serves only clients that present it (docs/store.md, "Security model").
class TCPStore : public Store {
 public:
  TCPStore(std::string host, int port, bool is_server = false,
           std::chrono::milliseconds timeout = kDefaultStoreTimeout,
           std::optional<std::string> token = std::nullopt);
  ~TCPStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::set;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  // The server's port (the one picked when constructed with port 0 and is_server).
  int port() const { return port_; }
  // The token this client presents (and its server, if it hosts one, requires).
  const std::string& token() const { return token_; }
  // The hosted server's counters; null when this client hosts no server.
  const TCPStoreServer* server() const { return server_.get(); }

 private:
  // Sends one request frame and returns the reply payload (status byte stripped). A timeout
  // throws `timeout_msg` and drops the connection, which also cancels a parked request.
  std::vector<uint8_t> rpc(const std::vector<uint8_t>& frame, std::chrono::milliseconds timeout,
                           const std::string& what);
  void connect(net::Clock::time_point deadline);
  std::string where() const { return host_ + ":" + std::to_string(port_); }

  std::string host_;
  int port_;
  std::string token_;
  std::unique_ptr<TCPStoreServer> server_;
  std::mutex mu_;
  net::Fd conn_;
};

// Namespaces every key as prefix + "/" + key over a shared base store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::set;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  // Counts the keys of the whole base store, as PyTorch's PrefixStore does.
  int64_t num_keys() override;
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) override { base_->set_timeout(t); }

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ddplab::distributed
