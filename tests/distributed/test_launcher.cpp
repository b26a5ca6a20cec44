// End-to-end tests of the ddprun binary (path in env DDPRUN) with fake_worker (env FAKE_WORKER):
// the worker environment, group restarts, the failure summary, signal forwarding without orphans,
// and two launchers forming one 4-rank job.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store_socket.h"
#include "fork_ranks.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ddplab::testing::read_file;
using ddplab::testing::TempDir;

namespace {

std::string need_env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set; run through meson test");
  return v;
}

// A running ddprun whose stdout+stderr go to a file.
struct Launch {
  pid_t pid = -1;
  fs::path out;

  Launch(const std::vector<std::string>& args, const fs::path& out_file) : out(out_file) {
    std::vector<std::string> all = {need_env("DDPRUN")};
    all.insert(all.end(), args.begin(), args.end());
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      FILE* f = std::fopen(out.c_str(), "w");
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }

  // Exit code (128 + signal when killed); kills ddprun and fails the test past `timeout`.
  int wait(std::chrono::seconds timeout = 25s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL("ddprun did not finish in time; output:\n" << output());
      }
      std::this_thread::sleep_for(20ms);
    }
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  std::string output() const { return read_file(out); }
};

std::map<std::string, std::string> parse_env(const fs::path& p) {
  std::map<std::string, std::string> m;
  std::istringstream in(read_file(p));
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

// Alive and not a zombie waiting for someone to reap it.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

}  // namespace

TEST_CASE("ddprun: two workers get torchrun's environment; output is prefixed and logged") {
  TempDir dir;
  fs::path logs = dir.path / "logs";
  Launch run(
      {"--standalone", "--nproc-per-node", "2", "--run-id", "job7", "--log-dir", logs.string(),
       need_env("FAKE_WORKER"), "env", dir.path.string(), "--lr", "0.1", "-x"},
      dir.path / "out");
  REQUIRE(run.wait() == 0);
  std::string out = run.output();
  CHECK(out.find("[rank0]: hello from rank 0") != std::string::npos);
  CHECK(out.find("[rank1]: hello from rank 1") != std::string::npos);
  CHECK(read_file(logs / "rank1.log").find("hello from rank 1") != std::string::npos);

  auto e0 = parse_env(dir.path / "env.0"), e1 = parse_env(dir.path / "env.1");
  for (auto* e : {&e0, &e1}) {
    CHECK((*e)["WORLD_SIZE"] == "2");
    CHECK((*e)["LOCAL_WORLD_SIZE"] == "2");
    CHECK((*e)["GROUP_RANK"] == "0");
    CHECK((*e)["GROUP_WORLD_SIZE"] == "1");
    CHECK((*e)["MASTER_ADDR"] == "127.0.0.1");
    CHECK((*e)["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK((*e)["DDPLAB_RESTART_COUNT"] == "0");
    CHECK((*e)["TORCHELASTIC_MAX_RESTARTS"] == "0");
    CHECK((*e)["TORCHELASTIC_RUN_ID"] == "job7");
    CHECK((*e)["ARGV"] == "--lr 0.1 -x");  // flags after the program reach the program
    CHECK(std::atoi((*e)["OMP_NUM_THREADS"].c_str()) >= 1);
  }
  CHECK(e0["RANK"] == "0");
  CHECK(e0["LOCAL_RANK"] == "0");
  CHECK(e1["RANK"] == "1");
  CHECK(e1["ROLE_RANK"] == "1");
  CHECK(e1["LOCAL_RANK"] == "1");
  CHECK(e0["MASTER_PORT"] == e1["MASTER_PORT"]);
  CHECK(std::atoi(e0["MASTER_PORT"].c_str()) > 0);
}

// Sets (or, with nullptr, removes) one variable of this process's environment, which the
// launched ddprun inherits, and puts the old value back at the end of the scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) old = v;
    value ? setenv(n, value, 1) : unsetenv(n);
  }
  ~ScopedEnv() { old ? setenv(name.c_str(), old->c_str(), 1) : unsetenv(name.c_str()); }
};

