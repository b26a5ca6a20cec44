// MetricsLog: JSON lines or CSV rows (see metrics_log.h).
#include "monitor/metrics_log.h"

#include <filesystem>
#include <sstream>

#include "tensor/error.h"

namespace ddplab::monitor {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The header of an existing CSV file (its first line split at commas), or none.
std::vector<std::string> read_header(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::vector<std::string> cols;
  if (!std::getline(f, line)) return cols;
  std::stringstream ss(line);
  for (std::string col; std::getline(ss, col, ',');) cols.push_back(col);
  return cols;
}

// A value as a CSV field: numbers as JSON writes them, strings bare (our keys and values never
// hold commas or quotes).
std::string csv_field(const nlohmann::ordered_json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path), csv_(ends_with(path, ".csv")) {
  if (csv_) columns_ = read_header(path);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;  // a failure shows as the open's error below
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path, std::ios::app);
  DDP_CHECK(out_.good(), "--metrics: cannot open '" << path << "' for appending");
}

void MetricsLog::write(const nlohmann::ordered_json& row) {
  if (!csv_) {
    out_ << row.dump() << "\n";
  } else {
    if (columns_.empty()) {  // a new file: this row's keys are the header
      std::string header;
      for (const auto& [key, value] : row.items()) {
        columns_.push_back(key);
        header += (header.empty() ? "" : ",") + key;
      }
      out_ << header << "\n";
    }
    DDP_CHECK(row.size() == columns_.size(),
              "MetricsLog: '" << path_ << "' has " << columns_.size() << " columns, the row has "
                              << row.size() << " values: " << row.dump());
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      DDP_CHECK(row.contains(columns_[i]), "MetricsLog: '" << path_ << "': the row has no column '"
                                                           << columns_[i]
                                                           << "' of the header: " << row.dump());
      line += (i ? "," : "") + csv_field(row[columns_[i]]);
    }
    out_ << line << "\n";
  }
  out_.flush();
}

}  // namespace ddplab::monitor
