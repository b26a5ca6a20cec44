// The safetensors format: writer and validating reader (see nn/safetensors.h).
//
// Layout: u64 little-endian N, then N bytes of JSON {name: {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {str: str}}, then the data buffer. Offsets are relative to the
// start of the buffer. The reader trusts nothing: a checkpoint may be truncated by a crash on
// another machine or written by another tool, and a bad offset must become a clear error rather
// than a read past the end of a buffer.
#include "nn/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include "tensor/ops.h"

namespace ddplab::nn {

namespace {

using nlohmann::json;

// safetensors' dtype spelling <-> ours.
const char* st_dtype_name(DType t) {
  switch (t) {
    case kFloat32:
      return "F32";
    case kFloat64:
      return "F64";
    case kFloat16:
      return "F16";
    case kBFloat16:
      return "BF16";
    case kInt64:
      return "I64";
    case kInt32:
      return "I32";
    case kUInt8:
      return "U8";
    case kBool:
      return "BOOL";
  }
  DDP_FAIL("safetensors: unsupported dtype");
}

bool st_dtype_from_name(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", kFloat32}, {"F64", kFloat64}, {"F16", kFloat16}, {"BF16", kBFloat16},
      {"I64", kInt64},   {"I32", kInt32},   {"U8", kUInt8},    {"BOOL", kBool}};
  for (const auto& [name, t] : table) {
    if (s == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

// The tensor as contiguous host bytes (a copy only when needed).
Tensor host_contiguous(const Tensor& t) {
  Tensor h = t.is_cuda() ? ops::to(t.detach(), kCPU) : t.detach();
  return ops::contiguous(h);
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Build the header first: offsets are a running sum of byte sizes, in the order given.
  // nlohmann's ordered_json keeps insertion order, so the file lists tensors as the caller did.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> hosts;
  hosts.reserve(tensors.size());
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DDP_CHECK(t.defined(),
              "save_safetensors(" << path << "): tensor '" << name << "' is undefined");
    DDP_CHECK(name != "__metadata__",
              "save_safetensors(" << path << "): '__metadata__' is reserved");
    DDP_CHECK(!header.contains(name),
              "save_safetensors(" << path << "): duplicate tensor name '" << name << "'");
    Tensor h = host_contiguous(t);
    size_t n = h.nbytes();
    header[name] = {{"dtype", st_dtype_name(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    hosts.push_back(h);
  }
  std::string hjson = header.dump();
  // Pad the header with spaces to a multiple of 8 so the buffer is aligned (as the reference
  // implementation does); JSON parsers ignore trailing whitespace.
  while ((8 + hjson.size()) % 8 != 0) hjson.push_back(' ');

  std::vector<std::pair<const void*, size_t>> pieces;
  uint64_t n = hjson.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  pieces.emplace_back(len, 8);
  pieces.emplace_back(hjson.data(), hjson.size());
  for (const Tensor& h : hosts) pieces.emplace_back(h.raw_data(), h.nbytes());
  write_file_atomic(path, pieces);
}

void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& pieces) {
  // The steps that make a crash leave either the old file or the new one, never a mix:
  // 1. write everything to `path.tmp` in the same directory (rename only works within a file
  //    system), 2. fsync it, so its bytes are on disk before its name is, 3. rename it over
  //    `path` (atomic in POSIX), 4. fsync the directory, so the rename itself survives a power
  //    cut. Any failure removes the temporary file and leaves `path` as it was.
  const std::string tmp = path + ".tmp";
  auto fail = [&](int fd, const std::string& what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    DDP_FAIL("cannot write '" << path << "': " << what << ": " << std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    DDP_FAIL("cannot write '" << path << "': cannot create '" << tmp
                              << "': " << std::strerror(err));
  }
  for (const auto& [data, size] : pieces) {
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {  // write() may write less than asked (signals, pipes); loop until done
      const ssize_t w = ::write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = ENOSPC;
        fail(fd, "writing '" + tmp + "' failed");
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) fail(fd, "fsync of '" + tmp + "' failed");
  if (::close(fd) != 0) fail(-1, "closing '" + tmp + "' failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(-1, "renaming '" + tmp + "' failed");
  fsync_parent_dir(path);
}

uint32_t bytes_crc32(const void* data, size_t n) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  if (n > 0) crc = crc32_z(crc, static_cast<const Bytef*>(data), n);
  return static_cast<uint32_t>(crc);
}

uint32_t tensor_crc32(const Tensor& t) {
  Tensor h = host_contiguous(t);
  return bytes_crc32(h.nbytes() > 0 ? h.raw_data() : nullptr, h.nbytes());
}

void check_tensor_crc32(const json& crcs, const std::string& name, const Tensor& t,
                        const std::string& where) {
  auto c = crcs.find(name);
  DDP_CHECK(c != crcs.end() && c->is_number_unsigned(),
            where << "tensor '" << name << "' has no recorded CRC32 checksum");
  const auto recorded = c->get<uint32_t>();
  const uint32_t actual = tensor_crc32(t);
  DDP_CHECK(recorded == actual, where << "tensor '" << name
                                      << "' fails its CRC32 checksum (recorded " << recorded
                                      << ", its data gives " << actual << "): the file is corrupt");
}

void fsync_parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DDP_CHECK(fd >= 0, "cannot open folder '" << dir << "' to fsync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  DDP_CHECK(rc == 0, "fsync of folder '" << dir << "' failed: " << std::strerror(err));
}

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "load_safetensors: cannot open '" << path << "': " << std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = "load_safetensors(" + path + "): ";

  DDP_CHECK(bytes.size() >= 8,
            where << "file is " << bytes.size() << " bytes, shorter than the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  DDP_CHECK(hlen <= bytes.size() - 8, where << "header length " << hlen << " exceeds the "
                                            << bytes.size() - 8 << " bytes after it: the file ends"
                                            << " at offset " << bytes.size() << " (truncated?)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(hlen));
  } catch (const json::parse_error& e) {
    DDP_FAIL(where << "header is not valid JSON (error at file offset " << 8 + e.byte - 1
                   << "): " << e.what());
  } catch (const json::exception& e) {
    DDP_FAIL(where << "header is not valid JSON: " << e.what());
  }
  DDP_CHECK(header.is_object(), where << "header is not a JSON object");

  const size_t data_start = 8 + hlen;
  const size_t buffer_size = bytes.size() - data_start;

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      DDP_CHECK(it->is_object(), where << "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        DDP_CHECK(m->is_string(),
                  where << "__metadata__ value of '" << m.key() << "' is not a string");
        if (metadata) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const json& e = *it;
    std::string w = where;
    w.append("tensor '").append(name).append("': ");
    DDP_CHECK(e.is_object(), w << "entry is not an object");
    DDP_CHECK(e.contains("dtype") && e["dtype"].is_string(), w << "missing string 'dtype'");
    DDP_CHECK(e.contains("shape") && e["shape"].is_array(), w << "missing array 'shape'");
    DDP_CHECK(
        e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
        w << "'data_offsets' must be [begin, end]");
    Entry en;
    en.name = name;
    std::string dt = e["dtype"].get<std::string>();
    DDP_CHECK(st_dtype_from_name(dt, &en.dtype),
              w << "unknown dtype '" << dt << "' (known: F32 F64 F16 BF16 I64 I32 U8 BOOL)");
    for (const json& d : e["shape"]) {
      DDP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                w << "shape has a non-integer or negative dimension "
                  << (d.is_number() ? d.dump() : d.type_name()));
      en.shape.push_back(d.get<int64_t>());
    }
    for (const json& o : e["data_offsets"]) {
      DDP_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                w << "data_offsets has a non-integer or negative value "
                  << (o.is_number() ? o.dump() : o.type_name()));
    }
    en.begin = e["data_offsets"][0].get<uint64_t>();
    en.end = e["data_offsets"][1].get<uint64_t>();
    DDP_CHECK(en.begin <= en.end,
              w << "data_offsets [" << en.begin << ", " << en.end << "] has begin after end");
    DDP_CHECK(en.end <= buffer_size, w << "data_offsets [" << en.begin << ", " << en.end
                                       << "] run past the " << buffer_size << "-byte data buffer");
    // The product of a crafted shape can overflow 64 bits and wrap to the very byte count the
    // offsets give; refuse the overflow before multiplying (a zero dimension makes it 0 anyway).
    size_t expect = element_size(en.dtype);
    if (std::find(en.shape.begin(), en.shape.end(), 0) != en.shape.end()) {
      expect = 0;
    } else {
      for (int64_t d : en.shape) {
        DDP_CHECK(static_cast<uint64_t>(d) <= SIZE_MAX / expect,
                  w << "shape " << shape_str(en.shape) << " overflows a 64-bit byte count");
        expect *= static_cast<size_t>(d);
      }
    }
    DDP_CHECK(en.end - en.begin == expect, w << "holds " << en.end - en.begin << " bytes but dtype "
                                             << dt << " and shape " << shape_str(en.shape)
                                             << " need " << expect);
    entries.push_back(std::move(en));
  }

  // The tensors must tile the buffer exactly: sorted by offset, no gaps, no overlap.
  std::vector<const Entry*> sorted;
  sorted.reserve(entries.size());
  for (const Entry& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  size_t pos = 0;
  for (const Entry* e : sorted) {
    DDP_CHECK(e->begin >= pos, where << "tensor '" << e->name << "' [" << e->begin << ", " << e->end
                                     << ") overlaps the previous tensor (ends at " << pos << ")");
    DDP_CHECK(e->begin == pos, where << "gap in the data buffer: bytes [" << pos << ", " << e->begin
                                     << ") belong to no tensor (before '" << e->name << "')");
    pos = e->end;
  }
  DDP_CHECK(pos == buffer_size, where << "the tensors cover " << pos << " bytes of a "
                                      << buffer_size << "-byte data buffer (trailing bytes)");

  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) {
    Tensor t = ops::empty(e.shape, TensorOptions(e.dtype, kCPU));
    if (e.end > e.begin)
      std::memcpy(t.raw_data(), bytes.data() + data_start + e.begin, e.end - e.begin);
    out.emplace(e.name, t);
  }
  return out;
}

}  // namespace ddplab::nn
