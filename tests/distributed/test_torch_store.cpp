// TorchTCPStore against a real PyTorch TCPStore server (tests/distributed/torch_store_server.py
// run by the venv's Python, from scripts/pyvenv; skipped where it is missing): every operation,
// values crossing between PyTorch's client and ours, a wait that blocks until another client
// sets the key, timeouts that leave the connection usable; then init_process_group under
// torchrun's environment joining that store for two restart rounds. Without the venv: the error
// file torchrun reads, and the errors for a store that is not there or not PyTorch's.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comm/init_process_group.h"
#include "comm/store/store.h"
#include "comm/store/store_socket.h"
#include "comm/store/torch_tcp_store.h"
#include "fork_ranks.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/skip.h"

using namespace ddplab;
using namespace ddplab::distributed;
using namespace ddplab::testing;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

std::string venv_python() {
  const char* v = std::getenv("DDPLAB_VENV");
  const char* home = std::getenv("HOME");
  std::string venv =
      v != nullptr && *v != '\0' ? v : std::string(home ? home : "") + "/.cache/ddplab/venv";
  return venv + "/bin/python";
}

bool have_torch() {
  return ::access(venv_python().c_str(), X_OK) == 0 && std::getenv("TORCH_STORE_SERVER") != nullptr;
}

// torch_store_server.py in a child process, spoken to through its stdin and stdout: a libuv and
// a legacy PyTorch store. One for the whole test program (torch takes seconds to import).
class TorchServers {
 public:
  TorchServers() {
    ::signal(SIGPIPE, SIG_IGN);  // a dead server must fail the test, not kill it
    int to_child[2], from_child[2];
    REQUIRE(::pipe(to_child) == 0);
    REQUIRE(::pipe(from_child) == 0);
    const std::string python = venv_python();
    const std::string script = std::getenv("TORCH_STORE_SERVER");
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      ::execl(python.c_str(), python.c_str(), script.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = to_child[1];
    out_ = from_child[0];
    const std::string first = line();  // "LIBUV_PORT LEGACY_PORT", after importing torch
    const size_t space = first.find(' ');
    REQUIRE_MESSAGE(
        (space != std::string::npos && first.find_first_not_of("0123456789 ") == std::string::npos),
        first);
    libuv_port = std::stoi(first.substr(0, space));
    legacy_port = std::stoi(first.substr(space + 1));
  }
  ~TorchServers() {
    ::close(in_);  // the script ends at EOF
    ::close(out_);
    int status = 0;
    for (int i = 0; i < 100 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(20ms);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }

  // One command to PyTorch's own client; its one-line answer. Safe in a thread: a server that
  // died or stalled gives an answer that fails the comparison, not an exception.
  std::string ask(const std::string& backend, const std::string& command) {
    const std::string l = backend + " " + command + "\n";
    if (::write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
      return "<torch_store_server.py is gone>";
    return line();
  }

  int libuv_port = 0, legacy_port = 0;

 private:
  std::string line() {
    std::string s;
    char c = 0;
    for (;;) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 60000) != 1) return "<no answer from torch_store_server.py in 60 s>";
      if (::read(out_, &c, 1) != 1) return "<torch_store_server.py exited; see stderr>";
      if (c == '\n') return s;
      s += c;
    }
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
};

TorchServers& torch_servers() {
  static TorchServers servers;
  return servers;
}

// One of the two stores.
struct TorchServer {
  std::string backend;
  int port;
  std::string ask(const std::string& command) const {
    return torch_servers().ask(backend, command);
  }
};
TorchServer libuv_server() {
  return {"libuv", torch_servers().libuv_port};
}
TorchServer legacy_server() {
  return {"legacy", torch_servers().legacy_port};
}

void exercise_every_operation(const TorchServer& server) {
  TorchTCPStore store("127.0.0.1", server.port, 10s);

  // Values cross both ways between PyTorch's client and ours.
  CHECK(store.get_string("from_torch") == "hello from PyTorch");
  store.set("k", std::string("v1"));
  CHECK(server.ask("get k") == "v1");
  store.set("k", bytes(std::string("v2\0bin", 6)));  // overwrite; any bytes
  CHECK(store.get("k") == bytes(std::string("v2\0bin", 6)));
  CHECK(server.ask("set from_python 42") == "ok");
  CHECK(store.get_string("from_python") == "42");

  // add: an integer as decimal text, shared with PyTorch's view of it.
  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -2) == 3);
  CHECK(store.get_string("counter") == "3");
  CHECK(server.ask("get counter") == "3");
  CHECK(store.add("from_python", 1) == 43);

  // compare_set: set only when the value equals `expected`; returns the value after.
  CHECK(text(store.compare_set("cas", {}, bytes("a"))) == "a");
  CHECK(text(store.compare_set("cas", bytes("b"), bytes("c"))) == "a");
  CHECK(text(store.compare_set("cas", bytes("a"), bytes("c"))) == "c");
  CHECK(store.get_string("cas") == "c");

  // check, delete_key, num_keys.
  CHECK(store.check({"k", "counter"}));
  CHECK_FALSE(store.check({"k", "absent"}));
  const int64_t n = store.num_keys();
  CHECK(std::to_string(n) == server.ask("num_keys"));
  CHECK(store.delete_key("k"));
  CHECK_FALSE(store.delete_key("k"));
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.num_keys() == n - 1);

  // A wait that blocks until another client of ours sets the key...
  {
    const auto start = std::chrono::steady_clock::now();
    std::thread setter([&] {
      TorchTCPStore other("127.0.0.1", server.port, 10s);
      std::this_thread::sleep_for(300ms);
      other.set("late", std::string("x"));
    });
    store.wait({"late", "counter"}, 10s);
    setter.join();
    CHECK(std::chrono::steady_clock::now() - start >= 250ms);
  }
  // ...and a get that blocks until PyTorch's own client sets it.
  {
    const auto start = std::chrono::steady_clock::now();
    std::thread setter([&] {
      std::this_thread::sleep_for(300ms);
      server.ask("set late2 from-python");
    });
    CHECK(store.get_string("late2") == "from-python");
    setter.join();
    CHECK(std::chrono::steady_clock::now() - start >= 250ms);
  }

  // A wait that times out names the keys, and is withdrawn on the server: the connection stays
  // in step even when the key arrives later (no stray reply to the next query).
  CHECK_THROWS_WITH_AS(store.wait({"never"}, 200ms),
                       doctest::Contains("timed out after 200 ms waiting for key 'never'"), Error);
  store.set("after_timeout", std::string("fine"));
  CHECK(server.ask("set never now") == "ok");
  CHECK(store.get_string("after_timeout") == "fine");
  CHECK(store.get_string("never") == "now");
  store.set_timeout(200ms);
  CHECK_THROWS_WITH_AS(store.get("absent"), doctest::Contains("'absent'"), Error);
  CHECK(store.add("counter", 1) == 4);

  // PyTorch's bounds are refused before sending, with the reason.
  CHECK_THROWS_WITH_AS(store.set(std::string(9000, 'k'), std::string("v")),
                       doctest::Contains("key of 9000 bytes"), Error);
}

}  // namespace

