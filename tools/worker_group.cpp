// Spawning, output relay, reaping and stopping of the local workers (see worker_group.h).
#include "tools/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "tensor/error.h"

namespace ddplab::tools {

struct WorkerGroup::Worker {
  int rank = 0;
  pid_t pid = 0;
  int fds[2] = {-1, -1};  // read ends of the worker's stdout and stderr pipes
  std::string partial[2];
  std::ofstream log;
  std::optional<WorkerExit> exit;
};

std::string WorkerExit::describe() const {
  std::ostringstream os;
  os << "rank " << rank << " (pid " << pid << ")";
  if (signal) {
    const char* name = sigabbrev_np(signal);
    os << " was killed by signal " << signal << " (SIG" << (name ? name : "?") << ")";
  } else {
    os << " exited with code " << code;
  }
  return os.str();
}

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string full = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return program;
}

WorkerGroup::WorkerGroup(std::vector<std::string> argv, std::string log_dir)
    : argv_(std::move(argv)), log_dir_(std::move(log_dir)) {
  argv_[0] = resolve_program(argv_[0]);
}

WorkerGroup::~WorkerGroup() {
  stop(SIGKILL, std::chrono::milliseconds(0));
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs, int round) {
  workers_.clear();
  first_failure_.reset();
  if (!log_dir_.empty()) ::mkdir(log_dir_.c_str(), 0755);
  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : argv_) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  std::string exec_error =
      "ddprun: cannot execute '" + argv_[0] + "' (not found or not executable)\n";
  for (const auto& spec : specs) {
    auto w = std::make_unique<Worker>();
    w->rank = spec.rank;
    if (!log_dir_.empty()) {
      std::string path = log_dir_ + "/rank" + std::to_string(spec.rank) + ".log";
      w->log.open(path, round == 0 ? std::ios::trunc : std::ios::app);
      DDP_CHECK(w->log, "ddprun: cannot open log file " << path);
      if (round > 0) w->log << "=== ddprun: restart " << round << " ===" << std::endl;
    }
    std::vector<char*> envp;
    for (auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int out[2], err[2];
    DDP_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0,
              "ddprun: pipe failed: " << std::strerror(errno));
    pid_t pid = ::fork();
    DDP_CHECK(pid >= 0, "ddprun: fork failed: " << std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);  // own group: a stop reaches the worker's children too
      // If ddprun dies (even by SIGKILL) the kernel kills the worker: no orphans.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(1);
      ::signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      [[maybe_unused]] ssize_t n = ::write(2, exec_error.data(), exec_error.size());
      _exit(127);
    }
    ::setpgid(pid, pid);  // also from the parent, so a stop right after fork finds the group
    ::close(out[1]);
    ::close(err[1]);
    w->pid = pid;
    w->fds[0] = out[0];
    w->fds[1] = err[0];
    workers_.push_back(std::move(w));
  }
}

void WorkerGroup::relay(Worker& w, int stream, bool flush_partial) {
  char buf[4096];
  ssize_t n = ::read(w.fds[stream], buf, sizeof(buf));
  if (n > 0) w.partial[stream].append(buf, size_t(n));
  bool eof = n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
  std::string& s = w.partial[stream];
  std::ostream& console = stream == 0 ? std::cout : std::cerr;
  size_t start = 0, nl;
  while ((nl = s.find('\n', start)) != std::string::npos) {
    std::string line = s.substr(start, nl - start);
    console << "[rank" << w.rank << "]: " << line << '\n';
    if (w.log.is_open()) w.log << line << '\n';
    start = nl + 1;
  }
  s.erase(0, start);
  if ((eof || flush_partial) && !s.empty()) {
    console << "[rank" << w.rank << "]: " << s << '\n';
    if (w.log.is_open()) w.log << s << '\n';
    s.clear();
  }
  console.flush();
  if (w.log.is_open()) w.log.flush();
  if (eof) {
    ::close(w.fds[stream]);
    w.fds[stream] = -1;
  }
}

void WorkerGroup::reap(bool block) {
  for (auto& w : workers_) {
    if (w->exit) continue;
    int status = 0;
    pid_t r = ::waitpid(w->pid, &status, block ? 0 : WNOHANG);
    if (r != w->pid) continue;
    WorkerExit e;
    e.rank = w->rank;
    e.pid = w->pid;
    if (WIFSIGNALED(status)) {
      e.signal = WTERMSIG(status);
      e.code = 128 + e.signal;
    } else {
      e.code = WEXITSTATUS(status);
    }
    w->exit = e;
    if (e.failed() && !first_failure_) first_failure_ = e;
  }
}

void WorkerGroup::poll(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, int>> owners;
  for (auto& w : workers_)
    for (int s = 0; s < 2; ++s)
      if (w->fds[s] >= 0) {
        fds.push_back({w->fds[s], POLLIN, 0});
        owners.push_back({w.get(), s});
      }
  if (fds.empty()) {
    reap(false);
    if (!all_succeeded() && !first_failure_) ::poll(nullptr, 0, int(timeout.count()));
  } else if (::poll(fds.data(), fds.size(), int(timeout.count())) > 0) {
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents) relay(*owners[i].first, owners[i].second, false);
  }
  reap(false);
}

bool WorkerGroup::all_succeeded() const {
  for (auto& w : workers_)
    if (!w->exit || w->exit->failed()) return false;
  return true;
}

void WorkerGroup::stop(int sig, std::chrono::milliseconds grace) {
  auto alive = [this] {
    for (auto& w : workers_)
      if (!w->exit) return true;
    return false;
  };
  for (auto& w : workers_)
    if (!w->exit) {
      ::kill(-w->pid, sig);
      ::kill(-w->pid, SIGCONT);  // a stopped process keeps SIGTERM pending until continued
    }
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (alive() && std::chrono::steady_clock::now() < deadline)
    poll(std::chrono::milliseconds(20));
  // Kill whatever is left, including children a worker left behind in its group.
  for (auto& w : workers_) ::kill(-w->pid, SIGKILL);
  reap(true);
  for (auto& w : workers_)
    for (int s = 0; s < 2; ++s)
      if (w->fds[s] >= 0) {
        ::fcntl(w->fds[s], F_SETFL, O_NONBLOCK);
        relay(*w, s, true);
        if (w->fds[s] >= 0) ::close(w->fds[s]);
        w->fds[s] = -1;
      }
  // Forget the pids: they may be reused once reaped, and must never be signalled again.
  workers_.clear();
}

std::vector<WorkerGroup::Running> WorkerGroup::running() const {
  std::vector<Running> out;
  for (auto& w : workers_)
    if (!w->exit) out.push_back({w->rank, w->pid});
  return out;
}

void WorkerGroup::kill_rank(int rank) {
  for (auto& w : workers_)
    if (w->rank == rank && !w->exit) ::kill(-w->pid, SIGKILL);
}

char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  // "pid (comm) S ...": the command may itself hold ')' or spaces, so look after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return '?';
  return stat[close + 2];
}

}  // namespace ddplab::tools
