// Config files, the effective configuration and flag suggestions for examples/train
// (examples/cli_config.h).
#include "examples/cli_config.h"

#include <algorithm>
#include <istream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddplab::cli {

namespace {

// The long names of `app`'s options ("lr", "sync-bn"), without dashes.
std::vector<std::string> long_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back(n);
  }
  return names;
}

// The number of single-character insertions, deletions and substitutions turning a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// CLI11 reads TOML by itself; this formatter adds JSON, told apart by its opening brace, and
// turns a key that names no flag into an error with a suggestion (CLI11 would say only that it
// could not parse it).
class JsonOrTomlConfig : public CLI::ConfigTOML {
 public:
  explicit JsonOrTomlConfig(const CLI::App* app) : app_(app) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string text(std::istreambuf_iterator<char>(input), {});
    const size_t first = text.find_first_not_of(" \t\r\n");
    std::vector<CLI::ConfigItem> items;
    if (first != std::string::npos && text[first] == '{') {
      items = from_json(text);
    } else {
      std::istringstream toml(text);
      items = CLI::ConfigTOML::from_config(toml);
    }
    for (const CLI::ConfigItem& item : items) check_known(item);
    return items;
  }

 private:
  static std::vector<CLI::ConfigItem> from_json(const std::string& text) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw CLI::ConfigError(std::string("--config: not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw CLI::ConfigError("--config: a JSON config must be one object");
    std::vector<CLI::ConfigItem> items;
    for (const auto& [key, value] : j.items()) {
      CLI::ConfigItem item;
      item.name = key;
      auto add = [&](const nlohmann::json& v) {
        if (v.is_string()) {
          item.inputs.push_back(v.get<std::string>());
        } else if (v.is_boolean() || v.is_number()) {
          item.inputs.push_back(v.dump());
        } else {
          throw CLI::ConfigError("--config: the value of '" + key + "' is " + v.type_name() +
                                 "; values are strings, numbers, booleans or lists of them");
        }
      };
      if (value.is_array()) {
        for (const auto& v : value) add(v);
      } else {
        add(value);
      }
      items.push_back(item);
    }
    return items;
  }

  void check_known(const CLI::ConfigItem& item) const {
    if (!item.parents.empty()) {
      throw CLI::ConfigError("--config: '" + item.fullname() +
                             "' is nested; the keys are the flags' names, at the top level");
    }
    if (app_->get_option_no_throw("--" + item.name) != nullptr) return;
    if (item.name == "config")
      throw CLI::ConfigError("--config: a config file cannot name another");
    std::string message = "--config: '" + item.name + "' is not a flag of " + app_->get_name();
    const std::string near = nearest_flag(*app_, item.name);
    if (!near.empty()) message += "; did you mean '" + near + "'?";
    throw CLI::ConfigError(message);
  }

  const CLI::App* app_;
};

}  // namespace

void add_config_option(CLI::App& app) {
  app.set_config("--config", "", "read flags from a JSON or TOML file (keys: the flag names)");
  app.config_formatter(std::make_shared<JsonOrTomlConfig>(&app));
  app.allow_config_extras(CLI::config_extras_mode::error);
}

std::string effective_config(const CLI::App& app) {
  // CLI11's own TOML writer, less the empty strings: they are the defaults of the options that
  // take a path or a choice (--save, --amp), and `amp=""` would not pass --amp's check when read
  // back.
  std::istringstream all(
      CLI::ConfigTOML().to_config(&app, /*default_also=*/true, /*write_description=*/false, ""));
  std::string out;
  for (std::string line; std::getline(all, line);) {
    const std::string empty = "=\"\"";
    if (line.size() >= empty.size() &&
        line.compare(line.size() - empty.size(), empty.size(), empty) == 0)
      continue;
    out += line + "\n";
  }
  return out;
}

std::string nearest_flag(const CLI::App& app, const std::string& name) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& known : long_names(app)) {
    const size_t d = edit_distance(name, known);
    if (d < best_distance) best = known, best_distance = d;
  }
  return best;
}

std::vector<std::string> unknown_flags(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> messages;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;  // what follows is not a flag
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const std::string name = arg.substr(2, arg.find('=') - 2);
    if (app.get_option_no_throw("--" + name) != nullptr || name == "help") continue;
    std::string message = "--" + name + ": unknown flag";
    const std::string near = nearest_flag(app, name);
    if (!near.empty()) message += "; did you mean --" + near + "?";
    messages.push_back(message);
  }
  return messages;
}

}  // namespace ddplab::cli
