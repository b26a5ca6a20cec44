// Process groups end to end: every Gloo collective against hand-computed results for world
// sizes 1-4, the asynchronous Work handles, the timeout message that names the missing rank, the
// teaching ring all-reduce against Gloo's, init_process_group from the environment, and (only
// where a GPU exists) the NCCL backend.
//
// Each multi-rank case forks one process per rank (before any Gloo device or CUDA context exists,
// which fork would not copy correctly). Rank 0 hosts a TCPStore on a free port; the children
// report failures on stderr and through their exit status, which the parent checks. The parent
// itself runs no tensor op, so no OpenMP pool is forked either.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "comm/init_process_group.h"
#include "comm/process_group.h"
#include "comm/process_group_gloo.h"
#include "comm/ring_allreduce.h"
#include "comm/store/store.h"
#include "fork_ranks.h"
#include "tensor/backend.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/skip.h"

#if defined(DDP_CUDA)
#include "comm/process_group_nccl.h"
#include "ddp/model_check.h"
#include "nn/layers.h"
#endif

using namespace ddplab;
using namespace ddplab::distributed;
using namespace ddplab::testing;
using namespace std::chrono_literals;

namespace {

// The value rank r holds at element i: small integers, exact in every dtype, different per rank.
double value(int r, int64_t i) {
  return static_cast<double>((i % 13) - 6) * (r + 1) + r;
}

template <class T>
Tensor filled(int r, int64_t n, DType dt) {
  Tensor t = ops::empty({n}, dt);
  T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(value(r, i));
  return t;
}

template <class T>
T expected_reduce(distributed::ReduceOp op, int world, int64_t i) {
  T acc = static_cast<T>(value(0, i));
  for (int r = 1; r < world; ++r) {
    const T v = static_cast<T>(value(r, i));
    if (op == distributed::ReduceOp::Sum || op == distributed::ReduceOp::Avg)
      acc = static_cast<T>(acc + v);
    if (op == distributed::ReduceOp::Max) acc = std::max(acc, v);
    if (op == distributed::ReduceOp::Min) acc = std::min(acc, v);
  }
  if (op == distributed::ReduceOp::Avg) acc = static_cast<T>(acc / static_cast<T>(world));
  return acc;
}

template <class T>
void check_all_reduce(ProcessGroup& pg, DType dt, int64_t n, distributed::ReduceOp op) {
  Tensor t = filled<T>(pg.rank(), n, dt);
  pg.all_reduce(t, op)->wait();
  const T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) {
    const T want = expected_reduce<T>(op, pg.size(), i);
    EXPECT(p[i] == want, "all_reduce " << reduce_op_name(op) << " " << dtype_name(dt) << " n=" << n
                                       << " element " << i << ": got " << p[i] << ", want "
                                       << want);
  }
}

// The message of the ddplab::Error that f throws.
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<int64_t> kSizes = {0, 1, 1001, int64_t{1} << 20};
const std::vector<distributed::ReduceOp> kOps = {
    distributed::ReduceOp::Sum, distributed::ReduceOp::Avg, distributed::ReduceOp::Max,
    distributed::ReduceOp::Min};

}  // namespace

TEST_CASE("gloo all_reduce: sum/avg/max/min x float32/float64/int64 x sizes 0, 1, 1001, 1M") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
      auto pg = make_group(rank, w, store);
      EXPECT(pg->rank() == rank && pg->size() == w && pg->backend_name() == "gloo", "identity");
      for (int64_t n : kSizes)
        for (distributed::ReduceOp op : kOps) {
          check_all_reduce<float>(*pg, kFloat32, n, op);
          check_all_reduce<double>(*pg, kFloat64, n, op);
          check_all_reduce<int64_t>(*pg, kInt64, n, op);
        }
      // 16-bit floats travel as float32: 1.5 * (rank + 1) sums exactly.
      for (DType dt : {kFloat16, kBFloat16}) {
        Tensor h = ops::to(ops::full({5}, 1.5 * (rank + 1)), dt);
        pg->all_reduce(h, distributed::ReduceOp::Sum)->wait();
        const double want = 1.5 * w * (w + 1) / 2;
        for (double v : h.to_vector<double>())
          EXPECT(v == want, dtype_name(dt) << " sum: got " << v << ", want " << want);
      }
      EXPECT(pg->sequence_number() == 4 * 4 * 3 + 2, "seq " << pg->sequence_number());
      finish(pg, *store);
    });
  }
}

