// Hangs and launch environments: a stopped rank makes the others' collectives time out
// with a message naming the collective, its seq and the missing rank; the flight recorder's
// ring buffer and its dumps, merged by tools/flight_merge.py (path in env FLIGHT_MERGE), point at
// the rank that is behind; init_process_group's rendezvous reports whom it waits for and rejects
// ranks started with another world size; the collective timeout's precedence; the launch
// environments of Open MPI, PMI and Slurm; and, where mpirun exists, a real `mpirun -np 2`.
//
// The multi-rank cases fork one process per rank (tests/distributed/fork_ranks.h).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/init_process_group.h"
#include "comm/process_group_gloo.h"
#include "fork_ranks.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/skip.h"

using namespace ddplab;
using namespace ddplab::distributed;
using namespace ddplab::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// The output (stdout and stderr) of a shell command, and its exit code.
std::string run_command(const std::string& cmd, int& code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A fresh folder for the forked ranks' flight-recorder dumps (DDPLAB_FLIGHT_RECORDER_DIR, which
// they inherit) and the command that merges them (tools/flight_merge.py, path in FLIGHT_MERGE).
struct DumpFolder {
  TempDir dir;
  EnvGuard guard{{"DDPLAB_FLIGHT_RECORDER_DIR"}};
  std::string merge_cmd;
  DumpFolder() {
    const char* merge = std::getenv("FLIGHT_MERGE");
    REQUIRE_MESSAGE(merge != nullptr, "FLIGHT_MERGE is not set; run through meson test");
    setenv("DDPLAB_FLIGHT_RECORDER_DIR", dir.path.c_str(), 1);
    merge_cmd = std::string("python3 ") + merge + " " + dir.path.string();
  }
};

}  // namespace

TEST_CASE("flight recorder: a ring of the last N collectives with their states") {
  FlightRecorder rec(/*rank=*/1, /*size=*/2, "gloo", "unit", /*capacity=*/3);
  for (uint64_t seq = 0; seq < 5; ++seq) rec.issued(seq, "all_reduce", "float32", "[4]");
  rec.started(3, "all_reduce");
  rec.finished(3);
  rec.started(4, "all_reduce");
  rec.finished(4, "timed out");
  rec.finished(0);  // evicted long ago: ignored
  const auto e = rec.entries();
  REQUIRE(e.size() == 3);  // seqs 0 and 1 were overwritten
  CHECK(e[0].seq == 2);
  CHECK(e[0].state == FlightRecorder::State::Issued);
  CHECK(e[1].state == FlightRecorder::State::Completed);
  CHECK(e[2].state == FlightRecorder::State::Failed);
  CHECK(e[2].error == "timed out");
  CHECK(e[2].started_us >= e[2].issued_us);
  CHECK(e[2].finished_us >= e[2].started_us);
  // A collective a backend started without issuing it through ProcessGroup still appears.
  rec.started(5, "ring_allreduce");
  CHECK(rec.entries().back().op == "ring_allreduce");

  TempDir dir;
  EnvGuard guard({"DDPLAB_FLIGHT_RECORDER_DIR"});
  setenv("DDPLAB_FLIGHT_RECORDER_DIR", dir.path.c_str(), 1);
  const std::string path = rec.dump("a \"quoted\" reason\nwith a newline", {{0, 7}});
  CHECK(path == (dir.path / "flight_unit_rank1.jsonl").string());
  const std::string text = read_file(path);
  CHECK(contains(text, "\"peers\": {\"0\": 7}"));
  CHECK(contains(text, "a \\\"quoted\\\" reason\\u000awith"));
  CHECK(contains(text, "\"state\": \"failed\""));
  CHECK(FlightRecorder(0, 1, "gloo", "off", 0).dump("x").empty());  // capacity 0: off
}

TEST_CASE(
    "a stopped rank: the others time out naming collective, seq and rank; the merged "
    "flight-recorder dumps show it behind") {
  DumpFolder dumps;
  const TempDir& dir = dumps.dir;
  const std::string& merge_cmd = dumps.merge_cmd;
  run_ranks(3, [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store, 3s);
    Tensor x = ops::ones({1000});
    pg->broadcast(x, 1)->wait();  // seq 0
    pg->all_reduce(x)->wait();    // seq 1
    if (rank == 2) {
      store->set("pid2", std::to_string(::getpid()));
      ::raise(SIGSTOP);  // hangs here until rank 0 continues it: it never issues seq 2
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      pg->all_reduce(x)->wait();  // seq 2
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[hang test] rank %d: the stopped rank was detected after %.2f s (timeout 3 s)\n",
                rank, s);
    store_sync(*store, "dumped", rank, 2);  // both dumps are written
    int code = 0;
    const std::string table = rank == 0 ? run_command(merge_cmd, code) : "";
    // Continue rank 2 before any check can fail, or the test would wait for it until killed.
    if (rank == 0) ::kill(std::stoi(store->get_string("pid2")), SIGCONT);
    EXPECT(contains(msg, "all_reduce (seq 2) failed on rank " + std::to_string(rank)), msg);
    EXPECT(contains(msg, "rank 2 did not join all_reduce seq 2"), msg);
    EXPECT(!contains(msg, "rank " + std::to_string(1 - rank) + " did not join"), msg);
    EXPECT(contains(msg, "Flight recorder dump: " + dir.path.string()), msg);
    EXPECT(s >= 2.9 && s < 8, "detected after " << s << " s");
    if (rank == 0) {
      std::printf("%s", table.c_str());
      EXPECT(code == 0, table);
      EXPECT(contains(table, "rank 2 left no dump; the other ranks' dumps show it reached seq 1"),
             table);
      EXPECT(contains(table, "First disagreement at seq 2 (all_reduce): rank 2 behind."), table);
      EXPECT(contains(table, "broadcast completed"), table);
    }
  });
}

