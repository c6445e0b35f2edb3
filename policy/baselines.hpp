// Baseline caches from the literature, for the simulator (policy/simulator.hpp): ARC and S3-FIFO,
// byte-weighted as the rest of the simulator (capacities, queue shares and ghosts are in bytes).
//
// Why here and not as EvictionPolicy classes: both decide where a chunk enters (T1 or T2, the small
// or the main queue) from ghosts of chunks they evicted, and ARC's choice of victim depends on the
// chunk coming in, so they own their whole cache (what is resident, and when to evict) instead of
// answering pick_victim for a tier. Pure, single-threaded, no I/O.
//
// Shared contract (BaselineCache):
//  - access(key, bytes): a read. true on a hit; on a miss the chunk is brought in, evicting until it
//    fits. A chunk larger than the capacity is never cached (counted in bypassed()).
//  - insert(key, bytes): a chunk written by a commit enters the cache as a miss would, without being
//    a request; a resident chunk inserted again is left as it is.
//  - One key names one size: the caller never passes a key with two different sizes.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>

namespace cairn {

class BaselineCache {
 public:
  virtual ~BaselineCache() = default;
  virtual bool access(uint64_t key, uint64_t bytes) = 0;
  virtual void insert(uint64_t key, uint64_t bytes) = 0;
  virtual bool resident(uint64_t key) const = 0;
  virtual uint64_t used_bytes() const = 0;
  uint64_t evictions() const { return evictions_; }
  uint64_t bypassed() const { return bypassed_; }

 protected:
  uint64_t evictions_ = 0;
  uint64_t bypassed_ = 0;
};

// A list in recency or FIFO order (front = newest) with an index and a byte total.
class ByteList {
 public:
  struct Item {
    uint64_t key;
    uint64_t bytes;
    uint8_t freq;  // S3-FIFO's 2-bit counter; unused by ARC
  };
  bool contains(uint64_t key) const { return index_.count(key) != 0; }
  void push_front(Item item);
  Item pop_back();  // REQUIRES: !empty()
  // Removes key; returns its item. REQUIRES: contains(key).
  Item erase(uint64_t key);
  Item& at(uint64_t key) { return *index_.at(key); }
  bool empty() const { return items_.empty(); }
  uint64_t bytes() const { return bytes_; }

 private:
  std::list<Item> items_;
  std::unordered_map<uint64_t, std::list<Item>::iterator> index_;
  uint64_t bytes_ = 0;
};

// ARC (Megiddo & Modha, FAST'03) in bytes. T1 holds chunks read once recently, T2 chunks read at
// least twice; B1 and B2 are their ghosts (keys of chunks evicted from them). p is the target bytes
// of T1: a miss found in B1 raises it by max(1, B2/B1) times the chunk's bytes, one found in B2
// lowers it by max(1, B1/B2) times them (each ratio in bytes). Room is made by REPLACE: the LRU
// chunk of T1 goes to B1 while T1 holds more than p bytes (or exactly p and the chunk coming in was
// found in B2), else the LRU chunk of T2 goes to B2. Ghosts are bounded as in the paper, in bytes:
// T1 + B1 <= capacity and T1 + T2 + B1 + B2 <= 2 * capacity (the oldest ghost of B1, then of B2,
// is forgotten first). With equal sizes this is the paper's algorithm exactly.
class ArcCache final : public BaselineCache {
 public:
  explicit ArcCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  bool access(uint64_t key, uint64_t bytes) override;
  void insert(uint64_t key, uint64_t bytes) override;
  bool resident(uint64_t key) const override { return t1_.contains(key) || t2_.contains(key); }
  uint64_t used_bytes() const override { return t1_.bytes() + t2_.bytes(); }
  uint64_t target_t1_bytes() const { return p_; }  // p, for tests

 private:
  void miss(uint64_t key, uint64_t bytes);
  void replace(uint64_t incoming_bytes, bool incoming_in_b2);
  void trim_ghosts();

  uint64_t capacity_;
  uint64_t p_ = 0;
  ByteList t1_, t2_, b1_, b2_;
};

// S3-FIFO (Yang et al., SOSP'23) in bytes: a small FIFO S (a tenth of the capacity), a main FIFO M
// (the rest) and a ghost FIFO G of keys (as many bytes of keys as M's share). A hit raises the
// chunk's 2-bit frequency (at most 3). A miss enters M when its key is in G, else S. To make room:
// when M holds more than its share or S is empty, M's tail goes if its frequency is 0, else it is
// reinserted at M's head with frequency - 1 (and the next tail is tried); otherwise S's tail moves
// to M with frequency 0 if it was hit while in S, else it is evicted and its key enters G (and the
// next tail is tried until one chunk left the cache). A chunk larger than S's share still enters S
// (S then holds more than its share until it leaves), so that no size is refused that fits.
class S3FifoCache final : public BaselineCache {
 public:
  explicit S3FifoCache(uint64_t capacity_bytes);
  bool access(uint64_t key, uint64_t bytes) override;
  void insert(uint64_t key, uint64_t bytes) override;
  bool resident(uint64_t key) const override { return small_.contains(key) || main_.contains(key); }
  uint64_t used_bytes() const override { return small_.bytes() + main_.bytes(); }
  bool in_small(uint64_t key) const { return small_.contains(key); }  // for tests
  bool in_main(uint64_t key) const { return main_.contains(key); }
  bool in_ghost(uint64_t key) const { return ghost_.contains(key); }

 private:
  void miss(uint64_t key, uint64_t bytes);
  void evict_one();
  void evict_small();
  void evict_main();

  uint64_t capacity_;
  uint64_t main_share_;  // capacity - small share
  ByteList small_, main_, ghost_;
};

}  // namespace cairn