TEST_CASE("gloo broadcast from every root, any dtype, sizes 0, 1, 1001, 1M") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
      auto pg = make_group(rank, w, store);
      for (int root = 0; root < w; ++root)
        for (int64_t n : kSizes) {
          Tensor f = filled<float>(rank, n, kFloat32);
          Tensor l = filled<int64_t>(rank, n, kInt64);
          auto w1 = pg->broadcast(f, root);
          auto w2 = pg->broadcast(l, root);
          w1->wait();
          w2->wait();
          for (int64_t i = 0; i < n; ++i) {
            EXPECT(f.data_ptr<float>()[i] == static_cast<float>(value(root, i)),
                   "float32 root " << root << " n " << n << " i " << i);
            EXPECT(l.data_ptr<int64_t>()[i] == static_cast<int64_t>(value(root, i)),
                   "int64 root " << root << " n " << n << " i " << i);
          }
        }
      finish(pg, *store);
    });
  }
}

TEST_CASE("gloo all_gather and reduce_scatter, sizes 0, 1, 1001") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
      auto pg = make_group(rank, w, store);
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}}) {
        // all_gather: outputs[r] is rank r's input.
        Tensor in = filled<double>(rank, n, kFloat64);
        std::vector<Tensor> outs;
        for (int r = 0; r < w; ++r) outs.push_back(ops::full({n}, -1.0, kFloat64));
        pg->all_gather(outs, in)->wait();
        for (int r = 0; r < w; ++r)
          for (int64_t i = 0; i < n; ++i)
            EXPECT(outs[r].data_ptr<double>()[i] == value(r, i),
                   "all_gather n " << n << " from rank " << r << " element " << i);

        // reduce_scatter: rank r gets the reduction of everyone's inputs[r]. Rank q's
        // inputs[r] holds value(q, i + r): so rank r expects expected_reduce at i + r.
        for (distributed::ReduceOp op : kOps) {
          std::vector<Tensor> ins;
          for (int r = 0; r < w; ++r) {
            Tensor t = ops::empty({n}, kInt64);
            for (int64_t i = 0; i < n; ++i)
              t.data_ptr<int64_t>()[i] = static_cast<int64_t>(value(rank, i + r));
            ins.push_back(t);
          }
          Tensor out = ops::zeros({n}, kInt64);
          pg->reduce_scatter(out, ins, op)->wait();
          for (int64_t i = 0; i < n; ++i)
            EXPECT(out.data_ptr<int64_t>()[i] == expected_reduce<int64_t>(op, w, i + rank),
                   "reduce_scatter " << reduce_op_name(op) << " n " << n << " element " << i);
        }
      }
      finish(pg, *store);
    });
  }
}

TEST_CASE("gloo barrier: nobody leaves before everyone arrived") {
  run_ranks(3, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 * rank));
    store->add("arrived", 1);
    pg->barrier()->wait();
    EXPECT(store->add("arrived", 0) == w, "left the barrier before every rank arrived");
    finish(pg, *store);
  });
}

