// The command line of examples/train beyond what CLI11 does alone: a config file in JSON or TOML
// with the same keys as the flags, the effective configuration as TOML (printed at start and
// saved beside the checkpoints and logs, so a run can be repeated with `--config FILE`), and a
// suggestion for a mistyped flag.
//
//   {"model": "resnet20", "lr": 0.05, "sync-bn": true}     (JSON: one flat object)
//   model = "resnet20"                                     (TOML: one key per line)
//   lr = 0.05
//
// Flags given on the command line win over the file (CLI11 reads the file only for options the
// command line left unset). A key that names no flag is an error that suggests the nearest one.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace ddplab::cli {

// Adds `--config FILE` to `app`: a JSON object or a TOML file (told apart by the first character)
// whose keys are the flags without their dashes. Unknown keys are an error.
void add_config_option(CLI::App& app);

// Every option of `app` with its value (defaults included) as TOML, loadable by --config.
std::string effective_config(const CLI::App& app);

// The flags on a command line that `app` does not know, each with the nearest known flag when one
// is close ("--lrr: unknown flag; did you mean --lr?"); empty when all are known.
std::vector<std::string> unknown_flags(const CLI::App& app, int argc, const char* const* argv);

// The known flag nearest to `name` (edit distance at most a third of its length, at least 2), or
// "" when none is that close.
std::string nearest_flag(const CLI::App& app, const std::string& name);

}  // namespace ddplab::cli
