// The store under attack (docs/store.md "Security model"): a client without the token
// can neither write nor make the server buffer more than a few KiB; idle unauthenticated
// connections and connections beyond the limit are closed; a client that never reads its
// replies is disconnected while the others are served; and running out of file descriptors makes
// the server pause accepting instead of spinning.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/store_protocol.h"
#include "comm/store/store_server.h"
#include "comm/store/store_socket.h"
#include "fork_ranks.h"
#include "tensor/error.h"

using namespace ddplab::distributed;
using ddplab::testing::read_file;
using ddplab::testing::TempDir;
using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

namespace {

const std::string kToken = "0123456789abcdef0123456789abcdef";

net::Fd raw_connect(int port) {
  return net::connect_tcp("127.0.0.1", port, net::Clock::now() + 2s);
}

Bytes hello(const std::string& token) {
  return protocol::Writer()
      .u8(uint8_t(protocol::Op::kHello))
      .u32(protocol::kMagic)
      .u32(protocol::kVersion)
      .str(token)
      .finish();
}

Bytes length_header(uint32_t len) {
  return Bytes{uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
}

// Sends what it can before the server closes the connection (or `budget` passes); the bytes sent.
size_t send_until_closed(int fd, const Bytes& data, std::chrono::milliseconds budget) {
  try {
    if (net::send_all(fd, data.data(), data.size(), net::Clock::now() + budget, "attacker"))
      return data.size();
  } catch (const ddplab::Error&) {
  }
  return 0;
}

// True once the server has closed `fd` (EOF or reset), waiting up to `budget`.
bool closed_by_server(int fd, std::chrono::milliseconds budget) {
  uint8_t buf[4096];
  try {
    while (net::recv_all(fd, buf, 1, net::Clock::now() + budget, "attacker")) {
    }
  } catch (const ddplab::Error&) {
    return true;
  }
  return false;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds budget) {
  auto deadline = std::chrono::steady_clock::now() + budget;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// CPU seconds (user + system) a process has used, from /proc/<pid>/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));  // fields after "(comm)"
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

}  // namespace

TEST_CASE("store attack: a client without the token can neither write nor end the job") {
  TCPStore job("127.0.0.1", 0, /*is_server=*/true, 5s, kToken);
  // What ddprun's agents watch: a failure key written by an intruder would end the job.
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", job.port(), false, 2s, std::string()),
                       doctest::Contains("store token mismatch"), ddplab::Error);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", job.port(), false, 2s, std::string("guess")),
                       doctest::Contains("rejected the connection"), ddplab::Error);
  // A raw client skipping the hello: its set is never executed.
  net::Fd raw = raw_connect(job.port());
  Bytes set = protocol::Writer()
                  .u8(uint8_t(protocol::Op::kSet))
                  .str("ddprun/none/round0/failed")
                  .str("1;1;intruder")
                  .finish();
  send_until_closed(raw.get(), set, 1s);
  CHECK(closed_by_server(raw.get(), 2s));
  CHECK_FALSE(job.check({"ddprun/none/round0/failed"}));
}

TEST_CASE("store attack: huge frames before the hello buffer at most 4 KiB") {
  TCPStoreServer server("127.0.0.1", 0, kToken);
  // A length header of 1 GiB, and one just under the protocol's frame limit, each followed by a
  // stream of data: without the bound the second would make the server hold all of it.
  for (uint32_t len : {uint32_t(1) << 30, uint32_t(protocol::kMaxFrameBytes - 16)}) {
    CAPTURE(len);
    net::Fd fd = raw_connect(server.port());
    Bytes data = length_header(len);
    data.resize(size_t(32) << 20, 'x');  // 32 MiB
    const size_t sent = send_until_closed(fd.get(), data, 3s);
    CHECK(sent < data.size());  // the server closed the connection before taking it all
    CHECK(closed_by_server(fd.get(), 2s));
  }
  // A hello-sized frame trickled in and never finished: held, but within the bound.
  net::Fd slow = raw_connect(server.port());
  Bytes part = length_header(2000);
  part.push_back(uint8_t(protocol::Op::kHello));
  part.resize(1500, 'y');
  REQUIRE(send_until_closed(slow.get(), part, 1s) == part.size());
  CHECK(eventually([&] { return server.stats().buffered_bytes >= 1500; }, 2s));
  const StoreServerStats s = server.stats();
  MESSAGE("peak unauthenticated buffer " << s.peak_unauthenticated_bytes << " bytes");
  CHECK(s.peak_unauthenticated_bytes <= kMaxUnauthenticatedBytes);
  CHECK(s.buffered_bytes <= kMaxUnauthenticatedBytes);
  // The rightful client is served throughout.
  TCPStore client("127.0.0.1", server.port(), false, 5s, kToken);
  client.set("k", std::string("v"));
  CHECK(client.get_string("k") == "v");
}

