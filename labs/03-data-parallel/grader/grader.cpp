// Lab 3's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracles: one process computing the gradient of the WHOLE global batch (what W ranks must
// agree on), the library's bucket rule (ddp/bucket_layout.h) and the buckets of its
// Reducer, the gradients of DistributedDataParallel, and the group's flight recorder, which lists
// every collective a rank issued (to count them and read their sizes). Multi-rank cases fork one
// process per rank with a Gloo group (tests/distributed/fork_ranks.h); everything that touches a
// tensor runs in the children.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "data_parallel_lab.h"
#include "ddp/bucket_layout.h"
#include "ddp/ddp.h"
#include "fork_ranks.h"
#include "models/models.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/threads.h"

using namespace ddplab;
using distributed::FlightRecorder;

namespace {

constexpr int64_t kPerRank = 4;  // rows of each rank's mini-batch
constexpr int64_t kClasses = 10;
constexpr uint64_t kSeed = 42;

// A small model with a frozen layer in the middle: its parameters must take part in nothing.
// Registration order: conv, fc1, frozen, fc2; backward produces fc2's gradients first.
class SmallNet : public nn::Module {
 public:
  SmallNet() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 3, 3, 1, 1));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(3 * 6 * 6, 24));
    frozen = register_module("frozen", std::make_shared<nn::Linear>(24, 24));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(24, kClasses));
    frozen->weight.set_requires_grad(false);
    frozen->bias.set_requires_grad(false);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = nn::functional::relu(conv->forward(reshape(x, {x.size(0), 1, 6, 6})));
    h = nn::functional::relu(fc1->forward(reshape(h, {x.size(0), 3 * 6 * 6})));
    h = nn::functional::relu(frozen->forward(h));
    return fc2->forward(h);
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> fc1, frozen, fc2;
};

// Every replica starts from the same weights (what DDP's broadcast at construction ensures).
std::shared_ptr<SmallNet> make_net() {
  manual_seed(kSeed);
  return std::make_shared<SmallNet>();
}

struct Batch {
  Tensor x, y;
};

// The global batch of `world` ranks: the same on every rank, rank r takes rows [r B, (r+1) B).
Batch global_batch(int world) {
  Generator gen(7);
  return {ops::randn({world * kPerRank, 36}, kFloat32, &gen),
          ops::randint(0, kClasses, {world * kPerRank}, &gen)};
}

Batch rows_of(const Batch& b, int rank) {
  return {ops::contiguous(ops::narrow(b.x, 0, rank * kPerRank, kPerRank)),
          ops::contiguous(ops::narrow(b.y, 0, rank * kPerRank, kPerRank))};
}

void backward_on(nn::Module& m, const Batch& b) {
  nn::functional::cross_entropy(m.forward(b.x), b.y).backward();
}

std::vector<Tensor> trainable(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<size_t> nbytes_of(const std::vector<Tensor>& ps) {
  std::vector<size_t> n;
  n.reserve(ps.size());
  for (const Tensor& p : ps) n.push_back(p.nbytes());
  return n;
}

// The library's rule with one cap for every bucket: the oracle of part 2.
std::vector<std::vector<size_t>> library_buckets(const std::vector<size_t>& nbytes, size_t cap) {
  std::vector<size_t> reverse;
  for (size_t k = nbytes.size(); k-- > 0;) reverse.push_back(k);
  return distributed::compute_bucket_layout(nbytes, std::vector<DType>(nbytes.size(), kFloat32),
                                            reverse, cap, cap);
}

std::string show(const std::vector<std::vector<size_t>>& buckets) {
  std::string s = "{";
  for (const auto& b : buckets) {
    s += s.size() > 1 ? ",{" : "{";
    for (size_t k = 0; k < b.size(); ++k) s += (k ? "," : "") + std::to_string(b[k]);
    s += "}";
  }
  return s + "}";
}

// On every rank: the gradients `sync` leaves equal the single-process gradient of the global
// batch, parameter by parameter, and the frozen layer still has none.
void check_equals_one_process(
    int world, const char* what,
    const std::function<void(const std::vector<Tensor>&, distributed::ProcessGroup&)>& sync) {
  testing::run_ranks(world, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    set_num_threads(1);
    auto pg = testing::make_group(rank, w, st);
    const Batch global = global_batch(w);
    auto reference = make_net();
    backward_on(*reference, global);
    auto net = make_net();
    backward_on(*net, rows_of(global, rank));
    sync(net->parameters(), *pg);
    const auto want = reference->named_parameters();
    const auto got = net->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].second.requires_grad()) {
        EXPECT(!got[i].second.grad().defined(), got[i].first << " is frozen but got a gradient");
        continue;
      }
      const double err = ops::max_rel_error(got[i].second.grad(), want[i].second.grad());
      EXPECT(err < 1e-6, what << " on " << w << " ranks: " << got[i].first
                              << ".grad differs from one process on the global batch by " << err
                              << " (relative)");
    }
    testing::finish(pg, *st);
  });
}

