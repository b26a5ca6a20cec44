// The console of a training run (docs/monitoring.md, "Console"): a progress line while an epoch
// runs, and the summary of where its step time went once it ends.
//
//   monitor::Progress bar;
//   for (...) bar.update(epoch, step, steps_per_epoch, loss, acc, images_per_sec, eta_seconds);
//   bar.end_line();
//   monitor::print_epoch_summary(mon.end_epoch(), {/*ddp=*/true});
//
// Both write to stdout unless given another stream (the tests read what they wrote).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "monitor/step_monitor.h"

namespace ddplab::monitor {

// On a terminal: one line rewritten in place. Otherwise (logs, CI): a line every ~10 s, so that a
// log file neither fills with carriage returns nor stays silent for a whole epoch.
class Progress {
 public:
  using Clock = std::chrono::steady_clock;

  // Draws in place when `out` is a terminal.
  explicit Progress(std::FILE* out = stdout);
  Progress(std::FILE* out, bool tty) : out_(out), tty_(tty) {}

  // Draws the line unless one was drawn less than 0.2 s (terminal) or 10 s (otherwise) ago;
  // `force` draws it anyway (an epoch's last step). `acc` is a fraction; `eta_s` may be NaN or
  // infinite before the first step's time is known.
  void update(int epoch, int64_t step, int64_t steps, double loss, double acc, double ips,
              double eta_s, bool force = false);
  // Ends the line drawn in place, so that what is printed next starts on a line of its own.
  void end_line();

  // "mm:ss", or "h:mm:ss" from an hour on; "--:--" when unknown.
  static std::string format_time(double seconds);

 private:
  std::FILE* out_;
  bool tty_;
  Clock::time_point last_{};
};

struct EpochSummaryOptions {
  bool ddp = false;                // show the communication figures (and warn about them)
  bool monitoring = false;         // show the monitor's own share (with --logdir or --trace-dir)
  double comm_wait_warn = 0.10;    // warn above this share of step time; 0: never
  double allreduce_warn_ms = 100;  // warn above this mean bucket all-reduce; 0: never
};

// The indented line under an epoch's result: ms per step and, under DDP, the share of it spent
// waiting on communication and the mean all-reduce, then a warning for each figure above its
// threshold (the labs' thresholds by default). Nothing for an epoch without steps.
void print_epoch_summary(const EpochTimes& t, const EpochSummaryOptions& o,
                         std::FILE* out = stdout);

}  // namespace ddplab::monitor
