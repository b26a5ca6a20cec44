// Store helpers, the TCPStore client and PrefixStore (see store.h; wire format in
// store_protocol.h, server in store_server.cpp).
#include "comm/store/store.h"

#include <cstdlib>
#include <sstream>

#include "comm/store/store_protocol.h"
#include "comm/store/store_server.h"
#include "tensor/error.h"

namespace ddplab::distributed {

using protocol::Op;
using protocol::Status;
using protocol::Writer;
using Bytes = std::vector<uint8_t>;

namespace {

std::string env_token() {
  const char* t = std::getenv("DDPLAB_STORE_TOKEN");
  return t ? t : "";
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", '" : "'") << keys[i] << "'";
  return os.str();
}

void check_key(const std::string& key) {
  DDP_CHECK(key.size() <= protocol::kMaxKeyBytes,
            "TCPStore: key of " << key.size() << " bytes exceeds the limit of "
                                << protocol::kMaxKeyBytes);
}

void check_value(const Bytes& v) {
  DDP_CHECK(v.size() <= protocol::kMaxValueBytes, "TCPStore: value of "
                                                      << v.size() << " bytes exceeds the limit of "
                                                      << protocol::kMaxValueBytes);
}

int64_t read_i64(const Bytes& b) {
  return protocol::Reader(b.data(), b.size()).i64();
}
bool read_bool(const Bytes& b) {
  return protocol::Reader(b.data(), b.size()).u8() != 0;
}
Bytes read_bytes(const Bytes& b) {
  return protocol::Reader(b.data(), b.size()).bytes(protocol::kMaxValueBytes, "value");
}

}  // namespace

// --- Store ---------------------------------------------------------------------------------

void Store::set(const std::string& key, const std::string& value) {
  set(key, Bytes(value.begin(), value.end()));
}

std::string Store::get_string(const std::string& key) {
  Bytes v = get(key);
  return std::string(v.begin(), v.end());
}

// --- TCPStore ------------------------------------------------------------------------------

TCPStore::TCPStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout,
                   std::optional<std::string> token)
    : Store(timeout),
      host_(std::move(host)),
      port_(port),
      token_(token ? std::move(*token) : env_token()) {
  DDP_CHECK(token_.size() <= protocol::kMaxTokenBytes,
            "TCPStore: a store token of " << token_.size() << " bytes exceeds the limit of "
                                          << protocol::kMaxTokenBytes);
  if (is_server) {
    auto options = StoreServerOptions::from_environment();
    try {
      server_ = std::make_unique<TCPStoreServer>(host_, port_, token_, options);
    } catch (const Error& e) {
      DDP_FAIL("TCPStore: " << e.what() << " (is another job's store on this port?)");
    }
    port_ = server_->port();
  }
  std::lock_guard<std::mutex> lock(mu_);
  connect(net::Clock::now() + timeout);
}

TCPStore::~TCPStore() = default;

void TCPStore::connect(net::Clock::time_point deadline) {
  // A server bound to all interfaces is reached through loopback from its own host.
  std::string target = host_ == "0.0.0.0" ? "127.0.0.1" : host_ == "::" ? "::1" : host_;
  try {
    conn_ = net::connect_tcp(target, port_, deadline);
  } catch (const Error& e) {
    DDP_FAIL("TCPStore: " << e.what());
  }
  Bytes hello = Writer()
                    .u8(uint8_t(Op::kHello))
                    .u32(protocol::kMagic)
                    .u32(protocol::kVersion)
                    .str(token_)
                    .finish();
  uint8_t hdr[4];
  bool ok = net::send_all(conn_.get(), hello.data(), hello.size(), deadline, where()) &&
            net::recv_all(conn_.get(), hdr, 4, deadline, where());
  DDP_CHECK(ok, "TCPStore: no hello reply from " << where() << " before the timeout");
  uint32_t len = protocol::decode_u32(hdr);
  DDP_CHECK(len >= 1 && len <= 4096, "TCPStore: bad hello reply from " << where());
  Bytes reply(len);
  DDP_CHECK(net::recv_all(conn_.get(), reply.data(), len, deadline, where()),
            "TCPStore: no hello reply from " << where() << " before the timeout");
  if (reply[0] != uint8_t(Status::kOk)) {
    conn_.reset();
    std::string msg = protocol::Reader(reply.data() + 1, len - 1).str(4096, "message");
    DDP_FAIL("TCPStore: server at " << where() << " rejected the connection: " << msg);
  }
}

