// The ddprun agent loop (see launcher.h and docs/launcher.md).
//
// Keys in the job store, all under "ddprun/<run_id>/":
//   node<R>                    claimed by node R's agent once (catches two nodes with one rank)
//   nproc_per_node             the first node's value; every node must match it
//   round<N>/master_port       the fresh port node 0 picked for the workers' own store in round N
//   round<N>/joined, /ready    the round's barrier: counter of nodes, set when all have joined
//   round<N>/failed            "code;fatal;description" of the first failure (compare_set:
//                              the first one wins)
//   round<N>/succeeded         counter of nodes whose workers all exited 0
//   exited                     counter of agents done with the store; node 0 waits for it
//   worker_token               the workers' store token, drawn by node 0 (see Tokens below)
//
// Tokens (docs/store.md, "Security model"). Anyone who can reach a store without a token can
// write to it, and a write of roundN/failed ends the job. So:
//   - the job store requires DDPLAB_STORE_TOKEN from ddprun's environment. A multi-node job
//     must have it (the same secret on every node: only a secret known beforehand can let the
//     agents of other machines in); a single node without it draws a random one, as nobody else
//     needs to connect;
//   - the workers' store (hosted by rank 0 on each round's MASTER_PORT) always gets a fresh
//     random token, drawn by node 0, passed to the other agents through the job store and to
//     every worker as DDPLAB_STORE_TOKEN: even on one machine, a store on 127.0.0.1 is open to
//     every local user.
//
// Hangs. A rank that stops making progress (deadlocked, stuck in I/O, SIGSTOPped) does not exit:
// its peers' collectives time out and *they* exit, so the first failure names a rank that only
// waited. Two signs point at the real culprit when a worker fails:
//   - every worker gets DDPLAB_ERROR_FILE; a rank whose collective failed writes there which
//     ranks never joined it (comm/flight_recorder.h, write_hang_report);
//   - a local worker still alive in state 'T' (stopped) in /proc/<pid>/stat.
// The agent names those ranks first in the summary, SIGKILLs them at once (no grace: they will
// not answer SIGTERM), and restarts the group as for any failure.
#include "tools/launcher.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/store/store.h"
#include "tensor/error.h"
#include "tools/worker_group.h"

extern char** environ;

namespace ddplab::tools {

using distributed::TCPStore;
using Ms = std::chrono::milliseconds;

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

struct Failure {
  int code = 1;
  bool fatal = false;  // no restart: ddprun itself was interrupted, or the store was lost
  std::string what;
};

std::string encode(const Failure& f) {
  return std::to_string(f.code) + ";" + (f.fatal ? "1" : "0") + ";" + f.what;
}

Failure decode(const std::string& s) {
  Failure f;
  size_t a = s.find(';'), b = s.find(';', a + 1);
  if (a == std::string::npos || b == std::string::npos) return {1, true, "malformed failure " + s};
  f.code = std::atoi(s.substr(0, a).c_str());
  f.fatal = s.substr(a + 1, b - a - 1) == "1";
  f.what = s.substr(b + 1);
  return f;
}

Ms seconds(double s) {
  return Ms(static_cast<int64_t>(s * 1000));
}

// 128 random bits from the kernel, as 32 hex digits (printable, so it fits an env variable).
std::string random_token() {
  unsigned char bytes[16];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  DDP_CHECK(urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes),
            "ddprun: cannot read /dev/urandom to make a store token");
  std::string hex;
  for (unsigned char b : bytes) {
    const char* digits = "0123456789abcdef";
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

// The job store's token (see Tokens at the top).
std::string job_store_token(const LaunchConfig& cfg) {
  const char* v = std::getenv("DDPLAB_STORE_TOKEN");
  if (v != nullptr && *v != '\0') return v;
  DDP_CHECK(cfg.nnodes == 1, "ddprun: a job of "
                                 << cfg.nnodes
                                 << " nodes needs a store token shared by every node, or anyone "
                                    "who reaches "
                                 << cfg.master_addr << ":" << cfg.master_port
                                 << " could end it; set the same DDPLAB_STORE_TOKEN on every "
                                    "node, e.g. export DDPLAB_STORE_TOKEN=$(od -An -tx1 -N16 "
                                    "/dev/urandom | tr -d ' \\n')");
  return random_token();
}

class Agent {
 public:
  explicit Agent(const LaunchConfig& cfg)
      : cfg_(cfg), prefix_("ddprun/" + cfg.run_id + "/"), group_(cfg.argv, cfg.log_dir) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun_XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) report_dir_ = tmpl;
  }
  ~Agent() {
    std::error_code ignored;
    if (!report_dir_.empty()) std::filesystem::remove_all(report_dir_, ignored);
  }