TEST_CASE("gloo async: several outstanding Works, waited for in reverse order") {
  run_ranks(3, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    std::vector<Tensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(ops::full({1000 + k}, k + rank));
      works.push_back(pg->all_reduce(ts.back()));
    }
    Tensor b = ops::full({7}, rank);
    works.push_back(pg->broadcast(b, 2));
    std::vector<Tensor> gathered = {ops::zeros({2}), ops::zeros({2}), ops::zeros({2})};
    works.push_back(pg->all_gather(gathered, ops::full({2}, 10 * rank)));
    works.push_back(pg->barrier());
    EXPECT(pg->sequence_number() == 9, "seq " << pg->sequence_number());
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (auto& wk : works) EXPECT(wk->is_completed() && wk->error().empty(), "state");
    for (int k = 0; k < 6; ++k) {
      const double want = 3.0 * k + 3;  // sum over ranks 0..2 of (k + rank)
      for (double v : ts[k].to_vector<double>()) EXPECT(v == want, "tensor " << k);
    }
    for (double v : b.to_vector<double>()) EXPECT(v == 2, "broadcast");
    for (int r = 0; r < w; ++r)
      for (double v : gathered[r].to_vector<double>()) EXPECT(v == 10 * r, "all_gather");
    finish(pg, *store);
  });
}

TEST_CASE("gloo argument errors name the tensor, its shape and device") {
  run_ranks(1, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    std::string m = error_message([&] {
      pg->all_reduce(ops::transpose(ops::zeros({2, 3}), 0, 1));
    });
    EXPECT(m.find("not contiguous") != std::string::npos && m.find("[3, 2]") != std::string::npos,
           m);
    m = error_message([&] { pg->all_reduce(ops::zeros({4}, kBool)); });
    EXPECT(m.find("bool") != std::string::npos, m);
    m = error_message([&] { pg->broadcast(ops::zeros({4}), 5); });
    EXPECT(m.find("root 5") != std::string::npos, m);
    m = error_message([&] { pg->all_gather({ops::zeros({2}), ops::zeros({2})}, ops::zeros({2})); });
    EXPECT(m.find("expected 1 output") != std::string::npos, m);
    EXPECT(pg->sequence_number() == 0, "a rejected call must not use a sequence number");
    finish(pg, *store);
  });
}

TEST_CASE("gloo argument errors: the messages of the checks ProcessGroup makes for every backend") {
  run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    // Every message starts with the collective, this rank and the backend.
    auto expect_message = [&](const std::string& m, const std::string& collective,
                              const std::string& detail) {
      const std::string start = collective + " on rank " + std::to_string(rank) + " (gloo): ";
      EXPECT(m.rfind(start, 0) == 0 && m.find(detail) != std::string::npos,
             "message: " << m << "\n  expected it to start with: " << start
                         << "\n  and to contain: " << detail);
    };
    expect_message(error_message([&] { pg->all_reduce(Tensor()); }), "all_reduce",
                   "the tensor is undefined");
    expect_message(error_message([&] {
                     pg->all_reduce(ops::transpose(ops::zeros({2, 3}), 0, 1));
                   }),
                   "all_reduce",
                   "the tensor (float32, shape [3, 2]) with strides [1, 3] is not contiguous");
    expect_message(error_message([&] { pg->all_reduce(ops::zeros({4}, kBool)); }), "all_reduce",
                   "the tensor (bool, shape [4]) cannot be reduced");
    expect_message(error_message([&] { pg->broadcast(ops::zeros({4}), 5); }), "broadcast",
                   "root 5 is outside a group of size 2");
    expect_message(error_message([&] { pg->all_gather({ops::zeros({2})}, ops::zeros({2})); }),
                   "all_gather", "expected 2 output tensors (one per rank), got 1");
    expect_message(
        error_message([&] {
          pg->all_gather({ops::zeros({3}, kFloat64), ops::zeros({3})}, ops::zeros({3}, kFloat64));
        }),
        "all_gather",
        "output[1] (float32, shape [3]) does not match the input (float64, shape [3])");
    expect_message(error_message([&] {
                     pg->reduce_scatter(ops::zeros({4}, kInt64),
                                        {ops::zeros({4}, kInt64), ops::zeros({5}, kInt64)});
                   }),
                   "reduce_scatter",
                   "input[1] (int64, shape [5]) does not match the output (int64, shape [4])");
    expect_message(error_message([&] {
                     pg->reduce_scatter(ops::zeros({2}, kBool),
                                        {ops::zeros({2}, kBool), ops::zeros({2}, kBool)});
                   }),
                   "reduce_scatter", "the output (bool, shape [2]) cannot be reduced");
    EXPECT(pg->sequence_number() == 0, "a rejected call must not use a sequence number");
    finish(pg, *store);
  });
}