// The number of elements of a flight-recorder shape, "[24, 108]" -> 2592.
int64_t numel_of(const std::string& sizes) {
  int64_t n = 1;
  const std::regex number("\\d+");
  for (auto it = std::sregex_iterator(sizes.begin(), sizes.end(), number);
       it != std::sregex_iterator(); ++it)
    n *= std::stoll(it->str());
  return n;
}

// The collectives this rank issued since sequence number `since`, as "op:numel" strings.
std::vector<std::string> collectives_since(distributed::ProcessGroup& pg, uint64_t since) {
  std::vector<std::string> out;
  for (const FlightRecorder::Entry& e : pg.flight_recorder()->entries())
    if (e.seq >= since) out.push_back(e.op + ":" + std::to_string(numel_of(e.sizes)));
  EXPECT(out.size() == pg.sequence_number() - since, "the flight recorder lost collectives");
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// On 2 ranks: `sync` issues exactly the all-reduces `expected(trainable params)` lists.
void check_collectives(
    const char* what,
    const std::function<void(const std::vector<Tensor>&, distributed::ProcessGroup&)>& sync,
    const std::function<std::vector<std::string>(const std::vector<Tensor>&)>& expected) {
  testing::run_ranks(2, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    set_num_threads(1);
    auto pg = testing::make_group(rank, w, st);
    auto net = make_net();
    backward_on(*net, rows_of(global_batch(w), rank));
    const uint64_t before = pg->sequence_number();
    sync(net->parameters(), *pg);
    const std::vector<std::string> got = collectives_since(*pg, before);
    const std::vector<std::string> want = expected(trainable(*net));
    EXPECT(got == want, what << " issued [" << join(got) << "], expected [" << join(want)
                             << "] (op:elements, in order)");
    testing::finish(pg, *st);
  });
}

// The all-reduces of the bucketed averaging: one per bucket of the library's rule, each of the
// bucket's total size.
std::vector<std::string> bucket_allreduces(const std::vector<Tensor>& ps, size_t cap) {
  std::vector<std::string> out;
  for (const auto& bucket : library_buckets(nbytes_of(ps), cap)) {
    int64_t numel = 0;
    for (size_t i : bucket) numel += ps[i].numel();
    out.push_back("all_reduce:" + std::to_string(numel));
  }
  return out;
}

auto naive = [](const std::vector<Tensor>& ps, distributed::ProcessGroup& pg) {
  lab3::allreduce_gradients_naive(ps, pg);
};
auto bucketed_at(size_t cap) {
  return [cap](const std::vector<Tensor>& ps, distributed::ProcessGroup& pg) {
    lab3::allreduce_gradients_bucketed(ps, pg, cap);
  };
}

constexpr size_t kCap = 1024;  // 4 buckets of SmallNet: {fc2.bias, fc2.weight} {fc1.bias} ...

}  // namespace

TEST_CASE("part 1 (naive all-reduce): equals one process on the global batch - 2 ranks") {
  check_equals_one_process(2, "allreduce_gradients_naive", naive);
}

TEST_CASE("part 1 (naive all-reduce): equals one process on the global batch - 3 ranks") {
  check_equals_one_process(3, "allreduce_gradients_naive", naive);
}

TEST_CASE("part 1 (naive all-reduce): one all-reduce per trainable parameter - in order") {
  check_collectives("allreduce_gradients_naive", naive, [](const std::vector<Tensor>& ps) {
    std::vector<std::string> out;
    out.reserve(ps.size());
    for (const Tensor& p : ps) out.push_back("all_reduce:" + std::to_string(p.numel()));
    return out;
  });
}

TEST_CASE("part 2 (bucket assignment): small cases computed by hand") {
  // Reverse order 4 3 2 1 0: 100 + 40 fit in 500; 4000 is alone (over the cap); 40 + 400 fit.
  CHECK(show(lab3::assign_buckets({400, 40, 4000, 40, 100}, 500)) == "{{4,3},{2},{1,0}}");
  // A bucket may be filled exactly to the cap, not one byte over.
  CHECK(show(lab3::assign_buckets({100, 300, 200}, 500)) == "{{2,1},{0}}");
  CHECK(show(lab3::assign_buckets({100, 300, 200}, 600)) == "{{2,1,0}}");
  CHECK(show(lab3::assign_buckets({100, 300, 200}, 599)) == "{{2,1},{0}}");
  CHECK(show(lab3::assign_buckets({8, 8, 8}, 1)) == "{{2},{1},{0}}");
  CHECK(show(lab3::assign_buckets({}, 1024)) == "{}");
}

