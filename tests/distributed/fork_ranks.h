// Multi-process tests without a launcher: fork one child per rank, each with a TCPStore (rank 0
// hosts it on a free port) and, through make_group, a Gloo process group.
//
// Fork before any Gloo device, CUDA context or OpenMP pool exists in the parent (fork would not
// copy their threads): the parent of run_ranks should run no tensor op itself. The children
// report failures on stderr and through their exit status, which run_ranks checks.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group_gloo.h"
#include "comm/store/store.h"
#include "comm/store/store_socket.h"

namespace ddplab::testing {

using distributed::GlooOptions;
using distributed::ProcessGroupGloo;
using distributed::Store;
using distributed::TCPStore;
using namespace std::chrono_literals;

// CHECK for the children: throws, and the child turns it into exit status 1.
#define EXPECT(cond, msg)                                            \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::ostringstream os_;                                        \
      os_ << "line " << __LINE__ << ": " #cond " is false: " << msg; \
      throw std::runtime_error(os_.str());                           \
    }                                                                \
  } while (0)

using RankFn = std::function<void(int rank, int world, const std::shared_ptr<TCPStore>& store)>;

// Forks `world` children running fn(rank, ...); checks that each exits 0 within `deadline`.
inline void run_ranks(int world, const RankFn& fn, std::chrono::seconds deadline = 60s) {
  const int port = distributed::net::pick_free_port("127.0.0.1");
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      try {
        auto store = std::make_shared<TCPStore>("127.0.0.1", port, r == 0, 30s);
        fn(r, world, store);
        // Rank 0 hosts the store, so it leaves last.
        store->set("exit/" + std::to_string(r), std::string("1"));
        if (r == 0) {
          std::vector<std::string> keys;
          for (int k = 0; k < world; ++k) keys.push_back("exit/" + std::to_string(k));
          store->wait(keys);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d of %d] %s\n", r, world, e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<int> status(world, -1);
  for (int r = 0; r < world; ++r) {
    for (;;) {
      pid_t got = waitpid(pids[r], &status[r], WNOHANG);
      if (got == pids[r]) break;
      if (std::chrono::steady_clock::now() > until) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[r], &status[r], 0);
        FAIL("rank " << r << " of " << world << " did not finish within " << deadline.count()
                     << " s (killed)");
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  for (int r = 0; r < world; ++r)
    CHECK_MESSAGE((WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0),
                  "rank " << r << " of " << world << " failed (status " << status[r]
                          << "); its message is on stderr above");
}

// Every rank arrives before any leaves (through the store, not through the group under test).
inline void store_sync(Store& store, const std::string& name, int rank, int world) {
  store.set(name + "/" + std::to_string(rank), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(name + "/" + std::to_string(r));
  store.wait(keys);
}

inline std::unique_ptr<ProcessGroupGloo> make_group(int rank, int world,
                                                    const std::shared_ptr<TCPStore>& store,
                                                    std::chrono::milliseconds timeout = 20s) {
  GlooOptions o;
  o.timeout = timeout;
  o.group_name = "test";
  o.interface.hostname = "127.0.0.1";
  return std::make_unique<ProcessGroupGloo>(store, rank, world, o);
}

// Ends a test body: all ranks finished their last collective before any group is torn down.
inline void finish(std::unique_ptr<ProcessGroupGloo>& pg, Store& store) {
  store_sync(store, "finish", pg->rank(), pg->size());
  pg.reset();
}

// The whole text of a file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A fresh temporary folder, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddplab_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Every variable launch_env_from_environment reads, for EnvGuard.
inline const std::vector<std::string> kLaunchVars = {"RANK",
                                                     "WORLD_SIZE",
                                                     "LOCAL_RANK",
                                                     "LOCAL_WORLD_SIZE",
                                                     "MASTER_ADDR",
                                                     "MASTER_PORT",
                                                     "TORCHELASTIC_RESTART_COUNT",
                                                     "TORCHELASTIC_USE_AGENT_STORE",
                                                     "OMPI_COMM_WORLD_RANK",
                                                     "OMPI_COMM_WORLD_SIZE",
                                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                     "PMI_RANK",
                                                     "PMI_SIZE",
                                                     "MPI_LOCALRANKID",
                                                     "MPI_LOCALNRANKS",
                                                     "SLURM_PROCID",
                                                     "SLURM_NTASKS",
                                                     "SLURM_LOCALID",
                                                     "SLURM_NTASKS_PER_NODE",
                                                     "SLURM_TASKS_PER_NODE",
                                                     "SLURM_NNODES",
                                                     "SLURM_JOB_NUM_NODES",
                                                     "DDPLAB_COLLECTIVE_TIMEOUT"};

// What torchrun gives a worker of a one-machine job whose store is on 127.0.0.1:`port`.
inline void set_torchrun_env(int rank, int world, int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

// Clears the named variables for a test and restores their old values after it.
struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit EnvGuard(const std::vector<std::string>& names) {
    for (const auto& n : names) {
      const char* v = std::getenv(n.c_str());
      saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(n.c_str());
    }
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved) {
      if (v)
        setenv(n.c_str(), v->c_str(), 1);
      else
        unsetenv(n.c_str());
    }
  }
};

}  // namespace ddplab::testing