TEST_CASE("gloo all_reduce: uint8, and integer Avg truncates toward zero") {
  run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    // Rank 0 holds 2, rank 1 holds 5.
    const std::vector<std::pair<ReduceOp, double>> expected = {
        {ReduceOp::Sum, 7}, {ReduceOp::Avg, 3}, {ReduceOp::Max, 5}, {ReduceOp::Min, 2}};
    for (const auto& [op, want] : expected) {
      Tensor u = ops::full({3}, 3 * rank + 2, kUInt8);
      pg->all_reduce(u, op)->wait();
      for (double v : u.to_vector<double>())
        EXPECT(v == want, "uint8 " << reduce_op_name(op) << ": got " << v << ", want " << want);
    }
    // -3 and 0: the average -1.5 becomes -1 (truncation, as C++'s `/` and NCCL's ncclAvg), not
    // -2 (a floor division).
    Tensor i = ops::full({2}, rank == 0 ? -3 : 0, kInt32);
    pg->all_reduce(i, ReduceOp::Avg)->wait();
    for (double v : i.to_vector<double>()) EXPECT(v == -1, "int32 avg: got " << v);
    finish(pg, *store);
  });
}

TEST_CASE("gloo timeout: rank 0's wait names all_reduce, its seq and the rank that never came") {
  run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store, 2s);
    Tensor x = ops::ones({100});
    pg->all_reduce(x)->wait();  // seq 0: both ranks
    if (rank == 1) {
      // Never calls seq 1; stays alive (connections open) until rank 0 has checked.
      store->get("rank0_checked");
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto work = pg->all_reduce(x);  // seq 1
    std::string msg;
    try {
      work->wait();
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[timeout test] wait threw after %.2f s:\n  %s\n", s, msg.c_str());
    EXPECT(!msg.empty(), "wait did not throw");
    EXPECT(msg.find("all_reduce") != std::string::npos, msg);
    EXPECT(msg.find("seq 1") != std::string::npos, msg);
    EXPECT(msg.find("rank 1 did not join") != std::string::npos, msg);
    EXPECT(msg.find("group of 2") != std::string::npos, msg);
    EXPECT(s > 1.5 && s < 10, "took " << s << " s");
    // The group is broken now: the next collective fails at once, quoting the first failure.
    std::string next;
    try {
      pg->barrier()->wait();
    } catch (const Error& e) {
      next = e.what();
    }
    EXPECT(next.find("earlier collective") != std::string::npos &&
               next.find("seq 1") != std::string::npos,
           next);
    store->set("rank0_checked", std::string("1"));
  });
}

TEST_CASE("gloo Work::wait with a short timeout throws, the collective still completes later") {
  run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store, 20s);
    Tensor x = ops::full({10}, rank + 1);
    if (rank == 1) store->get("rank0_gave_up");  // arrive late on purpose
    auto work = pg->all_reduce(x);
    if (rank == 0) {
      std::string msg;
      try {
        work->wait(300ms);
      } catch (const Error& e) {
        msg = e.what();
      }
      EXPECT(msg.find("Work::wait gave up after 300 ms") != std::string::npos, msg);
      EXPECT(msg.find("rank 1 did not join all_reduce seq 0") != std::string::npos, msg);
      store->set("rank0_gave_up", std::string("1"));
    }
    work->wait();
    for (double v : x.to_vector<double>()) EXPECT(v == 3, "sum after a late arrival");
    finish(pg, *store);
  });
}

