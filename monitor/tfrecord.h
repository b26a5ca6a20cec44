// TFRecord: the framing of TensorBoard's event files (and of TensorFlow's .tfrecord data files).
//
// A file is a sequence of records, each
//   uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
// all little-endian. The CRC is CRC-32C (Castagnoli), "masked" by a rotation plus a constant so
// that a CRC stored inside data that is itself checksummed does not cancel out.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace ddplab::monitor {

// CRC-32C (polynomial 0x1EDC6F41, reflected), as in iSCSI and ext4: crc32c("123456789") is
// 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
// TFRecord's mask: rotate right by 15 bits, then add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// Appends one framed record to `out`.
void write_record(std::ostream& out, const std::string& data);

// Every record of a TFRecord file, in order. Throws Error naming the file and the record on a
// truncated record or a CRC that does not match.
std::vector<std::string> read_records(const std::string& path);

}  // namespace ddplab::monitor
