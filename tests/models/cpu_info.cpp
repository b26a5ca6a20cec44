// Prints the CPU as ddplab's kernels see it, one line: the model name and the instruction sets
// that decide which kernels run (AVX2, AVX-512, AVX512-BF16, AMX), and the ISA oneDNN
// dispatches to. The parity tests start their logs with it, so that a result is always tied to
// a machine; under an emulator (qemu-x86_64 -cpu ...) it reports the emulated CPU, which
// /proc/cpuinfo would not.
#include <cpuid.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "nn/onednn.h"

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (__get_cpuid_max(leaf & 0x80000000U, nullptr) < leaf) return r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

std::string model_name() {
  char name[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002U + i);
    std::memcpy(name + 16 * i, &r, 16);
  }
  std::string s(name);
  s.erase(0, s.find_first_not_of(' '));
  s.erase(s.find_last_not_of(' ') + 1);
  return s.empty() ? "unknown" : s;
}

const char* yes(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

int main() {
  const Regs leaf1 = cpuid(1), leaf7 = cpuid(7, 0), leaf7_1 = cpuid(7, 1);
  const unsigned family = ((leaf1.a >> 8) & 0xF) + ((leaf1.a >> 20) & 0xFF);
  const unsigned model = ((leaf1.a >> 4) & 0xF) | (((leaf1.a >> 16) & 0xF) << 4);
  std::printf(
      "machine: %s (family %u model %u); avx2 %s, avx512f %s, avx512_bf16 %s, amx_bf16 %s; "
      "oneDNN isa %s\n",
      model_name().c_str(), family, model, yes((leaf7.b >> 5) & 1), yes((leaf7.b >> 16) & 1),
      yes((leaf7_1.a >> 5) & 1), yes((leaf7.d >> 22) & 1),
      ddplab::nn::onednn::cpu_isa_name().c_str());
  return 0;
}
