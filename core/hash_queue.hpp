// HashQueue: hashes chunks on threads of its own while the caller goes on writing, and has the
// caller help with what is left when it must wait (ModelWriter::seal_tensor).
//
// At most `max_threads` hashing threads, started as work arrives and a backlog builds; never more
// than one fewer than the cores unless asked, so the caller that writes the next tensor keeps a core
// of its own (on two cores, a hashing thread per sealed tensor took turns with the caller's memcpy
// and slowed it by half).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/hash.hpp"

namespace cairn {

class HashQueue {
 public:
  HashQueue() = default;
  ~HashQueue() { cancel(); }
  HashQueue(const HashQueue&) = delete;
  HashQueue& operator=(const HashQueue&) = delete;

  // Queues data[0..size) in pieces of chunk_size; the hash of piece i lands in out[i]. data and out
  // stay valid until finish() or cancel() returns. max_threads: 0 for one fewer than the cores (at
  // least one, at most 4). With no thread to be had, hashes on the caller's thread before returning.
  void add(const void* data, uint64_t size, uint64_t chunk_size, ChunkHash* out, unsigned max_threads = 0);
  // Hashes what is still queued on the calling thread as well, waits for the pieces in progress,
  // and ends the threads. Every out[] is written when it returns.
  void finish();
  // Drops what was not started, waits for the pieces in progress, and ends the threads: no thread
  // reads any data[] after it returns.
  void cancel();

 private:
  struct Job {
    const unsigned char* data;
    uint64_t size;
    ChunkHash* out;
  };
  void run();
  // Takes the first queued piece and hashes it, lock held on entry and on return (not meanwhile).
  void hash_next(std::unique_lock<std::mutex>& lock);
  // Waits (holding lock) until no piece is in progress, then ends the threads.
  void stop(std::unique_lock<std::mutex>& lock);
  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<Job> jobs_;
  unsigned busy_ = 0;  // pieces being hashed now, by any thread
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace cairn
