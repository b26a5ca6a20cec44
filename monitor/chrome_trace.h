// ChromeTrace: a timeline of one process in the Chrome trace-event format, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   monitor::ChromeTrace trace("traces/rank0.json", /*pid=*/rank);
//   trace.complete("forward", "compute", kComputeTrack, start, end);
//   trace.add_reducer_iteration(ddp->reducer().last_iteration_timeline());
//
// The file is {"traceEvents": [...]}, one event per line, written as the events come so that a
// long run holds nothing in memory. Times are microseconds of steady_clock, which on Linux is
// CLOCK_MONOTONIC: the same clock for every process of one machine, so tools/merge-traces can put
// the ranks of a one-machine job side by side without shifting them. (Across machines the clocks
// differ by an unknown offset.)
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ddp/reducer_timeline.h"

namespace ddplab::monitor {

// The rows ("threads") of one rank's timeline.
constexpr int kComputeTrack = 0;  // data wait, forward, backward, optimizer step
constexpr int kCommTrack = 1;     // each bucket's ready, and its all-reduce from launch to done

class ChromeTrace {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Creates `path` (and its folder); `pid` groups this file's events (the rank).
  ChromeTrace(const std::string& path, int pid);
  ~ChromeTrace();
  ChromeTrace(const ChromeTrace&) = delete;
  ChromeTrace& operator=(const ChromeTrace&) = delete;

  // A span (phase "X") on row `tid`.
  void complete(const std::string& name, const std::string& category, int tid, TimePoint start,
                TimePoint end, const nlohmann::json& args = nullptr);
  // A point in time (phase "i").
  void instant(const std::string& name, const std::string& category, int tid, TimePoint at,
               const nlohmann::json& args = nullptr);
  // The Reducer's buckets of one synchronized backward: for bucket k an instant
  // "bucket k ready" and a span "all-reduce bucket k" from launch to done, with all three times
  // (microseconds) and the iteration in its args.
  void add_reducer_iteration(const distributed::IterationTimeline& timeline);

  // Ends the JSON; the destructor does it too.
  void close();
  const std::string& path() const { return path_; }

 private:
  void write(nlohmann::json event);  // a metadata event
  void write_line(const std::string& line);
  // One event as a JSON line (Note [Trace events by snprintf]); dur_ns < 0: an instant.
  std::string event_line(const std::string& name, const std::string& category, const char* phase,
                         int tid, int64_t ts_ns, int64_t dur_ns,
                         const std::string& args_json) const;

  std::string path_;
  int pid_;
  std::ofstream out_;
  bool first_ = true;
};

// Microseconds of steady_clock: the trace's time axis.
double trace_us(std::chrono::steady_clock::time_point t);

}  // namespace ddplab::monitor
