// The flight recorder's ring buffer and its JSON-lines dump (see flight_recorder.h).
#include "comm/flight_recorder.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "comm/store/store.h"

namespace ddplab::distributed {

namespace {

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// A JSON string literal: error messages may hold quotes and newlines.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A temporary name beside `path`, unique per call: the waiting thread and Gloo's worker may
// report the same failure at the same moment, and must not write into one file.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> calls{0};
  return path + ".tmp" + std::to_string(calls++);
}

}  // namespace

const char* FlightRecorder::state_name(State s) {
  switch (s) {
    case State::Issued:
      return "issued";
    case State::Started:
      return "started";
    case State::Completed:
      return "completed";
    case State::Failed:
      return "failed";
  }
  return "?";
}

size_t flight_recorder_size_from_environment() {
  const char* v = std::getenv("DDPLAB_FLIGHT_RECORDER_SIZE");
  if (v == nullptr || *v == '\0') return kDefaultFlightRecorderSize;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  // A malformed value must not take diagnostics away: keep the default.
  return end != v && *end == '\0' && n >= 0 ? static_cast<size_t>(n) : kDefaultFlightRecorderSize;
}

FlightRecorder::FlightRecorder(int rank, int size, std::string backend, std::string group,
                               size_t capacity)
    : rank_(rank),
      size_(size),
      backend_(std::move(backend)),
      group_(std::move(group)),
      capacity_(capacity) {
  ring_.reserve(capacity_);
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t seq) {
  // Sequence numbers arrive in order, so the wanted entry is almost always among the newest:
  // search backwards from the last one pushed.
  for (size_t i = 0; i < ring_.size(); ++i) {
    Entry& e = ring_[(next_ - 1 - i) % capacity_];
    if (e.seq == seq) return &e;
  }
  return nullptr;
}

FlightRecorder::Entry& FlightRecorder::push(uint64_t seq) {
  Entry fresh;
  fresh.seq = seq;
  if (ring_.size() < capacity_)
    ring_.push_back(fresh);
  else
    ring_[next_ % capacity_] = fresh;
  return ring_[next_++ % capacity_];
}

void FlightRecorder::issued(uint64_t seq, const std::string& op, const std::string& dtype,
                            const std::string& sizes) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = push(seq);
  e.op = op;
  e.dtype = dtype;
  e.sizes = sizes;
  e.issued_us = now_us();
}

void FlightRecorder::started(uint64_t seq, const std::string& op) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(seq);
  if (e == nullptr) {
    e = &push(seq);
    e->op = op;
  }
  e->state = State::Started;
  e->started_us = now_us();
}

void FlightRecorder::finished(uint64_t seq, const std::string& error) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(seq);
  if (e == nullptr) return;  // already evicted by newer collectives
  e->state = error.empty() ? State::Completed : State::Failed;
  e->finished_us = now_us();
  e->error = error;
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  for (size_t i = ring_.size(); i > 0; --i) out.push_back(ring_[(next_ - i) % capacity_]);
  return out;
}

std::string FlightRecorder::dump(const std::string& reason,
                                 const std::map<int, uint64_t>& peers) const {
  if (capacity_ == 0) return "";
  std::string dir;
  for (const char* var : {"DDPLAB_FLIGHT_RECORDER_DIR", "TMPDIR"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      dir = v;
      break;
    }
  if (dir.empty()) dir = "/tmp";
  std::string path = dir + "/flight_" + group_ + "_rank" + std::to_string(rank_) + ".jsonl";
  // Written under another name and renamed, so a merge never reads half a dump.
  const std::string tmp = temporary_name(path);
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return "";
    f << "{\"rank\": " << rank_ << ", \"size\": " << size_ << ", \"backend\": " << quoted(backend_)
      << ", \"group\": " << quoted(group_) << ", \"reason\": " << quoted(reason)
      << ", \"dumped_us\": " << now_us() << ", \"peers\": {";
    bool first = true;
    for (const auto& [r, n] : peers) {
      f << (first ? "" : ", ") << "\"" << r << "\": " << n;
      first = false;
    }
    f << "}}\n";
    for (const Entry& e : entries())
      f << "{\"seq\": " << e.seq << ", \"op\": " << quoted(e.op)
        << ", \"dtype\": " << quoted(e.dtype) << ", \"sizes\": " << quoted(e.sizes)
        << ", \"state\": " << quoted(state_name(e.state)) << ", \"issued_us\": " << e.issued_us
        << ", \"started_us\": " << e.started_us << ", \"finished_us\": " << e.finished_us
        << ", \"error\": " << quoted(e.error) << "}\n";
    if (!f) return "";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return "";
  return path;
}

void request_flight_dumps(Store& group_store, int rank, const std::string& reason) {
  const std::string request = "rank " + std::to_string(rank) + " (" + reason + ")";
  try {
    // compare_set, not set: when several ranks time out together, the first cause is kept.
    group_store.compare_set(kFlightDumpRequestKey, {},
                            std::vector<uint8_t>(request.begin(), request.end()));
  } catch (const std::exception&) {
  }
}

std::string answer_flight_dump_request(Store& group_store, const FlightRecorder& recorder) {
  if (!group_store.check({kFlightDumpRequestKey})) return "";
  return recorder.dump("dump requested by " + group_store.get_string(kFlightDumpRequestKey));
}

bool write_hang_report(int rank, const std::string& collective, uint64_t seq,
                       const std::vector<int>& missing_ranks, const std::string& message) {
  const char* path = std::getenv("DDPLAB_ERROR_FILE");
  if (path == nullptr || *path == '\0') return false;
  const std::string tmp = temporary_name(path);
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return false;
    f << "{\"rank\": " << rank << ", \"collective\": " << quoted(collective) << ", \"seq\": " << seq
      << ", \"missing_ranks\": [";
    for (size_t i = 0; i < missing_ranks.size(); ++i) f << (i ? ", " : "") << missing_ranks[i];
    f << "], \"message\": " << quoted(message) << "}\n";
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path) == 0;
}

}  // namespace ddplab::distributed
