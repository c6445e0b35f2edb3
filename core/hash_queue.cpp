#include "core/hash_queue.hpp"

#include <algorithm>
#include <system_error>

namespace cairn {

void HashQueue::add(const void* data, uint64_t size, uint64_t chunk_size, ChunkHash* out, unsigned max_threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (max_threads == 0) max_threads = std::clamp(std::thread::hardware_concurrency(), 2u, 5u) - 1;
  std::unique_lock lock(mu_);
  for (uint64_t off = 0, i = 0; off < size; off += chunk_size, ++i)
    jobs_.push_back(Job{p + off, std::min(chunk_size, size - off), out + i});
  // One thread to start with; another while more than two pieces per thread wait.
  if (threads_.size() < max_threads && (threads_.empty() || jobs_.size() > 2 * threads_.size())) {
    try {
      threads_.emplace_back([this] { run(); });
    } catch (const std::system_error&) {
      if (threads_.empty()) {  // no thread at all: hash here, now
        lock.unlock();
        finish();
        return;
      }
    }
  }
  lock.unlock();
  work_.notify_one();
}

void HashQueue::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    hash_next(lock);
  }
}

void HashQueue::hash_next(std::unique_lock<std::mutex>& lock) {
  const Job j = jobs_.front();
  jobs_.pop_front();
  ++busy_;
  lock.unlock();
  *j.out = hash_bytes(j.data, j.size);
  lock.lock();
  if (--busy_ == 0) idle_.notify_all();
}

void HashQueue::finish() {
  std::unique_lock lock(mu_);
  while (!jobs_.empty()) hash_next(lock);
  stop(lock);
}

void HashQueue::cancel() {
  std::unique_lock lock(mu_);
  jobs_.clear();
  stop(lock);
}

void HashQueue::stop(std::unique_lock<std::mutex>& lock) {
  idle_.wait(lock, [&] { return busy_ == 0; });
  stopping_ = true;
  std::vector<std::thread> threads = std::move(threads_);
  threads_.clear();
  lock.unlock();
  work_.notify_all();
  for (auto& t : threads) t.join();
  lock.lock();
  stopping_ = false;
}

}  // namespace cairn
