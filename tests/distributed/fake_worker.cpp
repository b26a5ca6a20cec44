// A worker program for the ddprun tests; the first argument picks its behaviour:
//   env DIR              write the launcher's env vars and our argv to DIR/env.RANK, exit 0
//   fail-first R DIR     log the attempt to DIR/attempts; rank R exits 1 on restart 0, the others
//                        sleep (they must be stopped); every rank exits 0 on later restarts
//   sleep DIR            fork a child, write both pids to DIR/pids.RANK, sleep forever
//   meet DIR             meet all WORLD_SIZE ranks through a TCPStore at MASTER_ADDR:MASTER_PORT
//                        (rank 0 hosts it), write DIR/meet.RANK
//   hang-first R DIR     join init_process_group (Gloo) and all-reduce 3 times; on restart 0
//                        rank R stops itself (SIGSTOP) before the second, so the others time
//                        out; on later restarts every rank finishes and writes DIR/done.RANK
//   guard DIR            rank 0 hosts the workers' TCPStore on MASTER_PORT (token from ddprun),
//                        writes "PORT TOKEN" to DIR/guard, waits (10 s at most) for DIR/go, and
//                        exits 0 unless someone set the key "intruder"
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "comm/init_process_group.h"
#include "comm/store/store.h"
#include "tensor/ops.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int rank() {
  return std::atoi(env("RANK").c_str());
}

int write_env(const std::string& dir, int argc, char** argv) {
  std::ofstream f(dir + "/env." + env("RANK"));
  for (const char* k :
       {"LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
        "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "DDPLAB_RESTART_COUNT",
        "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    f << k << "=" << env(k) << "\n";
  f << "ARGV=";
  for (int i = 3; i < argc; ++i) f << argv[i] << (i + 1 < argc ? " " : "");
  f << "\n";
  std::cout << "hello from rank " << rank() << std::endl;
  return 0;
}

int fail_first(int fail_rank, const std::string& dir) {
  int restart = std::atoi(env("TORCHELASTIC_RESTART_COUNT").c_str());
  {
    std::ofstream f(dir + "/attempts", std::ios::app);
    f << "rank " << rank() << " restart " << restart << "\n";
  }
  if (restart > 0) return 0;
  if (rank() == fail_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

int sleep_forever(const std::string& dir) {
  pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  {
    std::ofstream f(dir + "/pids." + env("RANK") + ".tmp");
    f << getpid() << " " << child << "\n";
  }
  // Rename so the test never reads a half-written file.
  std::rename((dir + "/pids." + env("RANK") + ".tmp").c_str(),
              (dir + "/pids." + env("RANK")).c_str());
  for (;;) pause();
}

int meet(const std::string& dir) {
  using namespace ddplab::distributed;
  int world = std::atoi(env("WORLD_SIZE").c_str());
  TCPStore store(env("MASTER_ADDR"), std::atoi(env("MASTER_PORT").c_str()), rank() == 0,
                 std::chrono::seconds(20));
  int64_t arrived_at = store.add("arrived", 1);
  store.set("rank" + env("RANK"), env("RANK"));
  std::vector<std::string> all;
  for (int r = 0; r < world; ++r) all.push_back("rank" + std::to_string(r));
  store.wait(all);
  int64_t arrived = store.add("arrived", 0);
  {
    std::ofstream f(dir + "/meet." + env("RANK"));
    f << "WORLD_SIZE=" << world << " arrived=" << arrived << " order=" << arrived_at << "\n";
  }
  store.set("done" + env("RANK"), std::string("1"));
  // Rank 0 hosts the store: it may leave only after everyone is done with it.
  if (rank() == 0) {
    std::vector<std::string> done;
    for (int r = 0; r < world; ++r) done.push_back("done" + std::to_string(r));
    store.wait(done);
  }
  return 0;
}

int hang_first(int hang_rank, const std::string& dir) {
  using namespace ddplab;
  auto pg = distributed::init_process_group();
  const bool first_round = std::atoi(env("DDPLAB_RESTART_COUNT").c_str()) == 0;
  Tensor t = ops::ones({16});
  for (int i = 0; i < 3; ++i) {
    if (i == 1 && first_round && pg->rank() == hang_rank) ::raise(SIGSTOP);
    pg->all_reduce(t)->wait();
  }
  std::ofstream(dir + "/done." + env("RANK")) << t.to_vector<float>()[0] << "\n";
  // Rank 0's group hosts the store: nobody leaves before every rank is done with it.
  pg->barrier()->wait();
  return 0;
}

int guard(const std::string& dir) {
  using namespace std::chrono_literals;
  ddplab::distributed::TCPStore store(env("MASTER_ADDR"), std::atoi(env("MASTER_PORT").c_str()),
                                      /*is_server=*/true, 10s);
  {
    std::ofstream tmp(dir + "/guard.tmp");
    tmp << store.port() << " " << env("DDPLAB_STORE_TOKEN") << "\n";
  }
  std::rename((dir + "/guard.tmp").c_str(), (dir + "/guard").c_str());
  for (int i = 0; i < 100 && !std::ifstream(dir + "/go"); ++i) std::this_thread::sleep_for(100ms);
  return store.check({"intruder"}) ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "env" && argc > 2) return write_env(argv[2], argc, argv);
    if (mode == "fail-first" && argc > 3) return fail_first(std::atoi(argv[2]), argv[3]);
    if (mode == "sleep" && argc > 2) return sleep_forever(argv[2]);
    if (mode == "meet" && argc > 2) return meet(argv[2]);
    if (mode == "hang-first" && argc > 3) return hang_first(std::atoi(argv[2]), argv[3]);
    if (mode == "guard" && argc > 2) return guard(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "fake_worker: " << e.what() << std::endl;
    return 2;
  }
  std::cerr << "fake_worker: bad arguments" << std::endl;
  return 2;
}