TEST_CASE(
    "a rank that stops taking part but is not stopped dumps its flight recorder when another "
    "rank's collective times out") {
  DumpFolder dumps;
  const TempDir& dir = dumps.dir;
  const std::string& merge_cmd = dumps.merge_cmd;
  auto dump_of = [&](int rank) {
    return dir.path / ("flight_test_rank" + std::to_string(rank) + ".jsonl");
  };
  run_ranks(3, [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store, 3s);
    Tensor x = ops::ones({1000});
    pg->broadcast(x, 1)->wait();  // seq 0
    pg->all_reduce(x)->wait();    // seq 1
    if (rank == 2) {
      // Busy elsewhere (as if stuck loading data): never issues seq 2, never times out itself.
      // Only the others' request can make it dump.
      const auto t0 = std::chrono::steady_clock::now();
      while (!fs::exists(dump_of(2)) && std::chrono::steady_clock::now() - t0 < 12s)
        std::this_thread::sleep_for(100ms);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[dump request] rank 2 dumped %.2f s after it stopped taking part\n", s);
      EXPECT(fs::exists(dump_of(2)), "rank 2 never dumped its flight recorder");
      const std::string text = read_file(dump_of(2));
      EXPECT(contains(text, "\"reason\": \"dump requested by rank "), text);
      EXPECT(contains(text, "all_reduce seq 2"), text);
      store_sync(*store, "dumped", rank, w);
      return;
    }
    try {
      pg->all_reduce(x)->wait();  // seq 2: rank 2 never joins
    } catch (const Error&) {
    }
    store_sync(*store, "dumped", rank, w);  // all three dumps are written
    if (rank == 0) {
      int code = 0;
      const std::string table = run_command(merge_cmd, code);
      std::printf("%s", table.c_str());
      EXPECT(code == 0, table);
      EXPECT(contains(table, "3 of 3 ranks dumped"), table);
      EXPECT(contains(table, "First disagreement at seq 2 (all_reduce): rank 2 behind."), table);
    }
  });
}

TEST_CASE("init_process_group: rank 0 says whom it is waiting for") {
  const int port = net::pick_free_port("127.0.0.1");
  TempDir dir;
  run_ranks(2, [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    set_torchrun_env(rank, w, port);
    const std::string log = (dir.path / "stderr0").string();
    if (rank == 0) std::freopen(log.c_str(), "w", stderr);
    if (rank == 1) std::this_thread::sleep_for(2500ms);  // late: rank 0 reports twice
    InitOptions o;
    o.timeout = 20s;
    o.wait_report_interval = 1s;
    auto pg = init_process_group(o);
    pg->barrier()->wait();
    if (rank == 0) {
      std::fflush(stderr);
      const std::string text = read_file(log);
      const std::string expect =
          "init_process_group: waiting for rank 1 at 127.0.0.1:" + std::to_string(port) + ", ";
      EXPECT(contains(text, expect + "1 s of 20") && contains(text, expect + "2 s of 20"), text);
    }
    store_sync(*store, "init_done", rank, w);
  });
}