  int run() {
    connect();
    for (int round = 0;; ++round) {
      Failure f;
      bool ok = false;
      try {
        int port = rendezvous(round);
        if (g_signal) return finish(interrupted(round).code);
        group_.start(worker_specs(round, port), round);
        ok = monitor(round, f);
      } catch (const Error& e) {
        // The job store went away (node 0 ended) or timed out: nothing left to coordinate with.
        group_.stop(SIGTERM, seconds(cfg_.stop_grace_s));
        std::cerr << "ddprun: node " << cfg_.node_rank << ": " << e.what() << std::endl;
        return 1;
      }
      if (ok) return finish(0);
      std::string used = std::to_string(round) + "/" + std::to_string(cfg_.max_restarts);
      if (f.fatal || round >= cfg_.max_restarts) {
        std::cerr << "ddprun: " << f.what << "; restarts used " << used << std::endl;
        return finish(f.code);
      }
      std::cerr << "ddprun: " << f.what << "; restarting all workers (restart " << round + 1 << "/"
                << cfg_.max_restarts << ")" << std::endl;
    }
  }

 private:
  std::string key(int round, const std::string& name) const {
    return prefix_ + "round" + std::to_string(round) + "/" + name;
  }

  void connect() {
    bool host = cfg_.node_rank == 0;
    store_ = std::make_unique<TCPStore>(cfg_.master_addr, cfg_.master_port, host,
                                        seconds(cfg_.rdzv_timeout_s), job_store_token(cfg_));
    std::string me = std::to_string(::getpid()) + "@" + std::to_string(cfg_.node_rank);
    std::string node_key = prefix_ + "node" + std::to_string(cfg_.node_rank);
    DDP_CHECK(string_cas(node_key, me) == me, "another ddprun already joined run '"
                                                  << cfg_.run_id << "' as --node-rank "
                                                  << cfg_.node_rank);
    std::string nproc = std::to_string(cfg_.nproc_per_node);
    std::string agreed = string_cas(prefix_ + "nproc_per_node", nproc);
    DDP_CHECK(agreed == nproc, "this node has --nproc-per-node " << nproc << " but another has "
                                                                 << agreed
                                                                 << "; all nodes must agree");
    if (host) store_->set(prefix_ + "worker_token", random_token());
    worker_token_ = store_->get_string(prefix_ + "worker_token");
  }

  std::string string_cas(const std::string& k, const std::string& desired) {
    auto v = store_->compare_set(k, {}, std::vector<uint8_t>(desired.begin(), desired.end()));
    return std::string(v.begin(), v.end());
  }

  // Polls for `k` so that a signal interrupts the wait; throws after the rendezvous timeout.
  void wait_key(const std::string& k, int round) {
    auto deadline = std::chrono::steady_clock::now() + seconds(cfg_.rdzv_timeout_s);
    while (!g_signal && !store_->check({k})) {
      DDP_CHECK(std::chrono::steady_clock::now() < deadline,
                "timed out after " << cfg_.rdzv_timeout_s << " s waiting for all " << cfg_.nnodes
                                   << " nodes to join round " << round << " at " << cfg_.master_addr
                                   << ":" << store_->port()
                                   << "; did every node start ddprun with the same --run-id?");
      std::this_thread::sleep_for(Ms(20));
    }
  }

  // All nodes meet at round N; node 0 picks the workers' MASTER_PORT for that round.
  int rendezvous(int round) {
    if (cfg_.node_rank == 0) {
      int port = distributed::net::pick_free_port(cfg_.master_addr);
      store_->set(key(round, "master_port"), std::to_string(port));
    }
    if (store_->add(key(round, "joined"), 1) == cfg_.nnodes)
      store_->set(key(round, "ready"), std::string("1"));
    wait_key(key(round, "ready"), round);
    if (g_signal) return 0;
    return std::stoi(store_->get_string(key(round, "master_port")));
  }

