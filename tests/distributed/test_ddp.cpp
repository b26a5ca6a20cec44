// Tests of DistributedDataParallel on CPU with the Gloo group: each test hosts a TCPStore, starts
// W ddp_worker processes (env DDP_WORKER) that rendezvous through it, and requires every rank to
// exit 0. The checks themselves run inside the workers (see tests/distributed/ddp_worker.cpp);
// their "RESULT" lines are shown here, so `meson test -v` prints the numbers.
//
// Why processes and not threads: DDP is a multi-process design (one replica per process); and
// why spawn a fresh binary rather than fork() this one: a forked child of a process that has
// already started OpenMP or store threads inherits locks in an unknown state.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RankResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `scenario` on `world` ranks; returns each rank's exit code and output. Kills the job and
// fails the test after `timeout`.
std::vector<RankResult> run_job(const std::string& scenario, int world,
                                const std::vector<std::string>& args = {},
                                std::chrono::seconds timeout = 50s) {
  const char* worker = std::getenv("DDP_WORKER");
  REQUIRE_MESSAGE(worker != nullptr, "DDP_WORKER is not set; run through meson test");
  ddplab::distributed::TCPStore store("127.0.0.1", 0, /*is_server=*/true, 60s);
  char tmpl[] = "/tmp/ddp_test_XXXXXX";
  const fs::path dir = mkdtemp(tmpl);

  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv_s = {worker, scenario, std::to_string(r), std::to_string(world),
                                       std::to_string(store.port())};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string out = (dir / ("out" + std::to_string(r))).string();
    const std::string err = (dir / ("err" + std::to_string(r))).string();
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(posix_spawn(&pids[r], worker, &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
  }

  std::vector<RankResult> results(world);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGKILL);
      }
      for (pid_t p : pids) {
        if (p > 0) waitpid(p, nullptr, 0);
      }
      FAIL("scenario " << scenario << " on " << world << " ranks timed out after "
                       << timeout.count() << " s");
    }
    std::this_thread::sleep_for(20ms);
  }
  for (int r = 0; r < world; ++r) {
    results[r].out = read_file(dir / ("out" + std::to_string(r)));
    results[r].err = read_file(dir / ("err" + std::to_string(r)));
  }
  fs::remove_all(dir);
  return results;
}

// Every rank must have passed its checks.
void require_success(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    MESSAGE("rank " << r << ": " << results[r].out);
    CHECK_MESSAGE(results[r].exit_code == 0,
                  "rank " << r << " exited " << results[r].exit_code << ": " << results[r].err);
  }
}

}  // namespace

TEST_CASE("DDP on W ranks equals one process on a W times larger batch") {
  SUBCASE("mlp, 2 ranks") {
    require_success(run_job("equivalence", 2, {"mlp", "0"}));
  }
  SUBCASE("mlp, 3 ranks") {
    require_success(run_job("equivalence", 3, {"mlp", "0"}));
  }
  SUBCASE("conv, 2 ranks") {
    require_success(run_job("equivalence", 2, {"conv", "0"}));
  }
  SUBCASE("mlp, 3 ranks, gradient_as_bucket_view") {
    require_success(run_job("equivalence", 3, {"mlp", "1"}));
  }
}

TEST_CASE("DDP overlaps: bucket 0 is launched before the last gradient is ready") {
  require_success(run_job("overlap", 2));
}

TEST_CASE("DDP names unused parameters and suggests find_unused_parameters") {
  require_success(run_job("unused_error", 2));
}

TEST_CASE("DDP with find_unused_parameters trains like one process") {
  require_success(run_job("unused_flag", 2));
  require_success(run_job("unused_flag", 3));
}

TEST_CASE("DDP no_sync: 3 local micro-batches + 1 synced equal one 4x batch") {
  require_success(run_job("no_sync", 2));
  require_success(run_job("no_sync", 2, {"1"}));  // gradient_as_bucket_view
}

TEST_CASE("DDP construction lists the parameters whose shapes differ across ranks") {
  require_success(run_job("mismatch", 3));
}

TEST_CASE("DDP broadcast_buffers makes BatchNorm running stats rank 0's") {
  require_success(run_job("buffers", 2, {"1"}));
  require_success(run_job("buffers", 2, {"0"}));  // control: without it they drift apart
}

TEST_CASE("naive_allreduce_grads gives the Reducer's gradients") {
  require_success(run_job("naive", 2));
  require_success(run_job("naive", 3));
}

TEST_CASE("DDP rebuilds its buckets in gradient arrival order after the first iteration") {
  require_success(run_job("rebuild", 2, {"0"}));
  require_success(run_job("rebuild", 2, {"1"}));  // gradient_as_bucket_view: .grad views move
}

TEST_CASE("DDP removes its hooks: wrapping a model again leaves one set") {
  require_success(run_job("rewrap", 2));
}

TEST_CASE("DDP: a training forward without backward does not poison the next iteration") {
  require_success(run_job("forward_only", 2));
}

TEST_CASE("DDP comm hook: a custom hook is called once per bucket per step") {
  require_success(run_job("hook_calls", 2));
}

TEST_CASE("DDP comm hook: fp16 and bf16 compression give gradients close to plain averaging") {
  require_success(run_job("compress", 2, {"fp16"}));
  require_success(run_job("compress", 2, {"bf16"}));
}

TEST_CASE("DDP comm hook: PowerSGD equals a hand computation, with error feedback") {
  require_success(run_job("powersgd_hand", 1));
  require_success(run_job("powersgd_hand", 2));
}

TEST_CASE("DDP comm hook: PowerSGD rank 2 all-reduces far fewer bytes on resnet20") {
  require_success(run_job("powersgd_bytes", 2));
}

TEST_CASE("DDP Join: uneven inputs finish, every step equals one process") {
  require_success(run_job("join", 2, {"0"}, 40s));
  require_success(run_job("join", 3, {"0"}, 40s));
  require_success(run_job("join", 2, {"0", "bn"}, 40s));  // SyncBatchNorm
  require_success(run_job("join", 3, {"0", "bn"}, 40s));
}

TEST_CASE("DDP Join with a GradScaler: the joined ranks share every skip and the scale") {
  require_success(run_job("join_scaler", 2, {}, 40s));
  require_success(run_job("join_scaler", 3, {}, 40s));
}

TEST_CASE("DDP Join: throw_on_early_termination raises on every rank") {
  require_success(run_job("join", 2, {"1"}, 40s));
  require_success(run_job("join", 3, {"1"}, 40s));
}
