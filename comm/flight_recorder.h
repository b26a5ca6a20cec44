// The flight recorder: each process group remembers its last N collectives, so that after a hang
// one can see where every rank was.
//
// A hang in data-parallel training is rarely where the error surfaces: rank 0 times out in
// all_reduce #4017 because rank 3 is still in #4016, or never issued it, or issued a broadcast
// instead. Each rank therefore keeps a ring buffer of its recent collectives (sequence number,
// op, dtype, shape, state and timestamps), filled by ProcessGroup's public collectives and the
// backends' worker (every backend gets it by calling started()/finished()), and dumps it as JSON
// lines when a collective times out. tools/flight_merge.py lines the dumps of all ranks up, seq
// by rank, and marks the first sequence number where the ranks disagree.
//
// A dump of the failing rank alone is half the story: the rank that is behind is often not in a
// collective at all (stuck in data loading, or in a later collective with time left), so it never
// fails and never dumps. As in PyTorch, the first rank that fails therefore asks every rank of
// its group, through the group's store, to dump too (request_flight_dumps); each rank's
// background thread polls for the request about once a second (answer_flight_dump_request).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddplab::distributed {

class Store;

// Default number of collectives kept per group (PyTorch's TORCH_NCCL_TRACE_BUFFER_SIZE plays the
// same role); DDPLAB_FLIGHT_RECORDER_SIZE overrides it, 0 turns the recorder off.
constexpr size_t kDefaultFlightRecorderSize = 256;

class FlightRecorder {
 public:
  // A collective's life: the caller issued it; the backend started running it; it completed,
  // or failed (a timeout or a peer's error).
  enum class State { Issued, Started, Completed, Failed };
  static const char* state_name(State s);

  struct Entry {
    uint64_t seq = 0;
    std::string op;     // "all_reduce", "broadcast", ...
    std::string dtype;  // "float32"; "" when the backend issued it without a tensor
    std::string sizes;  // "[2, 3]"; several tensors: "8 x [2, 3]"
    State state = State::Issued;
    // Microseconds since the Unix epoch (comparable across the ranks of one machine, and across
    // machines as far as their clocks agree); 0 = not reached.
    int64_t issued_us = 0, started_us = 0, finished_us = 0;
    std::string error;
  };

  // `capacity` 0 records nothing.
  FlightRecorder(int rank, int size, std::string backend, std::string group, size_t capacity);

  void issued(uint64_t seq, const std::string& op, const std::string& dtype,
              const std::string& sizes);
  // The backend's hooks. started() for a seq that was never issued (a backend-internal
  // collective) creates the entry with the given op name.
  void started(uint64_t seq, const std::string& op);
  void finished(uint64_t seq, const std::string& error = "");

  // Oldest first.
  std::vector<Entry> entries() const;

  // Writes the entries as JSON lines to flight_<group>_rank<R>.jsonl in DDPLAB_FLIGHT_RECORDER_DIR
  // (else $TMPDIR, else /tmp): a header line (rank, size, group, `reason`, and `peers`: the
  // number of collectives each other rank has started, as far as this rank knows), then one line
  // per entry. Returns the path, or "" when it could not be written or the recorder is off.
  std::string dump(const std::string& reason, const std::map<int, uint64_t>& peers = {}) const;

  int rank() const { return rank_; }

 private:
  Entry* find(uint64_t seq);  // the entry of `seq` if it is still in the buffer; mu_ held
  Entry& push(uint64_t seq);  // a fresh entry, evicting the oldest when full; mu_ held

  int rank_, size_;
  std::string backend_, group_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;  // ring_[next_ % capacity_] is the next slot to overwrite
  uint64_t next_ = 0;        // entries pushed so far
};

// The capacity from DDPLAB_FLIGHT_RECORDER_SIZE, else kDefaultFlightRecorderSize.
size_t flight_recorder_size_from_environment();

// The key, under a process group's store prefix, through which a failing rank asks every rank of
// the group to dump its flight recorder; the value says who asked and why (the first asker wins).
constexpr const char* kFlightDumpRequestKey = "flight/dump_request";
// How often a rank looks for that request.
constexpr std::chrono::milliseconds kFlightDumpPollInterval{1000};

// Publishes the request of `rank` (failed because of `reason`) in `group_store`. Store errors
// are swallowed: the store host may be the rank that died, and the caller is busy failing.
void request_flight_dumps(Store& group_store, int rank, const std::string& reason);

// When `group_store` holds a dump request, dumps `recorder` with a reason naming the asker and
// returns the path; "" when there is no request (or the dump could not be written). Throws what
// the store throws.
std::string answer_flight_dump_request(Store& group_store, const FlightRecorder& recorder);

// The hang report a launcher reads. When DDPLAB_ERROR_FILE is set (ddprun sets it for every
// worker), a rank whose collective failed writes one JSON line there:
//   {"rank": 0, "collective": "all_reduce", "seq": 3, "missing_ranks": [1], "message": "..."}
// so the agent can name, and kill, the rank that hung instead of the one that waited for it.
// Returns false when the variable is unset or the file could not be written.
bool write_hang_report(int rank, const std::string& collective, uint64_t seq,
                       const std::vector<int>& missing_ranks, const std::string& message);

}  // namespace ddplab::distributed
