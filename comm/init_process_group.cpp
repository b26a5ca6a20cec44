// init_process_group and the launch environment: how a process learns its rank, finds the job's
// store, checks that every rank agrees on the world size, and picks a backend.
#include "comm/init_process_group.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group_gloo.h"
#include "comm/store/torch_tcp_store.h"
#include "tensor/error.h"

#if defined(DDP_CUDA)
#include "comm/process_group_nccl.h"
#endif

namespace ddplab::distributed {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The integer value of an environment variable; an error names the variable and its text.
int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  DDP_CHECK(errno == 0 && end != v && *end == '\0' && x >= 0 && x <= 1000000000,
            "environment variable " << name << "='" << v << "' is not a non-negative integer");
  return static_cast<int>(x);
}

// Slurm writes task counts as "4", "4(x2)" or "4(x2),3": the first node's count.
int slurm_leading_int(const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return end != v && x > 0 ? static_cast<int>(x) : 0;
}

// The variables through which an MPI launcher numbers its processes.
struct MpiVars {
  const char* launcher;
  const char *rank, *size, *local_rank, *local_size;
};
// Open MPI's mpirun/mpiexec (also under Slurm).
constexpr MpiVars kOpenMpi = {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
// The PMI interface of MPICH's and Intel MPI's launchers (Hydra), and of srun --mpi=pmi2.
constexpr MpiVars kPmi = {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

// Fills `e` when the launcher's rank and size are set; the local size stays 0 when unknown.
bool read_mpi_numbering(LaunchEnv& e, const MpiVars& v) {
  if (env(v.rank) == nullptr || env(v.size) == nullptr) return false;
  e.from_launcher = true;
  e.launcher = v.launcher;
  e.rank = env_int(v.rank, 0);
  e.world_size = env_int(v.size, 1);
  e.local_rank = env_int(v.local_rank, 0);
  e.local_world_size = env_int(v.local_size, 0);
  return true;
}

// Said by both sides of a world-size mismatch.
std::string world_size_mismatch(int rank, int its_world, int world0) {
  std::ostringstream os;
  os << "init_process_group: rank " << rank << " was started with WORLD_SIZE " << its_world
     << " but rank 0 with WORLD_SIZE " << world0 << "; start every rank with the same world size";
  return os.str();
}

// "1, 3"
std::string join(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

// Before the backend's own rendezvous, every rank publishes the world size it was started with
// and compares it with rank 0's. Without this, a rank launched with another WORLD_SIZE would
// surface as an assertion deep inside Gloo or NCCL, or as a silent hang. Rank 0 meanwhile
// reports who it is still waiting for, since a rank that never starts is the commonest hang of
// all (a typo in a hostname, a job still queued).
void check_world_size(Store& store, int rank, int world, std::chrono::milliseconds timeout,
                      std::chrono::milliseconds report_every, const std::string& where) {
  const std::string prefix = "default_pg/init/world_size/";
  store.set(prefix + std::to_string(rank), std::to_string(world));
  auto size_of = [&](int r) { return std::stoi(store.get_string(prefix + std::to_string(r))); };
  if (rank != 0) {
    store.wait({prefix + "0"}, timeout);
    const int w0 = size_of(0);
    store.set(prefix + "checked/" + std::to_string(rank), std::string("1"));
    DDP_CHECK(w0 == world, world_size_mismatch(rank, world, w0));
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_report = start + report_every;
  std::vector<int> waiting;
  for (int r = 1; r < world; ++r) waiting.push_back(r);
  while (!waiting.empty()) {
    std::vector<int> still;
    for (int r : waiting) {
      if (!store.check({prefix + std::to_string(r)})) {
        still.push_back(r);
        continue;
      }
      const int w = size_of(r);
      if (w != world) {
        // Rank 0 hosts the store: let rank r read our size first, so that it too fails with
        // this message rather than with a lost connection.
        try {
          store.wait({prefix + "checked/" + std::to_string(r)},
                     std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)));
        } catch (const std::exception&) {
        }
      }
      DDP_CHECK(w == world, world_size_mismatch(r, w, world));
    }
    waiting.swap(still);
    if (waiting.empty()) break;
    const auto now = Clock::now();
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start);
    DDP_CHECK(now - start < timeout,
              "init_process_group: rank 0 gave up after "
                  << waited.count() << " s waiting for rank" << (waiting.size() > 1 ? "s " : " ")
                  << join(waiting) << " of " << world << " at " << where
                  << "; were they started, with MASTER_ADDR:MASTER_PORT pointing here?");
    if (now >= next_report) {
      std::cerr << "init_process_group: waiting for rank" << (waiting.size() > 1 ? "s " : " ")
                << join(waiting) << " at " << where << ", " << waited.count() << " s of "
                << std::chrono::duration_cast<std::chrono::seconds>(timeout).count() << std::endl;
      next_report = now + report_every;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::chrono::milliseconds collective_timeout_from_environment() {
  const char* v = env("DDPLAB_COLLECTIVE_TIMEOUT");
  if (v == nullptr) return kDefaultCollectiveTimeout;
  errno = 0;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  DDP_CHECK(errno == 0 && end != v && *end == '\0' && std::isfinite(s) && s > 0 && s < 1e9,
            "environment variable DDPLAB_COLLECTIVE_TIMEOUT='"
                << v << "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000)));
}

LaunchEnv launch_env_from_environment() {
  LaunchEnv e;
  if (env("RANK") != nullptr && env("WORLD_SIZE") != nullptr) {
    // torchrun / ddprun. Without LOCAL_*, assume one node (rank == local rank).
    e.from_launcher = true;
    e.launcher = "torchrun";
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
    // PyTorch compares with "True" exactly (Python's str(True)); so do we.
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.use_agent_store = agent != nullptr && std::string(agent) == "True";
  } else if (read_mpi_numbering(e, kOpenMpi) || read_mpi_numbering(e, kPmi)) {
    // MPI launchers: we only borrow their numbering; the ranks still meet through our
    // TCPStore, not through MPI.
  } else if (env("SLURM_PROCID") != nullptr && env("SLURM_NTASKS") != nullptr) {
    // srun: one task per process. MASTER_ADDR must name the first node for multi-node jobs
    // (e.g. `export MASTER_ADDR=$(scontrol show hostnames | head -n1)`); see
    // docs/process_groups.md.
    e.from_launcher = true;
    e.launcher = "slurm";
    e.rank = env_int("SLURM_PROCID", 0);
    e.world_size = env_int("SLURM_NTASKS", 1);
    e.local_rank = env_int("SLURM_LOCALID", 0);
    int local = 0;
    if (const char* v = env("SLURM_NTASKS_PER_NODE")) local = slurm_leading_int(v);
    if (local == 0)
      if (const char* v = env("SLURM_TASKS_PER_NODE")) local = slurm_leading_int(v);
    if (local == 0) {
      int nodes = env_int("SLURM_NNODES", env_int("SLURM_JOB_NUM_NODES", 1));
      local = nodes > 0 ? (e.world_size + nodes - 1) / nodes : e.world_size;
    }
    e.local_world_size = local;
    e.restart_count = env_int("SLURM_RESTART_COUNT", 0);
  }
  if (const char* v = env("MASTER_ADDR")) {
    e.master_addr = v;
  } else if ((e.launcher == "mpi" || e.launcher == "pmi") && e.world_size > 1 &&
             e.local_world_size != e.world_size) {
    // MPI tells us who we are but not where to meet. 127.0.0.1 is right only when every process
    // is on this machine, which the launcher's local size shows.
    const char* local_var = e.launcher == "mpi" ? kOpenMpi.local_size : kPmi.local_size;
    DDP_FAIL("the " << (e.launcher == "mpi" ? "Open MPI" : "PMI") << " environment describes "
                    << e.world_size << " processes ("
                    << (e.local_world_size > 0
                            ? std::to_string(e.local_world_size) + " on this machine"
                            : std::string(local_var) + " unset, so possibly on several machines")
                    << ") but no rendezvous address: set MASTER_ADDR to the host of rank 0 and "
                       "MASTER_PORT to a free port there, and pass them to every process (Open "
                       "MPI: mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=29500 ...)");
  }
  if (e.local_world_size <= 0) e.local_world_size = e.world_size;
  e.master_port = env_int("MASTER_PORT", 29500);
  DDP_CHECK(e.world_size >= 1, "WORLD_SIZE must be at least 1, got " << e.world_size);
  DDP_CHECK(e.rank < e.world_size,
            "rank " << e.rank << " is not below the world size " << e.world_size);
  DDP_CHECK(e.master_port <= 65535, "MASTER_PORT " << e.master_port << " is not a TCP port");
  return e;
}

std::string agent_store_prefix(int restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count);
}

bool record_error_for_launcher(const std::string& message) {
  const char* path = env("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr) return false;
  // The shape torchrun reads (torch/distributed/elastic/multiprocessing/errors): it shows
  // extraInfo.py_callstack when present, else the message. We have no Python stack to offer.
  try {
    const nlohmann::json error = {
        {"message",
         {{"message", message},
          {"extraInfo",
           {{"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
    std::ofstream out(path, std::ios::trunc);
    // A message may quote a file name that is not UTF-8: replace such bytes, JSON must be text.
    out << error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    out.close();
    return !out.fail();
  } catch (const std::exception&) {
    return false;
  }
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  const LaunchEnv env = launch_env_from_environment();
  const int rank = options.rank >= 0 ? options.rank : env.rank;
  const int world = options.world_size > 0 ? options.world_size : env.world_size;
  DDP_CHECK(rank >= 0 && rank < world,
            "init_process_group: rank " << rank << " is outside a world of size " << world);
  DDP_CHECK(options.timeout.count() >= 0, "init_process_group: the timeout must be positive");
  // Explicit argument > DDPLAB_COLLECTIVE_TIMEOUT > the default, as PyTorch users expect.
  const std::chrono::milliseconds timeout =
      options.timeout.count() > 0 ? options.timeout : collective_timeout_from_environment();

  std::string backend = options.backend;
  if (backend == "auto") backend = options.device.is_cuda() ? "nccl" : "gloo";

  // Check the backend before touching the network, so a wrong choice fails at once.
  if (backend == "gloo") {
    DDP_CHECK(options.device.is_cpu(),
              "init_process_group: the gloo backend reduces CPU tensors, but the device is "
                  << options.device << "; use backend \"nccl\" (or \"auto\")");
  } else if (backend == "nccl") {
#if defined(DDP_CUDA)
    DDP_CHECK(options.device.is_cuda(),
              "init_process_group: the nccl backend reduces CUDA tensors, but the device is "
                  << options.device << "; use backend \"gloo\" (or \"auto\")");
#else
    DDP_FAIL("init_process_group: backend \"nccl\" (device "
             << options.device
             << ") needs ddplab built with CUDA (meson setup -Dcuda=enabled); this build has "
                "only \"gloo\"");
#endif
  } else {
    DDP_FAIL("init_process_group: unknown backend \"" << options.backend
                                                      << "\" (use \"gloo\", \"nccl\" or \"auto\")");
  }

  std::shared_ptr<Store> store = options.store;
  std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  if (!store) {
    if (env.use_agent_store) {
      // torchrun's agent holds MASTER_PORT already; hosting there would fail with "Address
      // already in use". Join its store, in a key space of this restart round.
      auto agent = std::make_shared<TorchTCPStore>(env.master_addr, env.master_port, timeout);
      store = std::make_shared<PrefixStore>(agent_store_prefix(env.restart_count), agent);
      where += " (torchrun's agent store)";
    } else if (world == 1 && !env.from_launcher) {
      // A lone process without a launcher: a private store on a free port, so two such
      // programs on one machine never collide on 29500.
      store = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, timeout);
    } else {
      // Rank 0 hosts the store on MASTER_PORT (ddprun gives every restart round a fresh one);
      // the others' constructor retries connecting until the timeout.
      store = std::make_shared<TCPStore>(env.master_addr, env.master_port, rank == 0, timeout);
    }
  }
  if (auto tcp = std::dynamic_pointer_cast<TCPStore>(store))
    where = tcp->host() + ":" + std::to_string(tcp->port());
  check_world_size(*store, rank, world, timeout, options.wait_report_interval, where);

  if (backend == "gloo") {
    GlooOptions g;
    g.timeout = timeout;
    g.group_name = "default_pg";
    g.interface = gloo_interface_from_environment(env.master_addr);
    return std::make_shared<ProcessGroupGloo>(store, rank, world, g);
  }
  if (backend == "nccl") {
#if defined(DDP_CUDA)
    NcclOptions n;
    n.timeout = timeout;
    n.group_name = "default_pg";
    n.device = options.device.index;
    return std::make_shared<ProcessGroupNCCL>(store, rank, world, n);
#endif
  }
  DDP_FAIL("init_process_group: unreachable backend " << backend);
}

}  // namespace ddplab::distributed
