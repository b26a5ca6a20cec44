// Encoding and bounds-checked decoding of TCPStore frames (see store_protocol.h).
#include "comm/store/store_protocol.h"

namespace ddplab::distributed::protocol {

uint32_t decode_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(uint8_t(u >> (8 * i)));
  return *this;
}

Writer& Writer::bytes(const uint8_t* data, size_t n) {
  u32(static_cast<uint32_t>(n));
  buf_.insert(buf_.end(), data, data + n);
  return *this;
}

Writer& Writer::str(const std::string& s) {
  return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::vector<uint8_t> Writer::finish() {
  uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
  for (int i = 0; i < 4; ++i) buf_[i] = uint8_t(n >> (8 * i));
  return std::move(buf_);
}

void Reader::need(size_t n, const char* what) {
  if (static_cast<size_t>(end_ - p_) < n)
    throw ProtocolError{std::string("truncated frame while reading ") + what};
}

uint8_t Reader::u8() {
  need(1, "u8");
  return *p_++;
}

uint32_t Reader::u32() {
  need(4, "u32");
  uint32_t v = decode_u32(p_);
  p_ += 4;
  return v;
}

int64_t Reader::i64() {
  need(8, "i64");
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= uint64_t(p_[i]) << (8 * i);
  p_ += 8;
  return static_cast<int64_t>(u);
}

std::vector<uint8_t> Reader::bytes(size_t limit, const char* what) {
  uint32_t n = u32();
  if (n > limit)
    throw ProtocolError{std::string(what) + " of " + std::to_string(n) +
                        " bytes exceeds the limit of " + std::to_string(limit)};
  need(n, what);
  std::vector<uint8_t> v(p_, p_ + n);
  p_ += n;
  return v;
}

std::string Reader::str(size_t limit, const char* what) {
  auto v = bytes(limit, what);
  return std::string(v.begin(), v.end());
}

}  // namespace ddplab::distributed::protocol
