// init_process_group and the launch environment: how a process learns its rank, finds the job's
// store, and picks a backend.
#include "distributed/init_process_group.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "distributed/process_group_gloo.h"
#include "tensor/error.h"

#if defined(DDPLAB_CUDA)
#include "distributed/process_group_nccl.h"
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

}  // namespace

LaunchEnv launch_env_from_environment() {
  LaunchEnv e;
  if (env("RANK") != nullptr && env("WORLD_SIZE") != nullptr) {
    // torchrun / ddprun. Without LOCAL_*, assume one node (rank == local rank).
    e.from_launcher = true;
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  } else if (env("SLURM_PROCID") != nullptr && env("SLURM_NTASKS") != nullptr) {
    // srun: one task per process. MASTER_ADDR must name the first node for multi-node jobs
    // (e.g. `export MASTER_ADDR=$(scontrol show hostnames | head -n1)`); see
    // docs/process_groups.md.
    e.from_launcher = true;
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
  if (const char* v = env("MASTER_ADDR")) e.master_addr = v;
  e.master_port = env_int("MASTER_PORT", 29500);
  DDP_CHECK(e.world_size >= 1, "WORLD_SIZE must be at least 1, got " << e.world_size);
  DDP_CHECK(e.rank < e.world_size,
            "rank " << e.rank << " is not below the world size " << e.world_size);
  DDP_CHECK(e.master_port <= 65535, "MASTER_PORT " << e.master_port << " is not a TCP port");
  return e;
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  const LaunchEnv env = launch_env_from_environment();
  const int rank = options.rank >= 0 ? options.rank : env.rank;
  const int world = options.world_size > 0 ? options.world_size : env.world_size;
  DDP_CHECK(rank >= 0 && rank < world,
            "init_process_group: rank " << rank << " is outside a world of size " << world);
  DDP_CHECK(options.timeout.count() > 0, "init_process_group: the timeout must be positive");

  std::string backend = options.backend;
  if (backend == "auto") backend = options.device.is_cuda() ? "nccl" : "gloo";

  // Check the backend before touching the network, so a wrong choice fails at once.
  if (backend == "gloo") {
    DDP_CHECK(options.device.is_cpu(),
              "init_process_group: the gloo backend reduces CPU tensors, but the device is "
                  << options.device << "; use backend \"nccl\" (or \"auto\")");
  } else if (backend == "nccl") {
#if defined(DDPLAB_CUDA)
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
  if (!store) {
    if (world == 1 && !env.from_launcher) {
      // A lone process without a launcher: a private store on a free port, so two such
      // programs on one machine never collide on 29500.
      store = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, options.timeout);
    } else {
      // Rank 0 hosts the store on MASTER_PORT (ddprun gives every restart round a fresh one);
      // the others' constructor retries connecting until the timeout.
      store =
          std::make_shared<TCPStore>(env.master_addr, env.master_port, rank == 0, options.timeout);
    }
  }

  if (backend == "gloo") {
    GlooOptions g;
    g.timeout = options.timeout;
    g.group_name = "default_pg";
    g.interface = gloo_interface_from_environment(env.master_addr);
    return std::make_shared<ProcessGroupGloo>(store, rank, world, g);
  }
  if (backend == "nccl") {
#if defined(DDPLAB_CUDA)
    NcclOptions n;
    n.timeout = options.timeout;
    n.group_name = "default_pg";
    n.device = options.device.index;
    return std::make_shared<ProcessGroupNCCL>(store, rank, world, n);
#endif
  }
  DDP_FAIL("init_process_group: unreachable backend " << backend);
}

}  // namespace ddplab::distributed
