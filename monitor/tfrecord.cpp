// TFRecord framing: CRC-32C, the mask, and reading and writing records (see tfrecord.h).
#include "monitor/tfrecord.h"

#include <array>
#include <fstream>
#include <ostream>

#include "tensor/error.h"

namespace ddplab::monitor {

namespace {

// The byte-at-a-time table of the reflected polynomial 0x82F63B78 (0x1EDC6F41 bit-reversed).
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void write_record(std::ostream& out, const std::string& data) {
  std::string frame;
  frame.reserve(data.size() + 16);
  put_le(frame, data.size(), 8);
  put_le(frame, masked_crc32c(frame.data(), 8), 4);
  frame += data;
  put_le(frame, masked_crc32c(data.data(), data.size()), 4);
  out.write(frame.data(), static_cast<std::streamsize>(frame.size()));
}

std::vector<std::string> read_records(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DDP_CHECK(f.good(), "read_records: cannot open '" << path << "'");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t k = records.size();
    DDP_CHECK(at + 12 <= bytes.size(),
              "read_records: '" << path << "': record " << k << " is truncated (header)");
    const uint64_t len = get_le(bytes, at, 8);
    DDP_CHECK(get_le(bytes, at + 8, 4) == masked_crc32c(bytes.data() + at, 8),
              "read_records: '" << path << "': record " << k << ": wrong length CRC");
    DDP_CHECK(len <= bytes.size() - at - 16, "read_records: '" << path << "': record " << k
                                                               << " is truncated (" << len
                                                               << " bytes announced)");
    std::string data = bytes.substr(at + 12, len);
    DDP_CHECK(get_le(bytes, at + 12 + len, 4) == masked_crc32c(data.data(), data.size()),
              "read_records: '" << path << "': record " << k << ": wrong data CRC");
    records.push_back(std::move(data));
    at += 16 + len;
  }
  return records;
}

}  // namespace ddplab::monitor