TEST_CASE("ring_allreduce (teaching version) equals gloo all_reduce") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
      auto pg = make_group(rank, w, store);
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{1} << 18}) {
        for (DType dt : {kFloat32, kFloat64, kInt64}) {
          Tensor a = ops::to(filled<double>(rank, n, kFloat64), dt);
          Tensor b = ops::clone(a);
          auto w1 = ring_allreduce(*pg, a);
          auto w2 = pg->all_reduce(b);
          w1->wait();
          w2->wait();
          EXPECT(ops::max_abs_diff(a, b) == 0 || n == 0,
                 "ring vs gloo differ: n " << n << " " << dtype_name(dt));
          if (n > 0)
            EXPECT(a.to_vector<double>()[0] ==
                       expected_reduce<double>(distributed::ReduceOp::Sum, w, 0),
                   "ring sum n " << n);
        }
      }
      finish(pg, *store);
    });
  }
}

TEST_CASE("gloo all_reduce timing, 2 ranks: 1M and 16M float32 (printed)") {
  run_ranks(2, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store, 60s);
    for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24}) {
      Tensor t = ops::ones({n});
      for (const char* algo : {"gloo all_reduce", "ring_allreduce"}) {
        const bool ring = algo[0] == 'r';
        auto run = [&] { (ring ? ring_allreduce(*pg, t) : pg->all_reduce(t))->wait(); };
        run();  // warm up: first touch of the buffers, connections
        std::vector<double> ms;
        for (int k = 0; k < 5; ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          run();
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        std::sort(ms.begin(), ms.end());
        if (rank == 0)
          std::printf("[timing] %-16s %8lld floats: median %.1f ms (min %.1f)\n", algo,
                      static_cast<long long>(n), ms[2], ms[0]);
      }
    }
    finish(pg, *store);
  });
}

TEST_CASE("init_process_group reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; rank 0 hosts") {
  const int master_port = net::pick_free_port("127.0.0.1");
  run_ranks(2, [master_port](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    set_torchrun_env(rank, w, master_port);
    if (rank == 1) std::this_thread::sleep_for(300ms);  // let rank 1 connect first: it retries
    {
      InitOptions o;
      o.timeout = 20s;
      auto pg = init_process_group(o);
      EXPECT(pg->backend_name() == "gloo" && pg->rank() == rank && pg->size() == w, "identity");
      EXPECT(pg->timeout() == 20s, "timeout");
      Tensor t = ops::full({3}, rank + 1);
      pg->all_reduce(t, distributed::ReduceOp::Avg)->wait();
      for (double v : t.to_vector<double>()) EXPECT(v == 1.5, "avg");
      store_sync(*store, "init_done", rank, w);  // rank 0's group hosts the store: wait for all
    }
  });
}

TEST_CASE("init_process_group: a bad backend choice fails before any network") {
  InitOptions o;
  o.rank = 0;
  o.world_size = 2;  // would block on rendezvous if it got that far
  o.backend = "mpi";
  CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("unknown backend"), Error);
#if !defined(DDP_CUDA)
  o.backend = "auto";
  o.device = cuda(0);  // auto picks nccl for CUDA tensors
  CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("built with CUDA"), Error);
#endif
  o.backend = "gloo";
  o.device = cuda(0);
  CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("CPU tensors"), Error);
}

namespace {}  // namespace

