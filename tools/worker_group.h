// The local workers of one ddprun round: spawn them in their own process groups, relay their
// output line by line with a "[rankN]: " prefix (and into per-rank log files), reap them, and stop
// them (SIGTERM, grace period, SIGKILL) so that no process outlives the launcher.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddplab::tools {

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> env;  // the complete environment, "KEY=VALUE"
};

// How a worker ended: exit code, or the signal that killed it.
struct WorkerExit {
  int rank = 0;
  pid_t pid = 0;
  int code = 0;    // exit code, or 128 + signal
  int signal = 0;  // 0 when it exited normally
  bool failed() const { return code != 0; }
  std::string describe() const;  // "rank 1 (pid 42) exited with code 1"
};

class WorkerGroup {
 public:
  // `log_dir` empty: output goes to the console only.
  WorkerGroup(std::vector<std::string> argv, std::string log_dir);
  ~WorkerGroup();

  // Starts one process per spec. `round` 0 truncates the log files; later rounds append.
  void start(const std::vector<WorkerSpec>& specs, int round);
  // Relays output and reaps exits for up to `timeout` (returns early on a failure).
  void poll(std::chrono::milliseconds timeout);
  // The first worker that failed this round, in the order they were reaped.
  std::optional<WorkerExit> first_failure() const { return first_failure_; }
  bool all_succeeded() const;
  // Sends `sig` to every worker's process group, waits up to `grace`, then SIGKILLs what is left
  // and reaps everything. Afterwards the group is empty. A stopped worker (SIGSTOP, a debugger)
  // is continued after `sig`, so that it can act on it.
  void stop(int sig, std::chrono::milliseconds grace);

  // The workers still running, and their pids.
  struct Running {
    int rank = 0;
    pid_t pid = 0;
  };
  std::vector<Running> running() const;
  // SIGKILLs one worker's process group at once (a hung rank needs no grace period).
  void kill_rank(int rank);

 private:
  struct Worker;
  void relay(Worker& w, int stream, bool flush_partial);
  void reap(bool block);

  std::vector<std::string> argv_;
  std::string log_dir_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::optional<WorkerExit> first_failure_;
};

// Resolves `program` through PATH the way execvp would; returns it unchanged when not found.
std::string resolve_program(const std::string& program);

// The state letter of a process from /proc/<pid>/stat: 'R' running, 'S' sleeping, 'T' stopped
// (SIGSTOP), 't' stopped by a debugger, 'Z' zombie...; '?' when unknown.
char process_state(pid_t pid);

}  // namespace ddplab::tools
