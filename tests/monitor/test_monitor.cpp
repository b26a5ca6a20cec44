// monitor/: the TFRecord framing and CRC-32C, SummaryWriter's event files read back by an
// independent protobuf decoder (below), Chrome traces of a Reducer timeline, and MetricsLog's CSV.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "monitor/chrome_trace.h"
#include "monitor/metrics_log.h"
#include "monitor/summary_writer.h"
#include "monitor/tfrecord.h"
#include "tensor/error.h"

using namespace ddplab;
using namespace ddplab::monitor;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddplab_monitor_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A minimal protobuf reader, written from the wire format's definition (not from the writer):
// every field of a message as (field number -> raw value), varints and fixed values as integers,
// length-delimited ones as bytes.
struct Field {
  int wire = 0;
  uint64_t number = 0;  // wire types 0, 1, 5
  std::string bytes;    // wire type 2
};
std::multimap<int, Field> parse(const std::string& m) {
  std::multimap<int, Field> out;
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < m.size());
      const auto byte = static_cast<uint8_t>(m[at++]);
      v |= uint64_t(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
  };
  while (at < m.size()) {
    const uint64_t key = varint();
    Field f;
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.number = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      REQUIRE(at + n <= m.size());
      for (int i = 0; i < n; ++i) f.number |= uint64_t(static_cast<uint8_t>(m[at + i])) << (8 * i);
      at += n;
    } else {
      REQUIRE(f.wire == 2);
      const uint64_t len = varint();
      REQUIRE(at + len <= m.size());
      f.bytes = m.substr(at, len);
      at += len;
    }
    out.emplace(static_cast<int>(key >> 3), f);
  }
  return out;
}
const Field& one(const std::multimap<int, Field>& msg, int field) {
  REQUIRE(msg.count(field) == 1);
  return msg.find(field)->second;
}
double as_double(const Field& f) {
  double d;
  std::memcpy(&d, &f.number, 8);
  return d;
}
float as_float(const Field& f) {
  const auto bits = static_cast<uint32_t>(f.number);
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

}  // namespace