TEST_CASE("launch_env_from_environment: torchrun/ddprun, Slurm, and nothing") {
  EnvGuard guard(kLaunchVars);
  LaunchEnv none = launch_env_from_environment();
  CHECK_FALSE(none.from_launcher);
  CHECK(none.rank == 0);
  CHECK(none.world_size == 1);
  CHECK(none.master_addr == "127.0.0.1");
  CHECK(none.master_port == 29500);

  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "41000", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  LaunchEnv t = launch_env_from_environment();
  CHECK(t.from_launcher);
  CHECK(t.rank == 5);
  CHECK(t.world_size == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.local_world_size == 4);
  CHECK(t.master_addr == "10.0.0.1");
  CHECK(t.master_port == 41000);
  CHECK(t.restart_count == 2);
  setenv("RANK", "x1", 1);
  CHECK_THROWS_WITH_AS(launch_env_from_environment(), doctest::Contains("RANK='x1'"), Error);
  setenv("RANK", "8", 1);
  CHECK_THROWS_AS(launch_env_from_environment(), Error);

  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"})
    unsetenv(v);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NNODES", "4", 1);
  LaunchEnv s = launch_env_from_environment();
  CHECK(s.from_launcher);
  CHECK(s.rank == 3);
  CHECK(s.world_size == 8);
  CHECK(s.local_rank == 1);
  CHECK(s.local_world_size == 2);  // derived: 8 tasks over 4 nodes
  CHECK(s.master_addr == "127.0.0.1");
  CHECK(s.master_port == 29500);
  setenv("SLURM_TASKS_PER_NODE", "2(x4)", 1);
  CHECK(launch_env_from_environment().local_world_size == 2);
  setenv("SLURM_NTASKS_PER_NODE", "3", 1);
  CHECK(launch_env_from_environment().local_world_size == 3);
}

TEST_CASE("gloo interface choice: env vars, loopback, host name") {
  EnvGuard guard({"DDPLAB_GLOO_IFNAME", "DDPLAB_GLOO_HOSTNAME"});
  CHECK(gloo_interface_from_environment("127.0.0.1").hostname == "127.0.0.1");
  CHECK(gloo_interface_from_environment("localhost").hostname == "127.0.0.1");
  CHECK_FALSE(gloo_interface_from_environment("10.1.2.3").hostname.empty());  // gethostname
  setenv("DDPLAB_GLOO_HOSTNAME", "10.9.9.9", 1);
  CHECK(gloo_interface_from_environment("10.1.2.3").hostname == "10.9.9.9");
  setenv("DDPLAB_GLOO_IFNAME", "eth7", 1);
  CHECK(gloo_interface_from_environment("10.1.2.3").iface == "eth7");
}

namespace {
// CUDA must not be initialised in a process that forks workers afterwards, so even the GPU count
// is asked in a throwaway child.
[[maybe_unused]] int gpu_count_in_child() {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(std::min(ddplab::cuda_device_count(), 100));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}
}  // namespace

TEST_CASE("small host values (comm/collectives.h) over gloo, 3 ranks") {
  run_ranks(3, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, w, store);
    EXPECT(distributed::all_reduce_value(*pg, rank + 1) == 6, "sum");
    EXPECT(distributed::all_reduce_value(*pg, rank, distributed::ReduceOp::Max) == 2, "max");
    EXPECT(distributed::broadcast_value(*pg, 100 + rank, 1) == 101, "broadcast_value");
    const auto all = distributed::all_gather_values(*pg, {rank, 10 * rank, -rank});
    EXPECT(all.size() == 3, "all_gather_values size " << all.size());
    for (int r = 0; r < w; ++r)
      EXPECT((all[r] == std::vector<int64_t>{r, 10 * r, -r}), "all_gather_values rank " << r);
    // Bytes, not text: a zero byte inside, and an empty one.
    const std::string bytes = std::string("a\0b", 3) + std::to_string(rank);
    EXPECT(distributed::broadcast_bytes(*pg, bytes, 2) == std::string("a\0b2", 4),
           "broadcast_bytes");
    EXPECT(distributed::broadcast_bytes(*pg, rank == 0 ? "" : "x", 0).empty(), "empty bytes");
    const auto strings = distributed::all_gather_strings(*pg, std::string(rank * 2, 'a' + rank));
    for (int r = 0; r < w; ++r)
      EXPECT(strings[r] == std::string(r * 2, 'a' + r), "all_gather_strings rank " << r);
  });
}

