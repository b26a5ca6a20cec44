// TCPStore and PrefixStore behaviour: the operations, blocking get/wait, atomic add under
// contention, timeouts that name the key, the shared token, and several client processes.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store.h"
#include "tensor/error.h"

using namespace ddplab::distributed;
using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

namespace {
Bytes B(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
}  // namespace

TEST_CASE("TCPStore: set/get/add/compare_set/check/delete/num_keys") {
  TCPStore server("127.0.0.1", 0, /*is_server=*/true, 10s);
  CHECK(server.port() > 0);
  TCPStore client("127.0.0.1", server.port(), false, 10s);

  server.set("a", std::string("hello"));
  CHECK(client.get_string("a") == "hello");
  client.set("bin", Bytes{0, 1, 2, 255});
  CHECK(server.get("bin") == Bytes{0, 1, 2, 255});
  client.set("empty", Bytes{});
  CHECK(server.get("empty").empty());

  CHECK(client.add("n", 5) == 5);
  CHECK(server.add("n", -2) == 3);
  CHECK(client.get_string("n") == "3");  // counters are decimal text, as in PyTorch

  // compare_set: missing key + empty expected sets; a mismatch returns the current value.
  CHECK(client.compare_set("cs", {}, B("x")) == B("x"));
  CHECK(client.compare_set("cs", B("y"), B("z")) == B("x"));
  CHECK(client.compare_set("cs", B("x"), B("z")) == B("z"));
  CHECK(client.compare_set("missing", B("e"), B("d")) == B("e"));
  CHECK_FALSE(client.check({"missing"}));

  CHECK(client.check({"a", "n"}));
  CHECK_FALSE(client.check({"a", "nope"}));
  int64_t before = client.num_keys();
  CHECK(client.delete_key("a"));
  CHECK_FALSE(client.delete_key("a"));
  CHECK(client.num_keys() == before - 1);
  CHECK_THROWS_AS(client.add("bin", 1), ddplab::Error);  // not an integer
  CHECK(client.get_string("n") == "3");                  // the connection still works
}

TEST_CASE("TCPStore: get and wait block until another client sets the keys") {
  TCPStore server("127.0.0.1", 0, true, 10s);
  std::thread setter([port = server.port()] {
    TCPStore c("127.0.0.1", port, false, 10s);
    std::this_thread::sleep_for(100ms);
    c.set("k1", std::string("v1"));
    std::this_thread::sleep_for(50ms);
    c.set("k2", std::string("v2"));
  });
  TCPStore waiter("127.0.0.1", server.port(), false, 10s);
  CHECK(waiter.get_string("k1") == "v1");
  waiter.wait({"k1", "k2"});
  CHECK(waiter.get_string("k2") == "v2");
  setter.join();
}

TEST_CASE("TCPStore: get on a missing key times out naming the key and host:port") {
  TCPStore server("127.0.0.1", 0, true, 10s);
  TCPStore client("127.0.0.1", server.port(), false, 200ms);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    client.get("never_set");
  } catch (const ddplab::Error& e) {
    msg = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(msg.find("never_set") != std::string::npos);
  CHECK(msg.find("127.0.0.1:" + std::to_string(server.port())) != std::string::npos);
  CHECK_THROWS_WITH_AS(client.wait({"w1", "w2"}, 100ms), doctest::Contains("'w2'"), ddplab::Error);
  // The client reconnects after a timeout and keeps working.
  server.set("late", std::string("ok"));
  CHECK(client.get_string("late") == "ok");
}

TEST_CASE("TCPStore: connecting to a port without a server fails at the deadline") {
  int port = net::pick_free_port("127.0.0.1");
  auto t0 = std::chrono::steady_clock::now();
  std::string where = "127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", port, false, 300ms), doctest::Contains(where.c_str()),
                       ddplab::Error);
  CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);
}

TEST_CASE("TCPStore: add is atomic under contention") {
  TCPStore server("127.0.0.1", 0, true, 20s);
  constexpr int kThreads = 8, kIncrements = 200;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([port = server.port()] {
      TCPStore c("127.0.0.1", port, false, 20s);
      for (int i = 0; i < kIncrements; ++i) c.add("counter", 1);
    });
  for (auto& t : ts) t.join();
  CHECK(server.add("counter", 0) == kThreads * kIncrements);
}

