// Small host values over a process group: the few numbers and strings that ranks must agree on
// (a step to resume from, a flag, a rank, an optimizer shard's description), as opposed to the
// tensors of training. Each call is a collective (every rank of the group makes it, in the same
// order) and waits for it.
//
// The one thing they share is where the value travels: a ProcessGroup takes tensors on its
// device() only, the CPU for Gloo but this rank's GPU for NCCL, so the value is put into a
// one-element (or byte) tensor on that device and read back on the host. Doing it in one place
// keeps every caller right on both backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace ddplab::distributed {

// Every rank's `value` reduced with `op` (in double: exact for counts, flags and ranks).
double all_reduce_value(ProcessGroup& pg, double value, ReduceOp op = ReduceOp::Sum);
// Rank `root`'s `value` on every rank (the others' are ignored).
int64_t broadcast_value(ProcessGroup& pg, int64_t value, int root = 0);
// Every rank's `local` (the same count on every rank), indexed by rank.
std::vector<std::vector<int64_t>> all_gather_values(ProcessGroup& pg,
                                                    const std::vector<int64_t>& local);
// Rank `root`'s `bytes` on every rank: their length, then the bytes.
std::string broadcast_bytes(ProcessGroup& pg, const std::string& bytes, int root = 0);
// Every rank's `local`, indexed by rank: the lengths, then the bytes padded to the longest.
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& local);

}  // namespace ddplab::distributed
