// TorchTCPStore: the client side of PyTorch's TCPStore protocol (see Note [PyTorch's TCPStore
// wire protocol] in torch_tcp_store.h).
#include "comm/store/torch_tcp_store.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <type_traits>

#include "tensor/error.h"

namespace ddplab::distributed {

namespace {

using Bytes = std::vector<uint8_t>;

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// c10d's QueryType values (its enum order); only the queries this client sends.
enum class Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kCancelWait = 12,
  kPing = 13,
};
constexpr uint8_t kCheckReady = 0;     // CheckResponseType::READY (1: NOT_READY)
constexpr uint8_t kWaitDone = 0;       // WaitResponseType::STOP_WAITING
constexpr uint8_t kWaitCancelled = 1;  // WaitResponseType::WAIT_CANCELED

// The server's bounds (TCPStoreLibUvBackend.cpp): beyond them it closes the connection without
// a word, so we refuse first and say why.
constexpr size_t kMaxKeyBytes = 8 * 1024;
constexpr size_t kMaxValueBytes = 8 * 1024 * 1024;
constexpr size_t kMaxKeysPerQuery = 128 * 1024;

// One request: the query byte, then its fields, little-endian.
class Request {
 public:
  explicit Request(Query q) { out_.push_back(static_cast<uint8_t>(q)); }
  template <typename T>
  Request& num(T v) {
    static_assert(std::is_integral_v<T>);
    const auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  // PyTorch's client puts "/" before every key (its keyPrefix_); we do too, so that a key means
  // the same to a PyTorch process and to ours.
  Request& key(const std::string& k) {
    DDP_CHECK(k.size() + 1 <= kMaxKeyBytes, "TorchTCPStore: key of "
                                                << k.size() << " bytes exceeds PyTorch's limit of "
                                                << kMaxKeyBytes - 1);
    num<uint64_t>(k.size() + 1);
    out_.push_back('/');
    out_.insert(out_.end(), k.begin(), k.end());
    return *this;
  }
  Request& value(const Bytes& v) {
    DDP_CHECK(v.size() <= kMaxValueBytes, "TorchTCPStore: value of "
                                              << v.size() << " bytes exceeds PyTorch's limit of "
                                              << kMaxValueBytes);
    num<uint64_t>(v.size());
    out_.insert(out_.end(), v.begin(), v.end());
    return *this;
  }
  Request& keys(const std::vector<std::string>& ks) {
    DDP_CHECK(ks.size() <= kMaxKeysPerQuery,
              "TorchTCPStore: " << ks.size() << " keys in one query exceed PyTorch's limit of "
                                << kMaxKeysPerQuery);
    num<uint64_t>(ks.size());
    for (const auto& k : ks) key(k);
    return *this;
  }
  const Bytes& bytes() const { return out_; }

 private:
  Bytes out_;
};

uint64_t little_endian(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string quoted(const std::vector<std::string>& keys) {
  std::ostringstream os;
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", '" : "'") << keys[i] << "'";
  return os.str();
}

}  // namespace

TorchTCPStore::TorchTCPStore(std::string host, int port, std::chrono::milliseconds timeout)
    : Store(timeout), host_(std::move(host)), port_(port) {
  DDP_CHECK(port_ > 0 && port_ <= 65535, "TorchTCPStore: " << port_ << " is not a TCP port");
  std::lock_guard<std::mutex> lock(mu_);
  connect(net::Clock::now() + timeout);
}

void TorchTCPStore::fail(const std::string& why) {
  conn_.reset();  // the stream may be mid-reply: never reuse it
  DDP_FAIL("TorchTCPStore: " << why << " at " << where()
                             << " (PyTorch's TCPStore, e.g. torchrun's agent store)");
}

void TorchTCPStore::connect(Deadline deadline) {
  // As PyTorch's client does, retry the whole handshake until the deadline: a server whose
  // listen backlog is full may accept the connection and drop it before our first query.
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    try {
      conn_ = net::connect_tcp(host_, port_, deadline);
    } catch (const Error& e) {
      fail(e.what());
    }
    const uint32_t nonce = static_cast<uint32_t>(::getpid());
    uint8_t echo[4];
    try {
      send(Request(Query::kValidate).num(kValidationMagic).bytes(), deadline, "validating");
      send(Request(Query::kPing).num(nonce).bytes(), deadline, "pinging");
      recv(echo, sizeof(echo), deadline, "waiting for the reply to a ping");
    } catch (const Error&) {
      if (net::Clock::now() >= deadline) throw;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      continue;
    }
    if (little_endian(echo, 4) != nonce)
      fail("the reply to a ping carried another number: is this a PyTorch TCPStore server?");
    return;
  }
}

TorchTCPStore::Deadline TorchTCPStore::connected(std::chrono::milliseconds timeout) {
  const Deadline deadline = net::Clock::now() + timeout;
  if (!conn_) connect(deadline);
  return deadline;
}

