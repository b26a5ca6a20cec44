// TorchTCPStore: a client of PyTorch's own TCPStore server, so that ddplab's workers can join the
// store that torchrun's agent already hosts (TORCHELASTIC_USE_AGENT_STORE=True) instead of
// hosting one of their own on a port the agent holds. It implements ddplab's Store interface, so
// init_process_group, Gloo's rendezvous and the process groups' monitors use it unchanged.
//
// Note [PyTorch's TCPStore wire protocol]
// ddplab's own store (store_protocol.h) sends length-prefixed frames; PyTorch's does not. A
// request is one byte naming the query, followed by its fields back to back; the reply (when
// there is one) is the bare value. Numbers are in the host's byte order (little-endian on every
// machine PyTorch ships for, so we write little-endian), strings and byte arrays are a u64
// length and the bytes. PyTorch's client sends every key with "/" in front, and so do we, so
// that a key names the same entry for a PyTorch process and for ours. The query numbers are the
// positions in c10d's `QueryType` enum:
//
//   query            number  request fields          reply
//   VALIDATE          0      u32 magic 0x3C85F7CE    none (a wrong magic: the server drops us)
//   SET               1      key, value              none
//   COMPARE_SET       2      key, expected, desired  value after (see compare_set below)
//   GET               3      key                     value (empty if missing: WAIT first)
//   ADD               4      key, i64 delta          i64 new value
//   CHECK             5      u64 n, n keys           u8: 0 all exist, 1 not yet
//   WAIT              6      u64 n, n keys           u8 0, sent once every key exists
//   GETNUMKEYS        7      -                       i64
//   DELETE_KEY        8      key                     i64 keys deleted (0 or 1)
//   CANCEL_WAIT      12      -                       u8 1 (after the 0 of a WAIT it raced with)
//   PING             13      u32 nonce               u32 the same nonce
//
// A connection starts with VALIDATE: both of PyTorch's servers (the libuv one, its default since
// 2.4 and torchrun's agent store, and the older poll() one behind use_libuv=False) take the first
// query of a connection as the validation and nothing else. A PING then proves the server is
// alive and speaks this protocol. GET never blocks on the server (libuv answers a missing key
// with an empty value, the older server drops the connection), so a blocking get() is a WAIT
// followed by a GET, as in PyTorch's client. A WAIT that times out on our side is cancelled with
// CANCEL_WAIT, which keeps the connection in step.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/store_socket.h"

namespace ddplab::distributed {

class TorchTCPStore : public Store {
 public:
  // Connects (retrying until `timeout`, so the server may start later) and validates.
  TorchTCPStore(std::string host, int port,
                std::chrono::milliseconds timeout = kDefaultStoreTimeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::set;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  // PyTorch's server differs from ours in one case: for a missing key and a non-empty
  // `expected` it sets nothing and returns `expected` (ours returns the empty value).
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  using Bytes = std::vector<uint8_t>;
  using Deadline = net::Clock::time_point;

  void connect(Deadline deadline);
  // Now + timeout, after (re)connecting when the last query dropped the connection.
  Deadline connected(std::chrono::milliseconds timeout);
  // The building blocks of every query. Each needs the lock held and a connection; a timeout or
  // a broken connection drops the connection (the next query reconnects) and throws.
  void send(const Bytes& request, Deadline deadline, const std::string& what);
  void recv(void* out, size_t n, Deadline deadline, const std::string& what);
  bool try_recv(void* out, size_t n, Deadline deadline, const std::string& what);  // false: timeout
  int64_t recv_i64(Deadline deadline, const std::string& what);
  Bytes recv_bytes(Deadline deadline, const std::string& what);
  // WAIT for `keys`; false when `timeout` passed (the wait then cancelled on the server).
  bool wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  [[noreturn]] void fail(const std::string& why);
  std::string where() const { return host_ + ":" + std::to_string(port_); }

  std::string host_;
  int port_;
  std::mutex mu_;  // one query at a time: replies carry no id, so they must not interleave
  net::Fd conn_;
};

}  // namespace ddplab::distributed
