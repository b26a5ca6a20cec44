// ChromeTrace: trace-event JSON written as it comes (see chrome_trace.h).
#include "monitor/chrome_trace.h"

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
  if (!out_.is_open()) return;
  event["pid"] = pid_;
  if (!event.contains("tid")) event["tid"] = kComputeTrack;
  out_ << (first_ ? "" : ",\n") << event.dump();
  first_ = false;
}

void ChromeTrace::complete(const std::string& name, const std::string& category, int tid,
                           TimePoint start, TimePoint end, const nlohmann::json& args) {
  nlohmann::json e = {
      {"name", name}, {"cat", category},       {"ph", "X"},
      {"tid", tid},   {"ts", trace_us(start)}, {"dur", trace_us(end) - trace_us(start)}};
  if (!args.is_null()) e["args"] = args;
  write(std::move(e));
}

void ChromeTrace::instant(const std::string& name, const std::string& category, int tid,
                          TimePoint at, const nlohmann::json& args) {
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "i"},
                      {"s", "t"},     {"tid", tid},      {"ts", trace_us(at)}};
  if (!args.is_null()) e["args"] = args;
  write(std::move(e));
}

void ChromeTrace::add_reducer_iteration(const distributed::IterationTimeline& t) {
  const double t0 = trace_us(t.start);
  for (size_t k = 0; k < t.buckets.size(); ++k) {
    const distributed::BucketTimes& b = t.buckets[k];
    if (b.ready_ms < 0 || b.launched_ms < 0 || b.finished_ms < 0) continue;  // not all happened
    const double ready = t0 + 1e3 * b.ready_ms, launched = t0 + 1e3 * b.launched_ms,
                 done = t0 + 1e3 * b.finished_ms;
    const nlohmann::json args = {{"bucket", k},
                                 {"iteration", t.iteration},
                                 {"ready_us", ready},
                                 {"launched_us", launched},
                                 {"done_us", done}};
    const std::string id = "bucket " + std::to_string(k);
    write({{"name", id + " ready"},
           {"cat", "bucket"},
           {"ph", "i"},
           {"s", "t"},
           {"tid", kCommTrack},
           {"ts", ready},
           {"args", args}});
    write({{"name", "all-reduce " + id},
           {"cat", "bucket"},
           {"ph", "X"},
           {"tid", kCommTrack},
           {"ts", launched},
           {"dur", done - launched},
           {"args", args}});
  }
}

void ChromeTrace::close() {
  if (!out_.is_open()) return;
  out_ << "\n]}\n";
  out_.close();
}

}  // namespace ddplab::monitor
