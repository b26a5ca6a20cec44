// Small host values over a process group (see comm/collectives.h).
#include "comm/collectives.h"

#include <algorithm>
#include <cstring>

#include "tensor/ops.h"

namespace ddplab::distributed {

namespace {

// `host` (a CPU tensor) where the group takes tensors, and a result back on the host.
Tensor on_group_device(ProcessGroup& pg, const Tensor& host) {
  return ops::to(host, pg.device());
}
Tensor on_host(const Tensor& t) {
  return ops::to(t, kCPU);
}

}  // namespace

double all_reduce_value(ProcessGroup& pg, double value, ReduceOp op) {
  Tensor t = on_group_device(pg, ops::full({1}, value, kFloat64));
  pg.all_reduce(t, op)->wait();
  return on_host(t).item<double>();
}

int64_t broadcast_value(ProcessGroup& pg, int64_t value, int root) {
  Tensor t = on_group_device(pg, ops::from_vector<int64_t>({value}, {1}, kInt64));
  pg.broadcast(t, root)->wait();
  return on_host(t).item<int64_t>();
}

std::vector<std::vector<int64_t>> all_gather_values(ProcessGroup& pg,
                                                    const std::vector<int64_t>& local) {
  const auto n = static_cast<int64_t>(local.size());
  std::vector<Tensor> all(static_cast<size_t>(pg.size()));
  for (auto& t : all) t = on_group_device(pg, ops::zeros({n}, kInt64));
  pg.all_gather(all, on_group_device(pg, ops::from_vector<int64_t>(local, {n}, kInt64)))->wait();
  std::vector<std::vector<int64_t>> out;
  out.reserve(all.size());
  for (const Tensor& t : all) out.push_back(on_host(t).to_vector<int64_t>());
  return out;
}

std::string broadcast_bytes(ProcessGroup& pg, const std::string& bytes, int root) {
  const bool mine = pg.rank() == root;
  const int64_t n = broadcast_value(pg, mine ? static_cast<int64_t>(bytes.size()) : 0, root);
  if (n == 0) return {};
  Tensor t = ops::zeros({n}, kUInt8);
  if (mine) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  t = on_group_device(pg, t);
  pg.broadcast(t, root)->wait();
  t = on_host(t);
  return {static_cast<const char*>(t.raw_data()), static_cast<size_t>(n)};
}

std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& local) {
  std::vector<int64_t> n;
  for (const auto& v : all_gather_values(pg, {static_cast<int64_t>(local.size())}))
    n.push_back(v.at(0));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(n.begin(), n.end()));
  Tensor mine = ops::zeros({longest}, kUInt8);
  std::copy(local.begin(), local.end(), mine.data_ptr<uint8_t>());
  std::vector<Tensor> all(n.size());
  for (auto& t : all) t = on_group_device(pg, ops::zeros({longest}, kUInt8));
  pg.all_gather(all, on_group_device(pg, mine))->wait();
  std::vector<std::string> out;
  out.reserve(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const Tensor h = on_host(all[r]);
    const auto* p = h.data_ptr<uint8_t>();
    out.emplace_back(p, p + n[r]);
  }
  return out;
}

}  // namespace ddplab::distributed
