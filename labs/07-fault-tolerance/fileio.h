// Lab 7: the only file operations the checkpoint code may use. Thin wrappers over POSIX (open,
// write, fsync, close, rename), each throwing ddplab::Error naming the path and the system's
// reason. They also keep a log of what was done, in order, which is how the grader checks the
// write-to-a-temporary-file protocol, and they can simulate a crash in the middle of a write.
#pragma once

#include <string>
#include <vector>

namespace lab7::io {

// Creates (or truncates) `path` for writing; returns its file descriptor.
int create(const std::string& path);
// Writes all of `bytes` (write() may write less than asked: it loops until done).
void write_all(int fd, const std::string& bytes);
// Makes the file's bytes durable: after fsync returns, a power cut cannot lose them.
void fsync(int fd);
void close(int fd);
// Renames `from` to `to`, replacing `to` if it exists. Within one file system this is atomic: a
// reader sees the old `to` or the new one, never a mix.
void rename(const std::string& from, const std::string& to);
// fsyncs a folder, so that a rename (or creation) of a file in it survives a power cut.
void fsync_dir(const std::string& dir);
// Removes a file; a missing file is not an error (cleanup after a failed write).
void remove(const std::string& path);

// For the grader. Each call above appends one line: "create P", "write P <bytes>", "fsync P",
// "close P", "rename A B", "fsync_dir D", "remove P".
const std::vector<std::string>& log();
void clear_log();
// Test hook: the next write_all writes only the first half of its bytes, then this process kills
// itself with SIGKILL, as a crash (or `kill -9`) in the middle of writing a checkpoint would.
void crash_halfway_through_next_write();
// Test hook: every write_all first sleeps this long (a slow disk, or a big checkpoint).
void delay_writes(int milliseconds);

}  // namespace lab7::io