std::map<std::string, std::string> worker_env_under_ddprun(const TempDir& dir) {
  Launch run(
      {"--standalone", "--nproc-per-node", "1", need_env("FAKE_WORKER"), "env", dir.path.string()},
      dir.path / "out");
  REQUIRE(run.wait() == 0);
  return parse_env(dir.path / "env.0");
}

TEST_CASE("ddprun: workers spin briefly for OpenMP work unless the user chose a wait policy") {
  TempDir dir;
  {
    ScopedEnv policy("OMP_WAIT_POLICY", nullptr), spins("GOMP_SPINCOUNT", nullptr);
    auto e = worker_env_under_ddprun(dir);
    CHECK(e["GOMP_SPINCOUNT"] == "1000");
    CHECK(e["OMP_WAIT_POLICY"] == "");
  }
  {  // the user's choice wins, either variable
    ScopedEnv policy("OMP_WAIT_POLICY", "passive"), spins("GOMP_SPINCOUNT", nullptr);
    auto e = worker_env_under_ddprun(dir);
    CHECK(e["OMP_WAIT_POLICY"] == "passive");
    CHECK(e["GOMP_SPINCOUNT"] == "");
  }
  {
    ScopedEnv policy("OMP_WAIT_POLICY", nullptr), spins("GOMP_SPINCOUNT", "5000");
    CHECK(worker_env_under_ddprun(dir)["GOMP_SPINCOUNT"] == "5000");
  }
}

TEST_CASE("ddprun: a failed worker restarts the whole group when restarts remain") {
  TempDir dir;
  Launch run({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
              need_env("FAKE_WORKER"), "fail-first", "1", dir.path.string()},
             dir.path / "out");
  REQUIRE_MESSAGE(run.wait() == 0, run.output());
  std::string attempts = read_file(dir.path / "attempts");
  for (const char* line :
       {"rank 0 restart 0", "rank 1 restart 0", "rank 0 restart 1", "rank 1 restart 1"})
    CHECK_MESSAGE(attempts.find(line) != std::string::npos, line);
  CHECK(run.output().find("restarting all workers (restart 1/1)") != std::string::npos);
}

TEST_CASE("ddprun: a hung (stopped) rank is named, killed, and the group restarts") {
  TempDir dir;
  // The workers' collectives give up after 3 s (read by init_process_group).
  setenv("DDPLAB_COLLECTIVE_TIMEOUT", "3", 1);
  const auto t0 = std::chrono::steady_clock::now();
  Launch run({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
              need_env("FAKE_WORKER"), "hang-first", "1", dir.path.string()},
             dir.path / "out");
  const int code = run.wait(40s);
  unsetenv("DDPLAB_COLLECTIVE_TIMEOUT");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = run.output();
  MESSAGE("hung-rank job with one restart took " << s << " s; output:\n" << out);
  REQUIRE_MESSAGE(code == 0, out);
  // The summary blames rank 1, which stopped, not rank 0, which waited for it.
  CHECK_MESSAGE(out.find("ddprun: rank 1 (pid ") != std::string::npos, out);
  CHECK_MESSAGE(
      out.find("hung: rank 0 timed out in all_reduce seq 1 waiting for it") != std::string::npos,
      out);
  CHECK_MESSAGE(out.find("it is stopped (state T); ddprun killed it") != std::string::npos, out);
  CHECK_MESSAGE(out.find("rank 0 (pid ") != std::string::npos, out);
  CHECK_MESSAGE(out.find("restarting all workers (restart 1/1)") != std::string::npos, out);
  CHECK(fs::exists(dir.path / "done.0"));
  CHECK(fs::exists(dir.path / "done.1"));
  CHECK(s < 30);
}

TEST_CASE("ddprun: with --max-restarts 0 a failure ends the job with a summary") {
  TempDir dir;
  Launch run({"--standalone", "--nproc-per-node", "2", need_env("FAKE_WORKER"), "fail-first", "1",
              dir.path.string()},
             dir.path / "out");
  int code = run.wait();
  CHECK(code == 1);
  std::string out = run.output();
  CHECK_MESSAGE(out.find("ddprun: rank 1 (pid ") != std::string::npos, out);
  CHECK_MESSAGE(out.find("exited with code 1; restarts used 0/0") != std::string::npos, out);
}