TEST_CASE("init_process_group: ranks started with different world sizes are told both sizes") {
  const int port = net::pick_free_port("127.0.0.1");
  run_ranks(2, [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    set_torchrun_env(rank, rank == 0 ? 2 : 3, port);  // rank 1 thinks the job has 3 ranks
    std::string msg;
    try {
      InitOptions o;
      o.timeout = 20s;
      init_process_group(o);
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT(contains(msg, "rank 1 was started with WORLD_SIZE 3 but rank 0 with WORLD_SIZE 2"), msg);
    store_sync(*store, "mismatch_done", rank, w);
  });
}

TEST_CASE("collective timeout: InitOptions > DDPLAB_COLLECTIVE_TIMEOUT > 30 min") {
  EnvGuard guard(kLaunchVars);
  CHECK(collective_timeout_from_environment() == kDefaultCollectiveTimeout);
  setenv("DDPLAB_COLLECTIVE_TIMEOUT", "30", 1);
  CHECK(collective_timeout_from_environment() == 30s);
  setenv("DDPLAB_COLLECTIVE_TIMEOUT", "0.25", 1);
  CHECK(collective_timeout_from_environment() == 250ms);
  setenv("DDPLAB_COLLECTIVE_TIMEOUT", "-1", 1);
  CHECK_THROWS_WITH_AS(collective_timeout_from_environment(),
                       doctest::Contains("DDPLAB_COLLECTIVE_TIMEOUT='-1'"), Error);
  // A lone process (no launcher) gets a group of 1: the env value, or the explicit one.
  setenv("DDPLAB_COLLECTIVE_TIMEOUT", "7", 1);
  CHECK(init_process_group()->timeout() == 7s);
  InitOptions o;
  o.timeout = 9s;
  CHECK(init_process_group(o)->timeout() == 9s);
}

TEST_CASE("launch_env_from_environment: Open MPI, PMI, and which launcher wins") {
  EnvGuard guard(kLaunchVars);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  LaunchEnv m = launch_env_from_environment();
  CHECK(m.launcher == "mpi");
  CHECK(m.rank == 1);
  CHECK(m.world_size == 2);
  CHECK(m.local_rank == 1);
  CHECK(m.local_world_size == 2);
  CHECK(m.master_addr == "127.0.0.1");  // every process on this machine
  // Spread over machines and no rendezvous address: say what to set.
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  CHECK_THROWS_WITH_AS(launch_env_from_environment(),
                       doctest::Contains("4 processes (2 on this machine) but no rendezvous "
                                         "address: set MASTER_ADDR"),
                       Error);
  setenv("MASTER_ADDR", "node07", 1);
  setenv("MASTER_PORT", "29600", 1);
  m = launch_env_from_environment();
  CHECK(m.master_addr == "node07");
  CHECK(m.master_port == 29600);
  CHECK(m.local_world_size == 2);
  // mpirun inside a Slurm allocation: every process inherits SLURM_PROCID=0; MPI's numbering wins.
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  CHECK(launch_env_from_environment().rank == 1);
  // torchrun's variables win over everything.
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  CHECK(launch_env_from_environment().launcher == "torchrun");
  CHECK(launch_env_from_environment().rank == 3);
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "MASTER_ADDR"})
    unsetenv(v);

  // MPICH / Intel MPI (Hydra): PMI_*; without the local size the machines are unknown.
  setenv("PMI_RANK", "2", 1);
  setenv("PMI_SIZE", "3", 1);
  CHECK_THROWS_WITH_AS(launch_env_from_environment(),
                       doctest::Contains("MPI_LOCALNRANKS unset, so possibly on several machines"),
                       Error);
  setenv("MPI_LOCALNRANKS", "3", 1);
  setenv("MPI_LOCALRANKID", "2", 1);
  LaunchEnv p = launch_env_from_environment();
  CHECK(p.launcher == "pmi");
  CHECK(p.rank == 2);
  CHECK(p.world_size == 3);
  CHECK(p.local_rank == 2);
  CHECK(p.master_addr == "127.0.0.1");
}

TEST_CASE("Slurm: two tasks with srun's environment form one group and all-reduce") {
  const int port = net::pick_free_port("127.0.0.1");
  run_ranks(2, [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    for (const auto& v : kLaunchVars) unsetenv(v.c_str());
    // What `srun --ntasks 2` on one node gives each task (plus the rendezvous port).
    setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_NNODES", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    const LaunchEnv env = launch_env_from_environment();
    EXPECT(env.launcher == "slurm" && env.local_world_size == 2, env.launcher);
    InitOptions o;
    o.timeout = 20s;
    auto pg = init_process_group(o);
    EXPECT(pg->rank() == rank && pg->size() == 2, "identity");
    Tensor t = ops::full({5}, rank + 1);
    pg->all_reduce(t)->wait();
    for (double v : t.to_vector<double>()) EXPECT(v == 3, "sum " << v);
    store_sync(*store, "slurm_done", rank, w);
  });
}

TEST_CASE("mpirun -np 2 forms one group of 2") {
  const char* worker = std::getenv("MPI_WORKER");
  REQUIRE_MESSAGE(worker != nullptr, "MPI_WORKER is not set; run through meson test");
  int code = 0;
  const std::string where = run_command("command -v mpirun", code);
  DDP_SKIP_IF(code != 0, "mpirun not found (apt-get install openmpi-bin)");
  TempDir dir;
  const std::string cmd = "MASTER_PORT=" + std::to_string(net::pick_free_port("127.0.0.1")) +
                          " timeout 50 mpirun --allow-run-as-root --oversubscribe -np 2 " + worker +
                          " " + dir.path.string();
  const std::string out = run_command(cmd, code);
  MESSAGE(out);
  REQUIRE_MESSAGE(code == 0, out);
  for (int r = 0; r < 2; ++r)
    CHECK(read_file(dir.path / ("mpi." + std::to_string(r))) ==
          "rank " + std::to_string(r) + " of 2 (mpi): sum 3\n");
}
