// MetricsLog: one row of numbers per epoch appended to a file, as JSON lines, or as CSV when the
// file name ends in ".csv" (what a spreadsheet or pandas.read_csv opens; scripts/plot reads both).
//
//   monitor::MetricsLog log("metrics.csv");
//   log.write({{"epoch", 0}, {"train_loss", 0.61}, {"test_acc", 0.87}});
//
// CSV takes its columns from the first row written to an empty file; a later row must have the
// same keys (train writes the same keys every epoch of a run). Appending to a file that already
// has rows keeps its header, so a resumed run continues the same table.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddplab::monitor {

class MetricsLog {
 public:
  // Opens `path` for appending (creating its folder); throws Error when it cannot.
  explicit MetricsLog(const std::string& path);
  // One row: a flat JSON object of numbers (or strings).
  void write(const nlohmann::ordered_json& row);
  bool is_csv() const { return csv_; }

 private:
  std::string path_;
  bool csv_ = false;
  std::vector<std::string> columns_;  // CSV: the header's keys, in order
  std::ofstream out_;
};

}  // namespace ddplab::monitor