  std::vector<WorkerSpec> worker_specs(int round, int port) const {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      size_t eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    int n = cfg_.nproc_per_node, world = cfg_.nnodes * n;
    if (!env.count("OMP_NUM_THREADS") && n > 1) {
      unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      env["OMP_NUM_THREADS"] = std::to_string(std::max(1u, cores / unsigned(n)));
    }
    // How OpenMP threads wait for work, unless the user chose (either variable): spin ~1000
    // pause instructions (some 30 us), then sleep. libgomp's default spins 300000 (about 10 ms)
    // at every barrier; when other processes share the cores, that spinning takes the time
    // slices the thread still computing needs, and a step gets 2-12x slower. Sleeping at once
    // (OMP_WAIT_POLICY=passive) fixes that too but costs ~10% on an idle machine, where the next
    // parallel region usually starts within those 30 us. Measured: docs/benchmarks.md, "OpenMP
    // wait policy". libgomp reads this once, when the program starts, so the launcher sets it.
    if (!env.count("OMP_WAIT_POLICY") && !env.count("GOMP_SPINCOUNT"))
      env["GOMP_SPINCOUNT"] = "1000";
    std::vector<WorkerSpec> specs;
    for (int local = 0; local < n; ++local) {
      int rank = cfg_.node_rank * n + local;
      env["LOCAL_RANK"] = std::to_string(local);
      env["RANK"] = env["ROLE_RANK"] = std::to_string(rank);
      env["GROUP_RANK"] = std::to_string(cfg_.node_rank);
      env["LOCAL_WORLD_SIZE"] = std::to_string(n);
      env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = std::to_string(world);
      env["GROUP_WORLD_SIZE"] = std::to_string(cfg_.nnodes);
      env["ROLE_NAME"] = "default";
      env["MASTER_ADDR"] = cfg_.master_addr;
      env["MASTER_PORT"] = std::to_string(port);
      env["TORCHELASTIC_RESTART_COUNT"] = env["DDPLAB_RESTART_COUNT"] = std::to_string(round);
      env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(cfg_.max_restarts);
      env["TORCHELASTIC_RUN_ID"] = cfg_.run_id;
      env["DDPLAB_STORE_TOKEN"] = worker_token_;  // rank 0's store lets only this job's workers in
      if (!report_dir_.empty()) env["DDPLAB_ERROR_FILE"] = report_file(round, rank);
      // Flight-recorder dumps next to the logs, where one looks after a failure.
      if (!cfg_.log_dir.empty() && !std::getenv("DDPLAB_FLIGHT_RECORDER_DIR"))
        env["DDPLAB_FLIGHT_RECORDER_DIR"] = cfg_.log_dir;
      WorkerSpec spec;
      spec.rank = rank;
      for (auto& [k, v] : env) spec.env.push_back(std::string(k).append("=").append(v));
      specs.push_back(std::move(spec));
    }
    return specs;
  }

  // Publishes a failure; the first one published in a round wins and every node reports it.
  Failure publish(int round, const Failure& f) {
    return decode(string_cas(key(round, "failed"), encode(f)));
  }

  Failure interrupted(int round) {
    int sig = g_signal;
    const char* name = sigabbrev_np(sig);
    Failure f{128 + sig, true,
              "node " + std::to_string(cfg_.node_rank) + " received SIG" + (name ? name : "?")};
    try {
      publish(round, f);  // tell the other nodes to stop too
    } catch (const Error&) {
    }
    return f;
  }

  // Watches the local workers and the other nodes; true when every node's workers succeeded.
  bool monitor(int round, Failure& f) {
    bool reported = false;
    for (;;) {
      group_.poll(seconds(cfg_.monitor_interval_s));
      if (g_signal) {
        f = interrupted(round);
        group_.stop(g_signal, seconds(cfg_.stop_grace_s));  // forward the signal to the workers
        return false;
      }
      if (auto e = group_.first_failure()) {
        std::string where = cfg_.nnodes > 1 ? " on node " + std::to_string(cfg_.node_rank) : "";
        std::string what = e->describe() + where;
        std::string hung = find_hung_ranks(round);
        if (!hung.empty()) what = hung.append("; ").append(what).append(" after waiting for it");
        f = publish(round, Failure{e->code, false, what});
        group_.stop(SIGTERM, seconds(cfg_.stop_grace_s));
        return false;
      }
      if (store_->check({key(round, "failed")})) {
        f = decode(store_->get_string(key(round, "failed")));
        group_.stop(SIGTERM, seconds(cfg_.stop_grace_s));
        return false;
      }
      if (!reported && group_.all_succeeded()) {
        store_->add(key(round, "succeeded"), 1);
        reported = true;
      }
      if (reported && store_->add(key(round, "succeeded"), 0) == cfg_.nnodes) return true;
    }
  }