void TorchTCPStore::send(const Bytes& request, Deadline deadline, const std::string& what) {
  bool sent = false;
  try {
    sent = net::send_all(conn_.get(), request.data(), request.size(), deadline, where());
  } catch (const Error& e) {
    fail(std::string(e.what()) + " while " + what);
  }
  if (!sent) fail("timed out while " + what);
}

bool TorchTCPStore::try_recv(void* out, size_t n, Deadline deadline, const std::string& what) {
  try {
    return net::recv_all(conn_.get(), out, n, deadline, where());
  } catch (const Error& e) {
    fail(std::string(e.what()) + " while " + what);
  }
}

void TorchTCPStore::recv(void* out, size_t n, Deadline deadline, const std::string& what) {
  if (!try_recv(out, n, deadline, what)) fail("timed out while " + what);
}

int64_t TorchTCPStore::recv_i64(Deadline deadline, const std::string& what) {
  uint8_t b[8];
  recv(b, sizeof(b), deadline, what);
  return static_cast<int64_t>(little_endian(b, 8));
}

Bytes TorchTCPStore::recv_bytes(Deadline deadline, const std::string& what) {
  uint8_t b[8];
  recv(b, sizeof(b), deadline, what);
  const uint64_t n = little_endian(b, 8);
  if (n > kMaxValueBytes) fail("a reply of " + std::to_string(n) + " bytes while " + what);
  Bytes v(n);
  if (n > 0) recv(v.data(), n, deadline, what);
  return v;
}

bool TorchTCPStore::wait_locked(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) {
  const Deadline deadline = connected(timeout);
  const std::string what = "waiting for " + quoted(keys);
  send(Request(Query::kWait).keys(keys).bytes(), deadline, what);
  uint8_t reply = 0;
  if (try_recv(&reply, 1, deadline, what)) {
    if (reply != kWaitDone) fail("unexpected reply " + std::to_string(reply) + " to WAIT");
    return true;
  }
  // Withdraw the wait, so the server does not answer it later into our next query. The keys
  // may have arrived meanwhile: then the 0 of the wait comes before the cancel's 1.
  const Deadline grace =
      net::Clock::now() + std::min(this->timeout(), std::chrono::milliseconds(10000));
  send(Request(Query::kCancelWait).bytes(), grace, "cancelling a wait");
  recv(&reply, 1, grace, "cancelling a wait");
  if (reply == kWaitDone) recv(&reply, 1, grace, "cancelling a wait");
  if (reply != kWaitCancelled)
    fail("unexpected reply " + std::to_string(reply) + " to CANCEL_WAIT");
  return false;
}

void TorchTCPStore::set(const std::string& key, const Bytes& value) {
  Request r = Request(Query::kSet).key(key).value(value);
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  send(r.bytes(), deadline, "setting '" + key + "'");
}

Bytes TorchTCPStore::get(const std::string& key) {
  Request r = Request(Query::kGet).key(key);
  std::lock_guard<std::mutex> lock(mu_);
  if (!wait_locked({key}, timeout()))
    DDP_FAIL("TorchTCPStore: timed out after " << timeout().count() << " ms waiting for key '"
                                               << key << "' at " << where());
  const Deadline deadline = net::Clock::now() + timeout();
  const std::string what = "getting '" + key + "'";
  send(r.bytes(), deadline, what);
  return recv_bytes(deadline, what);
}

int64_t TorchTCPStore::add(const std::string& key, int64_t delta) {
  Request r = Request(Query::kAdd).key(key).num(delta);
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  const std::string what = "adding to '" + key + "'";
  send(r.bytes(), deadline, what);
  return recv_i64(deadline, what);
}

Bytes TorchTCPStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  Request r = Request(Query::kCompareSet).key(key).value(expected).value(desired);
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  const std::string what = "in compare_set of '" + key + "'";
  send(r.bytes(), deadline, what);
  return recv_bytes(deadline, what);
}

void TorchTCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!wait_locked(keys, timeout))
    DDP_FAIL("TorchTCPStore: timed out after " << timeout.count() << " ms waiting for key"
                                               << (keys.size() > 1 ? "s " : " ") << quoted(keys)
                                               << " at " << where());
}

bool TorchTCPStore::check(const std::vector<std::string>& keys) {
  Request r = Request(Query::kCheck).keys(keys);
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  send(r.bytes(), deadline, "checking " + quoted(keys));
  uint8_t reply = 0;
  recv(&reply, 1, deadline, "checking " + quoted(keys));
  if (reply > 1) fail("unexpected reply " + std::to_string(reply) + " to CHECK");
  return reply == kCheckReady;
}

bool TorchTCPStore::delete_key(const std::string& key) {
  Request r = Request(Query::kDeleteKey).key(key);
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  const std::string what = "deleting '" + key + "'";
  send(r.bytes(), deadline, what);
  return recv_i64(deadline, what) == 1;
}

int64_t TorchTCPStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  const Deadline deadline = connected(timeout());
  send(Request(Query::kGetNumKeys).bytes(), deadline, "counting keys");
  return recv_i64(deadline, "counting keys");
}

}  // namespace ddplab::distributed