TEST_CASE("crc32c: the standard check value, and TFRecord's mask") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  const uint32_t c = crc32c("123456789", 9);
  CHECK(masked_crc32c("123456789", 9) ==
        static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST_CASE("SummaryWriter: events decode to the logged tags, values, steps and text") {
  TempDir dir;
  std::string file;
  {
    SummaryWriter w((dir.path / "run").string());
    w.add_scalar("train/loss", 0.625, 3, /*walltime=*/1000.5);
    w.add_scalar("lr", -2.5e-3, 70000000000LL);  // a step beyond 32 bits: a long varint
    w.add_text("backend", "gloo", 0);
    w.flush();
    file = w.file_name();
  }
  CHECK(std::filesystem::path(file).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::vector<std::string> records = read_records(file);  // checks both CRCs of each
  REQUIRE(records.size() == 4);

  const auto version = parse(records[0]);
  CHECK(one(version, 3).bytes == "brain.Event:2");
  CHECK(as_double(one(version, 1)) > 1.5e9);  // a wall time in seconds since 1970

  const auto e1 = parse(records[1]);
  CHECK(as_double(one(e1, 1)) == 1000.5);
  CHECK(one(e1, 2).number == 3);
  const auto v1 = parse(one(parse(one(e1, 5).bytes), 1).bytes);  // Event.summary.value[0]
  CHECK(one(v1, 1).bytes == "train/loss");
  CHECK(one(v1, 2).wire == 5);
  CHECK(as_float(one(v1, 2)) == 0.625f);

  const auto e2 = parse(records[2]);
  CHECK(one(e2, 2).number == 70000000000ULL);
  const auto v2 = parse(one(parse(one(e2, 5).bytes), 1).bytes);
  CHECK(one(v2, 1).bytes == "lr");
  CHECK(as_float(one(v2, 2)) == -2.5e-3f);

  const auto v3 = parse(one(parse(one(parse(records[3]), 5).bytes), 1).bytes);
  CHECK(one(v3, 1).bytes == "backend");
  const auto tensor = parse(one(v3, 8).bytes);
  CHECK(one(tensor, 1).number == 7);  // DT_STRING
  CHECK(one(tensor, 8).bytes == "gloo");
  const auto plugin = parse(one(parse(one(v3, 9).bytes), 1).bytes);
  CHECK(one(plugin, 1).bytes == "text");

  // The file itself: the first record's length field and its masked CRC, by hand.
  const std::string raw = read_all(file);
  uint64_t len = 0;
  std::memcpy(&len, raw.data(), 8);
  CHECK(len == records[0].size());
  uint32_t crc = 0;
  std::memcpy(&crc, raw.data() + 8, 4);
  CHECK(crc == masked_crc32c(raw.data(), 8));
}

TEST_CASE("read_records: a flipped byte or a cut file is an error naming the record") {
  TempDir dir;
  std::string file;
  {
    SummaryWriter w(dir.path.string());
    w.add_scalar("a", 1, 1);
    file = w.file_name();
  }
  std::string raw = read_all(file);
  const size_t first = raw.size();
  std::string flipped = raw;
  flipped[flipped.size() - 6] ^= 0x01;  // inside the last record's data
  std::ofstream(file, std::ios::binary | std::ios::trunc) << flipped;
  CHECK_THROWS_WITH(read_records(file), doctest::Contains("record 1: wrong data CRC"));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << raw.substr(0, first - 3);
  CHECK_THROWS_WITH(read_records(file), doctest::Contains("record 1 is truncated"));
}

TEST_CASE("SummaryWriter: an unusable log folder is an error naming it") {
  TempDir dir;
  const std::string blocker = (dir.path / "file").string();
  std::ofstream(blocker) << "x";
  CHECK_THROWS_WITH(SummaryWriter(blocker + "/sub"), doctest::Contains(blocker.c_str()));
}

TEST_CASE("ChromeTrace: a Reducer timeline becomes ordered bucket events in valid JSON") {
  TempDir dir;
  distributed::IterationTimeline t;
  t.iteration = 4;
  t.start = std::chrono::steady_clock::now();
  t.buckets.resize(3);
  t.buckets[0] = {1.0, 1.5, 4.0, 10};
  t.buckets[1] = {2.0, 4.0, 6.0, 20};
  t.buckets[2] = {3.0, -1, -1, -1};  // never launched: left out
  const std::string path = (dir.path / "sub" / "rank2.json").string();
  {
    ChromeTrace trace(path, 2);
    trace.complete("backward", "step", kComputeTrack, t.start,
                   t.start + std::chrono::milliseconds(3));
    trace.add_reducer_iteration(t);
  }
  const nlohmann::json j = nlohmann::json::parse(read_all(path));
  int spans = 0;
  for (const auto& e : j["traceEvents"]) {
    CHECK(e["pid"] == 2);
    if (e["name"].get<std::string>().rfind("all-reduce bucket", 0) != 0) continue;
    ++spans;
    const auto& a = e["args"];
    CHECK(a["iteration"] == 4);
    CHECK(a["ready_us"].get<double>() <= a["launched_us"].get<double>());
    CHECK(a["launched_us"].get<double>() <= a["done_us"].get<double>());
    CHECK(e["ts"].get<double>() == a["launched_us"].get<double>());
    CHECK(e["dur"].get<double>() ==
          doctest::Approx(a["done_us"].get<double>() - a["launched_us"].get<double>()));
  }
  CHECK(spans == 2);
}

TEST_CASE("MetricsLog: CSV with a header from the first row; appending keeps it; JSON lines") {
  TempDir dir;
  const std::string csv = (dir.path / "m.csv").string();
  {
    MetricsLog log(csv);
    CHECK(log.is_csv());
    log.write({{"epoch", 0}, {"loss", 0.5}});
  }
  {
    MetricsLog log(csv);  // a resumed run appends rows under the same header
    log.write({{"epoch", 1}, {"loss", 0.25}});
    CHECK_THROWS_WITH(log.write({{"epoch", 2}, {"acc", 0.25}}),
                      doctest::Contains("no column 'loss'"));
  }
  CHECK(read_all(csv) == "epoch,loss\n0,0.5\n1,0.25\n");
  const std::string jsonl = (dir.path / "m.jsonl").string();
  {
    MetricsLog log(jsonl);
    CHECK(!log.is_csv());
    log.write({{"epoch", 0}, {"loss", 0.5}});
  }
  CHECK(read_all(jsonl) == "{\"epoch\":0,\"loss\":0.5}\n");
}
