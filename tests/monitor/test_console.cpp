// monitor/console.h: the progress line on a terminal and in a log, and the epoch summary's figures
// and warnings, read back from the stream they were written to.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "monitor/console.h"

using namespace ddplab::monitor;

namespace {

// A temporary stream; text() is everything written to it so far.
class Captured {
 public:
  Captured() : f_(std::tmpfile()) { REQUIRE(f_ != nullptr); }
  ~Captured() { std::fclose(f_); }
  Captured(const Captured&) = delete;
  Captured& operator=(const Captured&) = delete;
  std::FILE* stream() { return f_; }
  std::string text() {
    std::fflush(f_);
    std::string s;
    std::rewind(f_);
    for (int ch; (ch = std::fgetc(f_)) != EOF;) s += static_cast<char>(ch);
    return s;
  }

 private:
  std::FILE* f_;
};

EpochTimes times(int64_t steps, double step_s, double wait_s, double allreduce_ms_sum,
                 int64_t allreduces, double monitor_s = 0) {
  EpochTimes t;
  t.steps = steps;
  t.step_seconds = step_s;
  t.comm_wait_seconds = wait_s;
  t.allreduce_ms_sum = allreduce_ms_sum;
  t.allreduces = allreduces;
  t.monitor_seconds = monitor_s;
  return t;
}

}  // namespace

TEST_CASE("Progress::format_time: minutes and seconds, hours from an hour on, unknown as --:--") {
  CHECK(Progress::format_time(0) == "00:00");
  CHECK(Progress::format_time(59.4) == "00:59");
  CHECK(Progress::format_time(61) == "01:01");
  CHECK(Progress::format_time(3599.4) == "59:59");
  CHECK(Progress::format_time(3600) == "1:00:00");
  CHECK(Progress::format_time(3725) == "1:02:05");
  CHECK(Progress::format_time(-1) == "--:--");
  CHECK(Progress::format_time(std::nan("")) == "--:--");
  CHECK(Progress::format_time(std::numeric_limits<double>::infinity()) == "--:--");
}

TEST_CASE("Progress in a log: whole lines, at most one per 10 s unless forced") {
  Captured out;
  Progress bar(out.stream(), /*tty=*/false);
  bar.update(0, 1, 40, 2.30259, 0.125, 1234.56, 75);
  const std::string line = "epoch 0 [    1/40] loss 2.3026 acc 12.50%  1234.6 img/s ETA 01:15\n";
  CHECK(out.text() == line);
  bar.update(0, 2, 40, 2.2, 0.2, 1000, 70);  // too soon: nothing
  CHECK(out.text() == line);
  bar.update(0, 40, 40, 1.5, 0.5, 1000, 0, /*force=*/true);
  CHECK(out.text() == line + "epoch 0 [   40/40] loss 1.5000 acc 50.00%  1000.0 img/s ETA 00:00\n");
  bar.end_line();  // the lines are already whole
  CHECK(out.text().size() == 2 * line.size());
}

TEST_CASE("Progress on a terminal: one line rewritten in place, ended by end_line") {
  Captured out;
  Progress bar(out.stream(), /*tty=*/true);
  bar.update(2, 3, 9, 0.5, 1, 10, std::nan(""));
  bar.update(2, 4, 9, 0.5, 1, 10, 5);  // within 0.2 s: skipped
  bar.update(2, 9, 9, 0.25, 1, 10, 0, /*force=*/true);
  bar.end_line();
  CHECK(out.text() ==
        "\repoch 2 [    3/9] loss 0.5000 acc 100.00%    10.0 img/s ETA --:--\033[K"
        "\repoch 2 [    9/9] loss 0.2500 acc 100.00%    10.0 img/s ETA 00:00\033[K\n");
}

TEST_CASE("print_epoch_summary: ms per step; under DDP the communication figures and warnings") {
  SUBCASE("an epoch without steps prints nothing") {
    Captured out;
    print_epoch_summary(EpochTimes{}, {/*ddp=*/true}, out.stream());
    CHECK(out.text().empty());
  }
  SUBCASE("one process: the step time only, whatever the communication figures say") {
    Captured out;
    print_epoch_summary(times(4, 0.1, 0.09, 4000, 10), {}, out.stream());
    CHECK(out.text() == "  25.0 ms/step\n");
  }
  SUBCASE("DDP below both thresholds; the monitor's share when monitoring") {
    Captured out;
    EpochSummaryOptions o;
    o.ddp = true;
    o.monitoring = true;
    print_epoch_summary(times(10, 1.0, 0.05, 30, 10, 0.002), o, out.stream());
    CHECK(out.text() ==
          "  100.0 ms/step; waiting on communication 5.0% of step time; mean all-reduce 3.00 ms; "
          "monitoring 0.20%\n");
  }
  SUBCASE("DDP above both thresholds: two warnings; a threshold of 0 turns its warning off") {
    EpochSummaryOptions o;
    o.ddp = true;
    const EpochTimes slow = times(2, 1.0, 0.5, 450, 3);  // 50% waiting, 150 ms per all-reduce
    Captured out;
    print_epoch_summary(slow, o, out.stream());
    CHECK(out.text() ==
          "  500.0 ms/step; waiting on communication 50.0% of step time; mean all-reduce 150.00 "
          "ms\n"
          "warning: 50.0% of step time waits on communication (> 10%): backward no longer hides "
          "the all-reduces; try a larger --batch-size or --accumulation-steps\n"
          "warning: a bucket all-reduce takes 150.0 ms on average (> 100 ms): check the network "
          "or the backend\n");
    o.comm_wait_warn = 0;
    o.allreduce_warn_ms = 0;
    Captured quiet;
    print_epoch_summary(slow, o, quiet.stream());
    CHECK(quiet.text().find("warning") == std::string::npos);
  }
}