  std::string report_file(int round, int rank) const {
    return report_dir_ + "/round" + std::to_string(round) + "_rank" + std::to_string(rank) +
           ".json";
  }

  // Names (and kills) the ranks that hung, from the local workers' hang reports and the
  // stopped workers (see the note at the top). "" when there is no sign of a hang.
  std::string find_hung_ranks(int round) {
    std::map<int, std::vector<std::string>> signs;  // hung rank -> why we think so
    for (int local = 0; local < cfg_.nproc_per_node; ++local) {
      const int reporter = cfg_.node_rank * cfg_.nproc_per_node + local;
      std::ifstream f(report_file(round, reporter));
      std::string line;
      if (!f || !std::getline(f, line)) continue;
      const auto report = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!report.is_object()) continue;  // half written when the worker died: no sign
      const std::string why = "rank " + std::to_string(reporter) + " timed out in " +
                              report.value("collective", std::string("?")) + " seq " +
                              (report.contains("seq") ? report["seq"].dump() : "?") +
                              " waiting for it";
      for (int r : report.value("missing_ranks", std::vector<int>{})) signs[r].push_back(why);
    }
    std::map<int, pid_t> pids;
    for (const auto& w : group_.running()) {
      pids[w.rank] = w.pid;
      const char state = process_state(w.pid);
      if (state == 'T' || state == 't') signs[w.rank].push_back("it is stopped (state T)");
    }
    std::ostringstream os;
    for (const auto& [rank, why] : signs) {
      os << (os.tellp() > 0 ? "; " : "") << "rank " << rank;
      if (pids.count(rank)) os << " (pid " << pids[rank] << ")";
      os << " hung: ";
      for (size_t i = 0; i < why.size(); ++i) os << (i ? ", " : "") << why[i];
      if (pids.count(rank)) {
        group_.kill_rank(rank);
        os << "; ddprun killed it";
      }
    }
    return os.str();
  }

  // Node 0 hosts the store, so it waits (briefly) until the others have read the outcome.
  int finish(int code) {
    try {
      store_->add(prefix_ + "exited", 1);
      auto deadline = std::chrono::steady_clock::now() + Ms(10000);
      while (cfg_.node_rank == 0 && store_->add(prefix_ + "exited", 0) < cfg_.nnodes &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(Ms(20));
    } catch (const Error&) {
      // Node 0 already gone: the outcome was read.
    }
    return code;
  }

  const LaunchConfig& cfg_;
  std::string prefix_;
  std::unique_ptr<TCPStore> store_;
  std::string worker_token_;  // DDPLAB_STORE_TOKEN of the workers (see Tokens at the top)
  WorkerGroup group_;
  std::string report_dir_;  // the workers' hang reports (DDPLAB_ERROR_FILE), removed at exit
};

}  // namespace

int run_launcher(const LaunchConfig& cfg) {
  DDP_CHECK(!cfg.argv.empty(), "ddprun: no program to run");
  DDP_CHECK(cfg.nproc_per_node >= 1, "ddprun: --nproc-per-node must be at least 1");
  DDP_CHECK(
      cfg.nnodes >= 1 && cfg.node_rank >= 0 && cfg.node_rank < cfg.nnodes,
      "ddprun: --node-rank " << cfg.node_rank << " is not in [0, --nnodes " << cfg.nnodes << ")");
  ::signal(SIGPIPE, SIG_IGN);
  // No SA_RESTART: a signal interrupts poll() so the monitor reacts at once.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  Agent agent(cfg);
  return agent.run();
}

int detect_gpu_count() {
  int count = 0;
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          std::all_of(name.begin() + 6, name.end(), ::isdigit))
        ++count;
    }
    ::closedir(d);
  }
  if (count > 0) return count;
  std::string smi = resolve_program("nvidia-smi");
  if (smi.find('/') == std::string::npos) return 0;
  if (FILE* p = ::popen((smi + " -L 2>/dev/null").c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), p))
      if (std::strncmp(line, "GPU ", 4) == 0) ++count;
    ::pclose(p);
  }
  return count;
}

}  // namespace ddplab::tools