TEST_CASE("nccl backend: all_reduce/broadcast/all_gather/reduce_scatter/barrier on GPUs") {
#if !defined(DDP_CUDA)
  DDP_SKIP_IF(true, "ddplab was built without CUDA (the NCCL backend is compile-checked only)");
#else
  const int gpus = gpu_count_in_child();
  DDP_SKIP_IF(gpus == 0, "no GPU (ddplab::cuda_device_count() is 0)");
  for (int world = 1; world <= std::min(gpus, 2); ++world) {
    CAPTURE(world);
    run_ranks(world, [](int rank, int w, const std::shared_ptr<TCPStore>& store) {
      NcclOptions o;
      o.timeout = 60s;
      o.device = rank;
      o.group_name = "nccl_test";
      auto pg = std::make_unique<ProcessGroupNCCL>(store, rank, w, o);
      const Device dev = cuda(rank);
      Tensor t = ops::to(filled<float>(rank, 1001, kFloat32), dev);
      pg->all_reduce(t)->wait();
      Tensor host = ops::to(t, kCPU);
      for (int64_t i = 0; i < 1001; ++i)
        EXPECT(
            host.data_ptr<float>()[i] == expected_reduce<float>(distributed::ReduceOp::Sum, w, i),
            "nccl sum element " << i);
      Tensor a = ops::to(ops::full({17}, rank + 1), dev);
      pg->all_reduce(a, distributed::ReduceOp::Avg)->wait();
      for (double v : a.to_vector<double>()) EXPECT(v == (w + 1) / 2.0, "nccl avg");
      Tensor b = ops::to(ops::full({5}, 10 + rank), dev);
      pg->broadcast(b, w - 1)->wait();
      for (double v : b.to_vector<double>()) EXPECT(v == 10 + w - 1, "nccl broadcast");
      std::vector<Tensor> outs;
      for (int r = 0; r < w; ++r) outs.push_back(ops::zeros({3}, {kFloat32, dev}));
      pg->all_gather(outs, ops::to(ops::full({3}, rank), dev))->wait();
      for (int r = 0; r < w; ++r)
        for (double v : outs[r].to_vector<double>()) EXPECT(v == r, "nccl all_gather");
      std::vector<Tensor> ins;
      for (int r = 0; r < w; ++r) ins.push_back(ops::to(ops::full({4}, r + 1), dev));
      Tensor out = ops::zeros({4}, {kFloat32, dev});
      pg->reduce_scatter(out, ins)->wait();
      for (double v : out.to_vector<double>()) EXPECT(v == w * (rank + 1), "nccl reduce_scatter");
      pg->barrier()->wait();
      EXPECT(pg->sequence_number() == 6, "seq");
      // The small-value helpers place their tensors on the group's device (a CPU tensor would be
      // refused here, as DDP's construction check once did on NCCL).
      EXPECT(distributed::all_reduce_value(*pg, rank + 1) == w * (w + 1) / 2, "all_reduce_value");
      EXPECT(distributed::broadcast_value(*pg, rank + 7, 0) == 7, "broadcast_value");
      EXPECT(distributed::all_gather_values(*pg, {rank}).size() == static_cast<size_t>(w),
             "all_gather_values");
      EXPECT(distributed::broadcast_bytes(*pg, "nccl" + std::to_string(rank), 0) == "nccl0",
             "broadcast_bytes");
      EXPECT(distributed::all_gather_strings(*pg, "r" + std::to_string(rank)).back() ==
                 "r" + std::to_string(w - 1),
             "all_gather_strings");
      // DDP's construction check, which all-gathers each rank's model signature.
      distributed::verify_same_model_on_all_ranks(nn::Linear(3, 2), *pg);
      store_sync(*store, "nccl_done", rank, w);
    });
  }
  if (gpus < 2) MESSAGE("2-rank NCCL case skipped: only " << gpus << " GPU");
#endif
}
