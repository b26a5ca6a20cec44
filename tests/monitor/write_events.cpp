// Writes a known event file for tests/monitor/check_monitoring.py's TensorBoard case: the values
// below are what TensorBoard's own reader must find.
#include <cstdio>

#include "monitor/summary_writer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_events LOGDIR\n");
    return 2;
  }
  ddplab::monitor::SummaryWriter w(argv[1]);
  for (int step = 0; step < 5; ++step) {
    w.add_scalar("train/loss", 2.0 / (step + 1), step);
    w.add_scalar("val/accuracy", 0.5 + 0.1 * step, step);
  }
  w.add_text("backend", "gloo", 0);
  w.close();
  std::printf("%s\n", w.file_name().c_str());
  return 0;
}