TEST_CASE("TorchTCPStore: every operation against PyTorch's TCPStore server (libuv and legacy)") {
  DDP_SKIP_IF(!have_torch(), "no PyTorch venv (scripts/pyvenv): " + venv_python());
  SUBCASE("libuv backend (torchrun's agent store)") {
    exercise_every_operation(libuv_server());
  }
  SUBCASE("legacy backend (use_libuv=False)") {
    exercise_every_operation(legacy_server());
  }
}

TEST_CASE("init_process_group joins torchrun's agent store, in one key space per restart round") {
  DDP_SKIP_IF(!have_torch(), "no PyTorch venv (scripts/pyvenv): " + venv_python());
  const TorchServer server = libuv_server();
  EnvGuard guard(kLaunchVars);
  // Two rounds, as after a torchrun restart: the second must not read the first one's keys
  // (the Gloo addresses of processes that are gone).
  for (int round = 0; round < 2; ++round) {
    run_ranks(2, [&](int rank, int world, const std::shared_ptr<TCPStore>& sync) {
      set_torchrun_env(rank, world, server.port);  // rank 0 would host here without the flag
      setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
      setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(round).c_str(), 1);
      InitOptions o;
      o.timeout = 20s;
      auto pg = init_process_group(o);
      Tensor t = ops::full({3}, rank + 1);
      pg->all_reduce(t, ReduceOp::Sum)->wait();
      for (double v : t.to_vector<double>()) EXPECT(v == 3, "sum over 2 ranks");
      store_sync(*sync, "done", rank, world);
    });
  }
  TorchTCPStore agent("127.0.0.1", server.port, 10s);
  for (const char* round : {"/worker/attempt_0/", "/worker/attempt_1/"})
    CHECK(agent.check({std::string(round) + "default_pg/init/world_size/0"}));
  CHECK_FALSE(agent.check({"default_pg/init/world_size/0"}));  // nothing outside the prefix
}

TEST_CASE("record_error_for_launcher writes the error file torchrun reads") {
  EnvGuard guard({"TORCHELASTIC_ERROR_FILE"});
  CHECK_FALSE(record_error_for_launcher("no launcher asked"));
  TempDir dir;
  const std::string path = (dir.path / "error.json").string();
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  const auto before = std::time(nullptr);
  CHECK(record_error_for_launcher("rank 1: \"quoted\"\nsecond line"));
  // The shape of PyTorch's ErrorHandler.record_exception, which torchrun's ProcessFailure reads.
  const auto j = nlohmann::json::parse(read_file(path));
  CHECK(j["message"]["message"] == "rank 1: \"quoted\"\nsecond line");
  const long long stamp = std::stoll(j["message"]["extraInfo"]["timestamp"].get<std::string>());
  CHECK(stamp >= before);
  CHECK(stamp <= std::time(nullptr));
  // Bytes that are not UTF-8 (a file name, say) still give a file JSON can read.
  CHECK(record_error_for_launcher("cannot open '\xff.bin'"));
  CHECK(nlohmann::json::parse(read_file(path))["message"]["message"] ==
        "cannot open '\xef\xbf\xbd.bin'");
  // An unwritable place: false, no exception (the program is already failing).
  setenv("TORCHELASTIC_ERROR_FILE", (dir.path / "missing" / "error.json").c_str(), 1);
  CHECK_FALSE(record_error_for_launcher("x"));
}

TEST_CASE("TorchTCPStore: nothing listening, or not a PyTorch TCPStore, is a clear error") {
  const std::string where = "127.0.0.1:" + std::to_string(net::pick_free_port("127.0.0.1"));
  const int port = std::stoi(where.substr(10));
  CHECK_THROWS_WITH_AS(TorchTCPStore("127.0.0.1", port, 300ms),
                       doctest::Contains(("could not connect to " + where).c_str()), Error);
  // ddplab's own store server drops a connection whose first bytes are not its hello.
  TCPStore ours("127.0.0.1", 0, /*is_server=*/true, 10s);
  CHECK_THROWS_WITH_AS(TorchTCPStore("127.0.0.1", ours.port(), 500ms),
                       doctest::Contains("PyTorch's TCPStore"), Error);
  CHECK_THROWS_WITH_AS(TorchTCPStore("127.0.0.1", 0, 1s), doctest::Contains("not a TCP port"),
                       Error);
}