TEST_CASE("TCPStore: one client object is safe to share between threads") {
  TCPStore server("127.0.0.1", 0, true, 20s);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&server] {
      for (int i = 0; i < 100; ++i) server.add("shared", 1);
    });
  for (auto& t : ts) t.join();
  CHECK(server.add("shared", 0) == 400);
}

TEST_CASE("TCPStore: several processes meet through the store") {
  TCPStore server("127.0.0.1", 0, true, 20s);
  constexpr int kProcs = 4;
  std::vector<pid_t> pids;
  for (int r = 0; r < kProcs; ++r) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      try {
        TCPStore c("127.0.0.1", server.port(), false, 10s);
        c.set("rank" + std::to_string(r), std::to_string(r * 10));
        c.add("arrived", 1);
        std::vector<std::string> all;
        for (int i = 0; i < kProcs; ++i) all.push_back("rank" + std::to_string(i));
        c.wait(all);
        // compare_set elects exactly one leader.
        Bytes won = c.compare_set("leader", {}, B(std::to_string(r)));
        if (c.get_string("rank" + std::to_string((r + 1) % kProcs)) !=
            std::to_string(((r + 1) % kProcs) * 10))
          code = 2;
        if (won.empty()) code = 3;
      } catch (...) {
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(server.add("arrived", 0) == kProcs);
  std::string leader = server.get_string("leader");
  CHECK(leader.size() == 1);
}

TEST_CASE("TCPStore: a client with the wrong token is rejected") {
  setenv("DDPLAB_STORE_TOKEN", "secret", 1);
  TCPStore server("127.0.0.1", 0, true, 5s);
  TCPStore good("127.0.0.1", server.port(), false, 5s);
  good.set("x", std::string("1"));
  setenv("DDPLAB_STORE_TOKEN", "wrong", 1);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", server.port(), false, 2s), doctest::Contains("token"),
                       ddplab::Error);
  unsetenv("DDPLAB_STORE_TOKEN");
  CHECK_THROWS_AS(TCPStore("127.0.0.1", server.port(), false, 2s), ddplab::Error);
  CHECK(good.get_string("x") == "1");
}

TEST_CASE("TCPStore: oversized keys and values are refused on the client side") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  CHECK_THROWS_AS(server.set(std::string(5000, 'k'), std::string("v")), ddplab::Error);
  CHECK_THROWS_AS(server.set("k", Bytes((size_t{64} << 20) + 1)), ddplab::Error);
  Bytes big(size_t{8} << 20, 7);  // a large legal value round-trips
  server.set("big", big);
  CHECK(server.get("big") == big);
}

TEST_CASE("PrefixStore: namespaces keys over a shared base") {
  auto base = std::make_shared<TCPStore>("127.0.0.1", 0, true, 5s);
  PrefixStore pg0("pg0", base), pg1("pg1", base);
  pg0.set("k", std::string("zero"));
  pg1.set("k", std::string("one"));
  CHECK(pg0.get_string("k") == "zero");
  CHECK(pg1.get_string("k") == "one");
  CHECK(base->get_string("pg0/k") == "zero");
  CHECK(pg0.add("c", 2) == 2);
  CHECK(pg1.add("c", 1) == 1);
  CHECK(pg0.check({"k", "c"}));
  CHECK_FALSE(pg0.check({"other"}));
  pg0.wait({"k"}, 1s);
  CHECK(pg0.compare_set("cs", {}, B("v")) == B("v"));
  CHECK(pg0.delete_key("k"));
  CHECK_FALSE(base->check({"pg0/k"}));
  CHECK(pg1.num_keys() == base->num_keys());
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", base));
  nested.set("x", std::string("1"));
  CHECK(base->get_string("outer/inner/x") == "1");
}

TEST_CASE("TCPStore: binds only the address asked for") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  // Another loopback address (127.0.0.2 is loopback on Linux) must not reach a 127.0.0.1 bind.
  CHECK_THROWS_AS(TCPStore("127.0.0.2", server.port(), false, 200ms), ddplab::Error);
  TCPStore any("0.0.0.0", 0, true, 5s);  // explicit all-interfaces bind is allowed
  TCPStore via_loopback("127.0.0.1", any.port(), false, 5s);
  via_loopback.set("k", std::string("v"));
  CHECK(any.get_string("k") == "v");
}