TEST_CASE("part 2 (bucket assignment): equals the library's rule on 300 random models") {
  std::mt19937_64 rng(3);
  for (int t = 0; t < 300; ++t) {
    std::vector<size_t> nbytes(1 + rng() % 30);
    for (size_t& n : nbytes) n = 4 * (1 + rng() % (rng() % 2 ? 64 : 4096));
    const size_t cap = 4 * (1 + rng() % 2048);
    const auto want = library_buckets(nbytes, cap);
    const auto got = lab3::assign_buckets(nbytes, cap);
    REQUIRE_MESSAGE(got == want, "model " << t << ", cap " << cap << " bytes: got " << show(got)
                                          << ", the library's rule gives " << show(want));
  }
}

TEST_CASE("part 2 (bucket assignment): equals the Reducer's buckets of SmallNet and resnet20") {
  // DDP's Reducer lays out its buckets at construction with this same rule (both caps equal).
  testing::run_ranks(1, [](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    set_num_threads(1);
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    const std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> nets = {
        {"SmallNet", make_net()}, {"resnet20", models::create("resnet20", 10, 3)}};
    for (const auto& [name, net] : nets) {
      for (size_t cap : {64, 1000, 1024, 16384, 65536, 262144}) {
        distributed::DDPOptions o;
        o.reducer.bucket_cap_mb = o.reducer.first_bucket_cap_mb = cap / (1024.0 * 1024.0);
        distributed::DDP ddp(net, pg, o);
        std::vector<std::vector<size_t>> want;
        for (const auto& b : ddp.reducer().buckets()) want.push_back(b.params);
        const auto got = lab3::assign_buckets(nbytes_of(trainable(*net)), cap);
        EXPECT(got == want, name << ", cap " << cap << " bytes: got " << show(got)
                                 << ", the Reducer has " << show(want));
      }
    }
    testing::store_sync(*st, "finish", rank, w);
    pg.reset();
  });
}

TEST_CASE("part 3 (bucketed all-reduce): equals one process on the global batch - 2 ranks") {
  check_equals_one_process(2, "allreduce_gradients_bucketed", bucketed_at(kCap));
}

TEST_CASE("part 3 (bucketed all-reduce): equals one process on the global batch - 3 ranks") {
  check_equals_one_process(3, "allreduce_gradients_bucketed", bucketed_at(kCap));
  check_equals_one_process(3, "allreduce_gradients_bucketed (one bucket)", bucketed_at(1 << 20));
}

TEST_CASE("part 3 (bucketed all-reduce): one all-reduce per bucket - of the bucket's size") {
  for (size_t cap : {size_t{64}, kCap, size_t{1} << 20}) {
    check_collectives("allreduce_gradients_bucketed", bucketed_at(cap),
                      [cap](const std::vector<Tensor>& ps) { return bucket_allreduces(ps, cap); });
  }
}

TEST_CASE("part 3 (bucketed all-reduce): equals DistributedDataParallel's gradients") {
  testing::run_ranks(2, [](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    set_num_threads(1);
    std::shared_ptr<distributed::ProcessGroup> pg = testing::make_group(rank, w, st);
    const Batch mine = rows_of(global_batch(w), rank);
    distributed::DDPOptions o;
    o.reducer.bucket_cap_mb = o.reducer.first_bucket_cap_mb = kCap / (1024.0 * 1024.0);
    auto ddp_net = make_net();
    distributed::DDP ddp(ddp_net, pg, o);
    backward_on(ddp, mine);  // the Reducer averages during backward
    auto net = make_net();
    backward_on(*net, mine);
    lab3::allreduce_gradients_bucketed(net->parameters(), *pg, kCap);
    const auto want = ddp_net->named_parameters();
    const auto got = net->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].second.requires_grad()) continue;
      const double err = ops::max_rel_error(got[i].second.grad(), want[i].second.grad());
      EXPECT(err < 1e-6, got[i].first << ".grad differs from DDP's by " << err << " (relative)");
    }
    testing::store_sync(*st, "finish", rank, w);  // the peer's last collective is done too
    pg.reset();
  });
}