TEST_CASE("store attack: connection limit and hello timeout") {
  StoreServerOptions o;
  o.max_connections = 8;
  o.hello_timeout = 300ms;
  TCPStoreServer server("127.0.0.1", 0, kToken, o);
  std::vector<net::Fd> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(raw_connect(server.port()));
  REQUIRE(eventually([&] { return server.stats().connections == 8; }, 2s));
  net::Fd extra = raw_connect(server.port());  // the kernel accepts; the server closes it
  CHECK(closed_by_server(extra.get(), 2s));
  CHECK(server.stats().refused_connections >= 1);
  // None of the eight sends a hello: all are closed after the hello timeout.
  for (auto& fd : idle) CHECK(closed_by_server(fd.get(), 3s));
  CHECK(eventually([&] { return server.stats().hello_timeouts == 8; }, 2s));
  CHECK(eventually([&] { return server.stats().connections == 0; }, 2s));
  // An authenticated client stays, idle or not, long after the hello timeout.
  TCPStore client("127.0.0.1", server.port(), false, 5s, kToken);
  client.set("a", std::string("1"));
  std::this_thread::sleep_for(600ms);
  CHECK(client.get_string("a") == "1");
  CHECK(server.stats().hello_timeouts == 8);
}

TEST_CASE("store attack: a client that never reads its replies is closed, others are served") {
  StoreServerOptions o;
  o.send_timeout = 500ms;
  TCPStoreServer server("127.0.0.1", 0, kToken, o);
  TCPStore good("127.0.0.1", server.port(), false, 5s, kToken);
  good.set("big", Bytes(size_t(8) << 20, 7));  // replies large enough to fill the socket buffers
  net::Fd deaf = raw_connect(server.port());
  Bytes flood = hello(kToken);
  Bytes get = protocol::Writer().u8(uint8_t(protocol::Op::kGet)).str("big").finish();
  for (int i = 0; i < 200; ++i) flood.insert(flood.end(), get.begin(), get.end());
  REQUIRE(send_until_closed(deaf.get(), flood, 2s) == flood.size());
  // While the deaf client's reply is stuck, everyone else gets answers at once.
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    good.set("n", std::to_string(i));
    CHECK(good.get_string("n") == std::to_string(i));
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  }
  CHECK(eventually([&] { return server.stats().send_timeouts == 1; }, 5s));
  CHECK(eventually([&] { return server.stats().connections == 1; }, 2s));  // `good` only
  CHECK(server.stats().buffered_bytes < 4096);
  CHECK(good.get("big").size() == size_t(8) << 20);
}

TEST_CASE("store attack: out of file descriptors, the server pauses instead of spinning") {
  TempDir dir;
  const std::string log = (dir.path / "server.err").string();
  int port_pipe[2];
  REQUIRE(::pipe(port_pipe) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The server runs here, with a descriptor limit just above what it has open: it can accept
    // two connections, then accept() fails with EMFILE while more wait in the backlog.
    std::freopen(log.c_str(), "w", stderr);
    TCPStoreServer server("127.0.0.1", 0, kToken);
    // A new descriptor takes the lowest free number, and must be below the limit: so the limit
    // is set two above the lowest free number.
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit lim{};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = rlim_t(lowest_free + 2);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    const int port = server.port();
    [[maybe_unused]] ssize_t n = ::write(port_pipe[1], &port, sizeof port);
    std::this_thread::sleep_for(4s);
    std::fflush(stderr);
    _exit(0);
  }
  ::close(port_pipe[1]);
  int port = 0;
  REQUIRE(::read(port_pipe[0], &port, sizeof port) == ssize_t(sizeof port));
  ::close(port_pipe[0]);
  std::vector<net::Fd> conns;
  for (int i = 0; i < 16; ++i) conns.push_back(raw_connect(port));  // most wait in the backlog
  std::this_thread::sleep_for(500ms);
  const double cpu0 = cpu_seconds(child);
  std::this_thread::sleep_for(2s);
  const double cpu = cpu_seconds(child) - cpu0;
  MESSAGE("server CPU time while out of descriptors: " << cpu << " s in 2 s");
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  const std::string text = read_file(log);
  CHECK_MESSAGE(text.find("cannot accept a connection: Too many open files") != std::string::npos,
                text);
  CHECK_MESSAGE(text.find("ulimit -n") != std::string::npos, text);
  CHECK(cpu < 0.3);  // a spinning loop would use about 2 s
}