Bytes TCPStore::rpc(const Bytes& frame, std::chrono::milliseconds timeout,
                    const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  auto deadline = net::Clock::now() + timeout;
  if (!conn_) connect(deadline);
  auto timed_out = [&] {
    conn_.reset();  // the server may still answer later; a fresh connection avoids a stale reply
    DDP_FAIL("TCPStore: timed out after " << timeout.count() << " ms " << what << " at "
                                          << where());
  };
  uint8_t hdr[4];
  try {
    if (!net::send_all(conn_.get(), frame.data(), frame.size(), deadline, where())) timed_out();
    if (!net::recv_all(conn_.get(), hdr, 4, deadline, where())) timed_out();
    uint32_t len = protocol::decode_u32(hdr);
    DDP_CHECK(len >= 1 && len <= protocol::kMaxFrameBytes,
              "TCPStore: malformed reply from " << where());
    Bytes reply(len);
    if (!net::recv_all(conn_.get(), reply.data(), len, deadline, where())) timed_out();
    if (reply[0] != uint8_t(Status::kOk)) {
      std::string msg = protocol::Reader(reply.data() + 1, len - 1).str(4096, "message");
      DDP_FAIL("TCPStore: " << msg << " (" << what << " at " << where() << ")");
    }
    reply.erase(reply.begin());
    return reply;
  } catch (const Error&) {
    conn_.reset();
    throw;
  }
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  check_key(key);
  check_value(value);
  rpc(Writer().u8(uint8_t(Op::kSet)).str(key).bytes(value).finish(), timeout(),
      "setting key '" + key + "'");
}

Bytes TCPStore::get(const std::string& key) {
  check_key(key);
  return read_bytes(rpc(Writer().u8(uint8_t(Op::kGet)).str(key).finish(), timeout(),
                        "waiting for key '" + key + "'"));
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  check_key(key);
  return read_i64(rpc(Writer().u8(uint8_t(Op::kAdd)).str(key).i64(delta).finish(), timeout(),
                      "adding to key '" + key + "'"));
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_key(key);
  check_value(expected);
  check_value(desired);
  Bytes f = Writer().u8(uint8_t(Op::kCompareSet)).str(key).bytes(expected).bytes(desired).finish();
  return read_bytes(rpc(f, timeout(), "in compare_set of key '" + key + "'"));
}

namespace {
Bytes keys_frame(Op op, const std::vector<std::string>& keys) {
  DDP_CHECK(keys.size() <= protocol::kMaxKeysPerRequest,
            "TCPStore: " << keys.size() << " keys in one request exceed the limit of "
                         << protocol::kMaxKeysPerRequest);
  Writer w;
  w.u8(uint8_t(op)).u32(uint32_t(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  return w.finish();
}
}  // namespace

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  rpc(keys_frame(Op::kWait, keys), timeout, "waiting for keys " + join_keys(keys));
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  return read_bool(rpc(keys_frame(Op::kCheck, keys), timeout(), "checking keys"));
}

bool TCPStore::delete_key(const std::string& key) {
  check_key(key);
  return read_bool(rpc(Writer().u8(uint8_t(Op::kDelete)).str(key).finish(), timeout(),
                       "deleting key '" + key + "'"));
}

int64_t TCPStore::num_keys() {
  return read_i64(rpc(Writer().u8(uint8_t(Op::kNumKeys)).finish(), timeout(), "counting keys"));
}

// --- PrefixStore ---------------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  DDP_CHECK(base_ != nullptr, "PrefixStore('" << prefix_ << "'): the base store is null");
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(full(key), value);
}
Bytes PrefixStore::get(const std::string& key) {
  return base_->get(full(key));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full(key), delta);
}
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(full(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(full(keys));
}
bool PrefixStore::delete_key(const std::string& key) {
  return base_->delete_key(full(key));
}
int64_t PrefixStore::num_keys() {
  return base_->num_keys();
}

}  // namespace ddplab::distributed
