// Robustness of the TCPStore server: thousands of random, truncated and oversized frames (loopback
// only, bounded in count and time) must each close only their own connection, and a stalled
// client must not block anyone; afterwards a normal client is still served correctly.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/store_protocol.h"
#include "comm/store/store_socket.h"
#include "tensor/error.h"

using namespace ddplab::distributed;
using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

namespace {

Bytes hello_frame() {
  return protocol::Writer()
      .u8(uint8_t(protocol::Op::kHello))
      .u32(protocol::kMagic)
      .u32(protocol::kVersion)
      .str("")
      .finish();
}

Bytes random_bytes(std::mt19937& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// One hostile conversation: sends what `kind` says, reads whatever comes back briefly, closes.
void attack(int port, int kind, std::mt19937& rng) {
  auto deadline = net::Clock::now() + 2s;
  net::Fd fd = net::connect_tcp("127.0.0.1", port, deadline);
  Bytes msg;
  auto append = [&msg](const Bytes& b) { msg.insert(msg.end(), b.begin(), b.end()); };
  auto header = [](uint32_t len) {
    return Bytes{uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
  };
  switch (kind) {
    case 0:  // pure noise
      append(random_bytes(rng, 1 + rng() % 300));
      break;
    case 1: {  // valid hello, then a valid header with a garbage payload
      append(hello_frame());
      uint32_t len = 1 + rng() % 64;
      append(header(len));
      append(random_bytes(rng, len));
      break;
    }
    case 2:  // oversized length prefix, with or without a hello first
      if (rng() % 2) append(hello_frame());
      append(header(uint32_t(protocol::kMaxFrameBytes + 1 + rng() % 1000)));
      append(random_bytes(rng, 16));
      break;
    case 3: {  // half a frame, then close
      append(hello_frame());
      Bytes set = protocol::Writer()
                      .u8(uint8_t(protocol::Op::kSet))
                      .str("half")
                      .bytes(random_bytes(rng, 100))
                      .finish();
      set.resize(rng() % set.size());
      append(set);
      break;
    }
    case 4: {  // unknown opcode / request before hello / key length beyond the limit
      if (rng() % 2) append(hello_frame());
      int v = rng() % 3;
      if (v == 0) append(protocol::Writer().u8(uint8_t(100 + rng() % 100)).finish());
      if (v == 1) append(protocol::Writer().u8(uint8_t(protocol::Op::kNumKeys)).finish());
      if (v == 2) append(protocol::Writer().u8(uint8_t(protocol::Op::kGet)).u32(1 << 20).finish());
      break;
    }
    default: {  // a valid request with mutated bytes
      append(hello_frame());
      Bytes f = protocol::Writer()
                    .u8(uint8_t(protocol::Op::kCompareSet))
                    .str("fuzz")
                    .str("a")
                    .str("b")
                    .finish();
      for (int i = 0; i < 3; ++i) f[4 + rng() % (f.size() - 4)] = uint8_t(rng());
      append(f);
      break;
    }
  }
  try {
    if (!net::send_all(fd.get(), msg.data(), msg.size(), deadline, "fuzz")) return;
    uint8_t buf[256];
    // Read for a moment: the server either replies, closes, or waits for more bytes.
    net::recv_all(fd.get(), buf, sizeof(buf), net::Clock::now() + 2ms, "fuzz");
  } catch (const ddplab::Error&) {
    // The server closed the connection: the expected outcome for most frames.
  }
}

}  // namespace

TEST_CASE("TCPStore server survives malformed frames and keeps serving") {
  TCPStore store("127.0.0.1", 0, /*is_server=*/true, 5s);
  store.set("before", std::string("ok"));

  // A client that sends half a frame and stalls for the whole test must not block others.
  net::Fd stalled = net::connect_tcp("127.0.0.1", store.port(), net::Clock::now() + 2s);
  Bytes hello = hello_frame();
  Bytes partial = protocol::Writer().u8(uint8_t(protocol::Op::kSet)).str("k").str("v").finish();
  partial.resize(partial.size() / 2);
  hello.insert(hello.end(), partial.begin(), partial.end());
  REQUIRE(net::send_all(stalled.get(), hello.data(), hello.size(), net::Clock::now() + 2s, "s"));

  std::mt19937 rng(1234);
  auto t0 = std::chrono::steady_clock::now();
  int sent = 0;
  for (; sent < 3000 && std::chrono::steady_clock::now() - t0 < 20s; ++sent) {
    attack(store.port(), sent % 6, rng);
    if (sent % 500 == 0) CHECK(store.get_string("before") == "ok");  // served mid-attack
  }
  MESSAGE("sent " << sent << " hostile conversations");
  CHECK(sent >= 1000);

  TCPStore client("127.0.0.1", store.port(), false, 5s);
  CHECK(client.get_string("before") == "ok");
  client.set("after", std::string("fine"));
  CHECK(store.get_string("after") == "fine");
  CHECK(client.add("counter", 3) == 3);
  CHECK_FALSE(client.check({"half"}));  // no truncated set was applied
}
