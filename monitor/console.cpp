// The progress line and the epoch summary (see console.h).
#include "monitor/console.h"

#include <unistd.h>

#include <cmath>

namespace ddplab::monitor {

Progress::Progress(std::FILE* out) : Progress(out, isatty(fileno(out)) != 0) {}

void Progress::update(int epoch, int64_t step, int64_t steps, double loss, double acc, double ips,
                      double eta_s, bool force) {
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (!force && since < (tty_ ? 0.2 : 10.0)) return;
  last_ = now;
  char buf[256];
  std::snprintf(buf, sizeof buf, "epoch %d [%5lld/%lld] loss %.4f acc %5.2f%% %7.1f img/s ETA %s",
                epoch, static_cast<long long>(step), static_cast<long long>(steps), loss, 100 * acc,
                ips, format_time(eta_s).c_str());
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K", buf);  // back to the line's start, then clear its rest
  } else {
    std::fprintf(out_, "%s\n", buf);
  }
  std::fflush(out_);
}

void Progress::end_line() {
  if (tty_) std::fprintf(out_, "\n");
}

std::string Progress::format_time(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long t = std::lround(seconds);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  }
  return buf;
}

void print_epoch_summary(const EpochTimes& t, const EpochSummaryOptions& o, std::FILE* out) {
  if (t.steps == 0) return;
  std::fprintf(out, "  %.1f ms/step", 1e3 * t.step_seconds / static_cast<double>(t.steps));
  if (o.ddp) {
    std::fprintf(out, "; waiting on communication %.1f%% of step time; mean all-reduce %.2f ms",
                 100 * t.comm_wait_share(), t.mean_allreduce_ms());
  }
  if (o.monitoring) std::fprintf(out, "; monitoring %.2f%%", 100 * t.monitor_share());
  std::fprintf(out, "\n");
  if (o.ddp && o.comm_wait_warn > 0 && t.comm_wait_share() > o.comm_wait_warn) {
    std::fprintf(
        out,
        "warning: %.1f%% of step time waits on communication (> %.0f%%): backward no longer "
        "hides the all-reduces; try a larger --batch-size or --accumulation-steps\n",
        100 * t.comm_wait_share(), 100 * o.comm_wait_warn);
  }
  if (o.ddp && o.allreduce_warn_ms > 0 && t.mean_allreduce_ms() > o.allreduce_warn_ms) {
    std::fprintf(out,
                 "warning: a bucket all-reduce takes %.1f ms on average (> %g ms): check the "
                 "network or the backend\n",
                 t.mean_allreduce_ms(), o.allreduce_warn_ms);
  }
}

}  // namespace ddplab::monitor
