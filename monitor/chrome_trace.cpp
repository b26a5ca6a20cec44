// ChromeTrace: trace-event JSON written as it comes (see chrome_trace.h).
#include "monitor/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tensor/error.h"

namespace ddplab::monitor {

double trace_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

ChromeTrace::ChromeTrace(const std::string& path, int pid) : path_(path), pid_(pid) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path);
  DDP_CHECK(out_.good(), "ChromeTrace: cannot create the trace file '" << path << "'");
  out_ << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  // Metadata events name the process and its rows in the viewer.
  write(
      {{"name", "process_name"}, {"ph", "M"}, {"args", {{"name", "rank " + std::to_string(pid)}}}});
  write({{"name", "thread_name"},
         {"ph", "M"},
         {"tid", kComputeTrack},
         {"args", {{"name", "compute"}}}});
  write({{"name", "thread_name"},
         {"ph", "M"},
         {"tid", kCommTrack},
         {"args", {{"name", "all-reduce"}}}});
}

ChromeTrace::~ChromeTrace() {
  close();
}

void ChromeTrace::write(nlohmann::json event) {
  if (!event.contains("tid")) event["tid"] = kComputeTrack;
  event["pid"] = pid_;
  write_line(event.dump());
}

void ChromeTrace::write_line(const std::string& line) {
  if (!out_.is_open()) return;
  out_ << (first_ ? "" : ",\n") << line;
  first_ = false;
}

// Note [Trace events by snprintf]
// A step writes a dozen events, so their cost is part of the step's (docs/monitoring.md#overhead).
// They are formatted with snprintf into a fixed layout, times printed from integer nanoseconds as
// "us.nnn", rather than built as nlohmann::json objects with double times: callgrind counts ~150k
// instructions for a step of 4 buckets (20 events) this way, ~190k the other way (printf's %f of a
// 1e10-sized double is slow). Names are quoted with the JSON library: a caller may pass any string.
namespace {

int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Nanoseconds as microseconds with 3 decimals (the trace's unit), without floating point.
std::string us_text(int64_t ns) {
  char buf[32];
  const char* sign = ns < 0 ? "-" : "";
  const long long a = ns < 0 ? -ns : ns;
  std::snprintf(buf, sizeof buf, "%s%lld.%03lld", sign, a / 1000, a % 1000);
  return buf;
}

}  // namespace

std::string ChromeTrace::event_line(const std::string& name, const std::string& category,
                                    const char* phase, int tid, int64_t ts_ns, int64_t dur_ns,
                                    const std::string& args_json) const {
  char head[64];
  std::snprintf(head, sizeof head, R"(,"ph":"%s","pid":%d,"tid":%d,"ts":)", phase, pid_, tid);
  std::string line = "{\"name\":" + nlohmann::json(name).dump() +
                     ",\"cat\":" + nlohmann::json(category).dump() + head + us_text(ts_ns);
  if (dur_ns >= 0) {
    line += ",\"dur\":" + us_text(dur_ns);
  } else {
    line += ",\"s\":\"t\"";  // an instant event spanning its row (thread)
  }
  if (!args_json.empty()) line += ",\"args\":" + args_json;
  return line + "}";
}

void ChromeTrace::complete(const std::string& name, const std::string& category, int tid,
                           TimePoint start, TimePoint end, const nlohmann::json& args) {
  const int64_t ts = ns_of(start);
  write_line(event_line(name, category, "X", tid, ts, std::max<int64_t>(ns_of(end) - ts, 0),
                        args.is_null() ? std::string() : args.dump()));
}

void ChromeTrace::instant(const std::string& name, const std::string& category, int tid,
                          TimePoint at, const nlohmann::json& args) {
  write_line(event_line(name, category, "i", tid, ns_of(at), -1,
                        args.is_null() ? std::string() : args.dump()));
}

void ChromeTrace::add_reducer_iteration(const distributed::IterationTimeline& t) {
  const int64_t t0 = ns_of(t.start);
  auto at = [t0](double ms) { return t0 + static_cast<int64_t>(std::llround(ms * 1e6)); };
  for (size_t k = 0; k < t.buckets.size(); ++k) {
    const distributed::BucketTimes& b = t.buckets[k];
    if (b.ready_ms < 0 || b.launched_ms < 0 || b.finished_ms < 0) continue;  // not all happened
    const int64_t ready = at(b.ready_ms), launched = at(b.launched_ms), done = at(b.finished_ms);
    const std::string args =
        "{\"bucket\":" + std::to_string(k) + ",\"iteration\":" + std::to_string(t.iteration) +
        ",\"ready_us\":" + us_text(ready) + ",\"launched_us\":" + us_text(launched) +
        ",\"done_us\":" + us_text(done) + "}";
    const std::string id = "bucket " + std::to_string(k);
    write_line(event_line(id + " ready", "bucket", "i", kCommTrack, ready, -1, args));
    write_line(
        event_line("all-reduce " + id, "bucket", "X", kCommTrack, launched, done - launched, args));
  }
}

void ChromeTrace::close() {
  if (!out_.is_open()) return;
  out_ << "\n]}\n";
  out_.close();
}

}  // namespace ddplab::monitor
