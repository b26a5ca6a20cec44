// The TCPStore wire format: length-prefixed binary frames, shared by client and server.
//
// Every message is one frame: a 4-byte little-endian payload length, then the payload. A request
// payload starts with a 1-byte opcode, a reply payload with a 1-byte status; the fields after it
// are u32/i64 integers (little-endian) and byte strings (u32 length + bytes). The first request on
// a connection must be kHello (magic, version, token). Limits bound what one frame may ask the
// server to buffer, so a hostile or broken client costs at most one frame of memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddplab::distributed::protocol {

constexpr uint32_t kMagic = 0x53504444;  // "DDPS" in little-endian bytes
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeysPerRequest = 4096;
constexpr size_t kMaxTokenBytes = 1024;
// compare_set carries two values; everything else fits well below this.
constexpr size_t kMaxFrameBytes = 2 * kMaxValueBytes + kMaxKeyBytes + 64;

enum class Op : uint8_t {
  kHello = 1,       // u32 magic, u32 version, bytes token   -> ok | error(message)
  kSet = 2,         // key, value                            -> ok
  kGet = 3,         // key (server parks until it exists)    -> ok(value)
  kAdd = 4,         // key, i64 delta                        -> ok(i64 new value)
  kCompareSet = 5,  // key, expected, desired                -> ok(current value)
  kWait = 6,        // u32 n, n keys (parks until all exist) -> ok
  kCheck = 7,       // u32 n, n keys                         -> ok(u8 all exist)
  kDelete = 8,      // key                                   -> ok(u8 deleted)
  kNumKeys = 9,     //                                       -> ok(i64 count)
};

enum class Status : uint8_t { kOk = 0, kError = 1 };

// Thrown by Reader on a malformed payload; the server turns it into a closed connection.
struct ProtocolError {
  std::string reason;
};

// Builds one frame; `finish()` patches the length prefix.
class Writer {
 public:
  Writer() : buf_(4, 0) {}
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& bytes(const uint8_t* data, size_t n);
  Writer& bytes(const std::vector<uint8_t>& v) { return bytes(v.data(), v.size()); }
  Writer& str(const std::string& s);
  std::vector<uint8_t> finish();

 private:
  std::vector<uint8_t> buf_;
};

// Reads fields of one payload with bounds checks; every overrun throws ProtocolError.
class Reader {
 public:
  Reader(const uint8_t* data, size_t n) : p_(data), end_(data + n) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::vector<uint8_t> bytes(size_t limit, const char* what);
  std::string str(size_t limit, const char* what);
  bool done() const { return p_ == end_; }

 private:
  void need(size_t n, const char* what);
  const uint8_t* p_;
  const uint8_t* end_;
};

uint32_t decode_u32(const uint8_t* p);

}  // namespace ddplab::distributed::protocol
