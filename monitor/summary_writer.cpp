// SummaryWriter: tensorflow.Event records in a TFRecord file (see summary_writer.h).
#include "monitor/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "monitor/tfrecord.h"
#include "tensor/error.h"

namespace ddplab::monitor {

// Note [Event protobuf by hand]
// An event file needs only these fields of TensorFlow's protos (field number, wire type):
//   Event          wall_time 1 (double), step 2 (int64), file_version 3 (string), summary 5
//   Summary        value 1 (repeated Summary.Value)
//   Summary.Value  tag 1 (string), simple_value 2 (float), tensor 8, metadata 9
//   SummaryMetadata plugin_data 1;  PluginData plugin_name 1 (string)
//   TensorProto    dtype 1 (enum: DT_STRING = 7), tensor_shape 2 (empty: a scalar), string_val 8
// Protobuf's encoding of them is short: each field is a key varint (field << 3 | wire type)
// followed by a varint (wire type 0), 8 little-endian bytes (1), a varint length and the bytes
// (2: strings and nested messages), or 4 little-endian bytes (5). Fields may come in any order
// and readers skip the ones they do not know, so this subset is a valid Event.
namespace {

class ProtoWriter {
 public:
  void varint_field(int field, uint64_t v) {
    key(field, 0);
    varint(v);
  }
  void double_field(int field, double v) {
    key(field, 1);
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    fixed(bits, 8);
  }
  void float_field(int field, float v) {
    key(field, 5);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    fixed(bits, 4);
  }
  // A string, bytes, or an already encoded nested message.
  void bytes_field(int field, const std::string& bytes) {
    key(field, 2);
    varint(bytes.size());
    out_ += bytes;
  }
  const std::string& str() const { return out_; }

 private:
  void key(int field, int wire_type) { varint(static_cast<uint64_t>(field) << 3 | wire_type); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void fixed(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event holding `summary` (or, when it is empty, nothing but the time and step).
std::string event_bytes(double walltime, int64_t step, const std::string& summary) {
  ProtoWriter e;
  e.double_field(1, walltime < 0 ? now_seconds() : walltime);
  e.varint_field(2, static_cast<uint64_t>(step));  // two's complement, as protobuf's int64
  if (!summary.empty()) e.bytes_field(5, summary);
  return e.str();
}

// A Summary with one Summary.Value.
std::string summary_of(const std::string& value) {
  ProtoWriter s;
  s.bytes_field(1, value);
  return s.str();
}

}  // namespace

SummaryWriter::SummaryWriter(const std::string& log_dir) : log_dir_(log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  DDP_CHECK(!ec,
            "SummaryWriter: cannot create the log folder '" << log_dir << "': " << ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // Two writers of one process in one second still get two files.
  static std::atomic<int> counter{0};
  path_ = log_dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
          "." + host + "." + std::to_string(getpid()) + "." + std::to_string(counter++);
  out_.open(path_, std::ios::binary);
  DDP_CHECK(out_.good(), "SummaryWriter: cannot create the event file '" << path_ << "'");
  ProtoWriter version;  // readers check the first event for the format version
  version.double_field(1, now_seconds());
  version.bytes_field(3, "brain.Event:2");
  write_event(version.str());
  flush();
}

SummaryWriter::~SummaryWriter() {
  close();
}

void SummaryWriter::write_event(const std::string& event) {
  DDP_CHECK(out_.is_open(), "SummaryWriter: '" << path_ << "' is closed");
  write_record(out_, event);
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t global_step,
                               double walltime) {
  ProtoWriter v;
  v.bytes_field(1, tag);
  v.float_field(2, static_cast<float>(value));  // simple_value is a float in the proto
  write_event(event_bytes(walltime, global_step, summary_of(v.str())));
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t global_step,
                             double walltime) {
  // The text plugin reads a DT_STRING tensor whose metadata names the plugin "text".
  ProtoWriter plugin, metadata, tensor, v;
  plugin.bytes_field(1, "text");
  metadata.bytes_field(1, plugin.str());
  tensor.varint_field(1, 7);    // DT_STRING
  tensor.bytes_field(2, "");    // TensorShapeProto with no dims: a scalar
  tensor.bytes_field(8, text);  // string_val
  v.bytes_field(1, tag);
  v.bytes_field(8, tensor.str());
  v.bytes_field(9, metadata.str());
  write_event(event_bytes(walltime, global_step, summary_of(v.str())));
}

void SummaryWriter::flush() {
  if (out_.is_open()) out_.flush();
}

void SummaryWriter::close() {
  if (out_.is_open()) out_.close();
}

}  // namespace ddplab::monitor