TEST_CASE("ddprun: SIGTERM and SIGKILL to ddprun leave no worker behind") {
  // Orphaned grandchildren are re-parented to us, so we can reap them and tell dead from zombie.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  for (int sig : {SIGTERM, SIGKILL}) {
    CAPTURE(sig);
    TempDir dir;
    Launch run({"--standalone", "--nproc-per-node", "2", "--stop-grace", "2",
                need_env("FAKE_WORKER"), "sleep", dir.path.string()},
               dir.path / "out");
    auto deadline = std::chrono::steady_clock::now() + 15s;
    while (!(fs::exists(dir.path / "pids.0") && fs::exists(dir.path / "pids.1")) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    REQUIRE_MESSAGE(fs::exists(dir.path / "pids.1"), run.output());
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) {
      std::istringstream in(read_file(dir.path / ("pids." + std::to_string(r))));
      pid_t worker = 0, child = 0;
      in >> worker >> child;
      pids.push_back(worker);
      if (sig == SIGTERM) pids.push_back(child);  // a worker's own child: killed with its group
    }
    for (pid_t p : pids) REQUIRE(alive(p));
    kill(run.pid, sig);
    CHECK(run.wait() == 128 + sig);
    auto gone_by = std::chrono::steady_clock::now() + 5s;  // PDEATHSIG is asynchronous
    for (pid_t p : pids) {
      while (alive(p) && std::chrono::steady_clock::now() < gone_by) {
        while (waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        std::this_thread::sleep_for(10ms);
      }
      CHECK_MESSAGE(!alive(p), "pid " << p << " outlived ddprun");
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    // The SIGKILL case leaves the workers' children to us (the subreaper); end them.
    if (sig == SIGKILL)
      for (int r = 0; r < 2; ++r) {
        std::istringstream in(read_file(dir.path / ("pids." + std::to_string(r))));
        pid_t worker = 0, child = 0;
        in >> worker >> child;
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
      }
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("ddprun: two nodes on one host form one job of 4 ranks") {
  TempDir dir;
  ddplab::testing::EnvGuard guard({"DDPLAB_STORE_TOKEN"});
  setenv("DDPLAB_STORE_TOKEN", "shared-by-both-nodes", 1);  // a multi-node job needs one
  std::string port = std::to_string(ddplab::distributed::net::pick_free_port("127.0.0.1"));
  auto node = [&](int rank) {
    return std::vector<std::string>{
        "--nnodes",         "2",   "--node-rank",           std::to_string(rank),
        "--nproc-per-node", "2",   "--master-port",         port,
        "--run-id",         "two", need_env("FAKE_WORKER"), "meet",
        dir.path.string()};
  };
  Launch n0(node(0), dir.path / "out0");
  Launch n1(node(1), dir.path / "out1");
  int c1 = n1.wait(), c0 = n0.wait();
  REQUIRE_MESSAGE(c0 == 0, n0.output());
  REQUIRE_MESSAGE(c1 == 0, n1.output());
  std::set<std::string> orders;
  for (int r = 0; r < 4; ++r) {
    std::string m = read_file(dir.path / ("meet." + std::to_string(r)));
    CHECK_MESSAGE(m.find("WORLD_SIZE=4 arrived=4") != std::string::npos, m);
    orders.insert(m.substr(m.find("order=")));
  }
  CHECK(orders.size() == 4);  // every rank arrived once
}

TEST_CASE("ddprun: a failure on one node restarts, or ends, every node") {
  ddplab::testing::EnvGuard guard({"DDPLAB_STORE_TOKEN"});
  setenv("DDPLAB_STORE_TOKEN", "shared-by-both-nodes", 1);
  for (int restarts : {1, 0}) {
    CAPTURE(restarts);
    TempDir dir;
    std::string port = std::to_string(ddplab::distributed::net::pick_free_port("127.0.0.1"));
    auto node = [&](int rank) {
      // Rank 3 lives on node 1 and fails on the first attempt.
      return std::vector<std::string>{"--nnodes",
                                      "2",
                                      "--node-rank",
                                      std::to_string(rank),
                                      "--nproc-per-node",
                                      "2",
                                      "--master-port",
                                      port,
                                      "--max-restarts",
                                      std::to_string(restarts),
                                      need_env("FAKE_WORKER"),
                                      "fail-first",
                                      "3",
                                      dir.path.string()};
    };
    Launch n0(node(0), dir.path / "out0");
    Launch n1(node(1), dir.path / "out1");
    int c1 = n1.wait(), c0 = n0.wait();
    if (restarts == 1) {
      CHECK_MESSAGE(c0 == 0, n0.output());
      CHECK_MESSAGE(c1 == 0, n1.output());
      CHECK(read_file(dir.path / "attempts").find("rank 0 restart 1") != std::string::npos);
    } else {
      CHECK(c0 == 1);
      CHECK(c1 == 1);
      CHECK_MESSAGE(n0.output().find("rank 3 (pid ") != std::string::npos, n0.output());
      CHECK(n0.output().find("on node 1; restarts used 0/0") != std::string::npos);
    }
  }
}

TEST_CASE("ddprun: the job store and the workers' store refuse a client without the token") {
  TempDir dir;
  ddplab::testing::EnvGuard guard({"DDPLAB_STORE_TOKEN"});  // unset: ddprun draws the tokens
  const int port = ddplab::distributed::net::pick_free_port("127.0.0.1");
  Launch run(
      {"--master-port", std::to_string(port), need_env("FAKE_WORKER"), "guard", dir.path.string()},
      dir.path / "out");
  using ddplab::distributed::TCPStore;
  // The job store: a client without the token could otherwise write roundN/failed and end the job.
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", port, false, 10s, std::string()),
                       doctest::Contains("store token mismatch"), ddplab::Error);
  // The workers' store, and the token the worker got from ddprun.
  for (int i = 0; i < 100 && !fs::exists(dir.path / "guard"); ++i)
    std::this_thread::sleep_for(100ms);
  std::istringstream guard_file(read_file(dir.path / "guard"));
  int worker_port = 0;
  std::string token;
  guard_file >> worker_port >> token;
  CHECK(token.size() == 32);
  CHECK(token.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", worker_port, false, 5s, std::string()),
                       doctest::Contains("store token mismatch"), ddplab::Error);
  CHECK_THROWS_AS(TCPStore("127.0.0.1", worker_port, false, 5s, std::string(32, '0')),
                  ddplab::Error);
  std::ofstream(dir.path / "go") << "\n";
  CHECK_MESSAGE(run.wait() == 0, run.output());  // nobody could set "intruder" or end the job
}

TEST_CASE("ddprun: a multi-node job without DDPLAB_STORE_TOKEN is refused on every node") {
  TempDir dir;
  ddplab::testing::EnvGuard guard({"DDPLAB_STORE_TOKEN"});
  for (int rank : {0, 1}) {
    Launch run({"--nnodes", "2", "--node-rank", std::to_string(rank), "--master-port", "29999",
                need_env("FAKE_WORKER"), "env", dir.path.string()},
               dir.path / ("out" + std::to_string(rank)));
    CHECK(run.wait() == 1);
    CHECK_MESSAGE(run.output().find("a job of 2 nodes needs a store token shared by every node") !=
                      std::string::npos,
                  run.output());
  }
  CHECK_FALSE(fs::exists(dir.path / "env.0"));  // no worker was started
}

TEST_CASE("ddprun: --nproc-per-node auto and gpu") {
  TempDir dir;
  Launch run({"--standalone", "--nproc-per-node", "auto", need_env("FAKE_WORKER"), "env",
              dir.path.string()},
             dir.path / "out");
  REQUIRE_MESSAGE(run.wait() == 0, run.output());
  CHECK(fs::exists(dir.path / "env.0"));  // at least one worker, CPU or GPU
  if (!fs::exists("/dev/nvidia0") && system("command -v nvidia-smi >/dev/null 2>&1") != 0) {
    Launch gpu({"--standalone", "--nproc-per-node", "gpu", "true"}, dir.path / "out2");
    CHECK(gpu.wait() == 1);
    CHECK(gpu.output().find("no CUDA GPU") != std::string::npos);
  }
}
