#include "policy/baselines.hpp"

#include <algorithm>

namespace cairn {

// ---- ByteList ----

void ByteList::push_front(Item item) {
  items_.push_front(item);
  index_[item.key] = items_.begin();
  bytes_ += item.bytes;
}

ByteList::Item ByteList::pop_back() {
  Item item = items_.back();
  index_.erase(item.key);
  items_.pop_back();
  bytes_ -= item.bytes;
  return item;
}

ByteList::Item ByteList::erase(uint64_t key) {
  auto it = index_.at(key);
  Item item = *it;
  items_.erase(it);
  index_.erase(key);
  bytes_ -= item.bytes;
  return item;
}

// ---- ArcCache ----

bool ArcCache::access(uint64_t key, uint64_t bytes) {
  if (t1_.contains(key)) {
    t2_.push_front(t1_.erase(key));
    return true;
  }
  if (t2_.contains(key)) {
    t2_.push_front(t2_.erase(key));
    return true;
  }
  miss(key, bytes);
  return false;
}

void ArcCache::insert(uint64_t key, uint64_t bytes) {
  if (!resident(key)) miss(key, bytes);
}

void ArcCache::miss(uint64_t key, uint64_t bytes) {
  if (bytes > capacity_) {
    ++bypassed_;
    return;
  }
  const auto ratio = [](uint64_t num, uint64_t den) {
    return den == 0 ? 1.0 : std::max(1.0, static_cast<double>(num) / static_cast<double>(den));
  };
  if (b1_.contains(key)) {  // case II: T1 was too small
    const double delta = ratio(b2_.bytes(), b1_.bytes()) * static_cast<double>(bytes);
    p_ = static_cast<uint64_t>(std::min(static_cast<double>(capacity_), static_cast<double>(p_) + delta));
    b1_.erase(key);
    replace(bytes, false);
    t2_.push_front({key, bytes, 0});
    trim_ghosts();
    return;
  }
  if (b2_.contains(key)) {  // case III: T2 was too small
    const double delta = ratio(b1_.bytes(), b2_.bytes()) * static_cast<double>(bytes);
    p_ = static_cast<uint64_t>(std::max(0.0, static_cast<double>(p_) - delta));
    b2_.erase(key);
    replace(bytes, true);
    t2_.push_front({key, bytes, 0});
    trim_ghosts();
    return;
  }
  replace(bytes, false);  // case IV: new to the cache and its ghosts
  t1_.push_front({key, bytes, 0});
  trim_ghosts();
}

void ArcCache::replace(uint64_t incoming_bytes, bool incoming_in_b2) {
  while (used_bytes() + incoming_bytes > capacity_) {
    const bool from_t1 = !t1_.empty() && (t1_.bytes() > p_ || (incoming_in_b2 && t1_.bytes() == p_) || t2_.empty());
    if (from_t1) {
      b1_.push_front(t1_.pop_back());
    } else {
      b2_.push_front(t2_.pop_back());
    }
    ++evictions_;
  }
}

void ArcCache::trim_ghosts() {
  while (!b1_.empty() && t1_.bytes() + b1_.bytes() > capacity_) b1_.pop_back();
  while (t1_.bytes() + t2_.bytes() + b1_.bytes() + b2_.bytes() > 2 * capacity_) {
    if (!b2_.empty()) {
      b2_.pop_back();
    } else if (!b1_.empty()) {
      b1_.pop_back();
    } else {
      break;
    }
  }
}

// ---- S3FifoCache ----

S3FifoCache::S3FifoCache(uint64_t capacity_bytes)
    : capacity_(capacity_bytes), main_share_(capacity_bytes - capacity_bytes / 10) {}

bool S3FifoCache::access(uint64_t key, uint64_t bytes) {
  ByteList* list = small_.contains(key) ? &small_ : main_.contains(key) ? &main_ : nullptr;
  if (list) {
    ByteList::Item& item = list->at(key);
    item.freq = static_cast<uint8_t>(std::min(3, item.freq + 1));
    return true;
  }
  miss(key, bytes);
  return false;
}

void S3FifoCache::insert(uint64_t key, uint64_t bytes) {
  if (!resident(key)) miss(key, bytes);
}

void S3FifoCache::miss(uint64_t key, uint64_t bytes) {
  if (bytes > capacity_) {
    ++bypassed_;
    return;
  }
  while (used_bytes() + bytes > capacity_) evict_one();
  if (ghost_.contains(key)) {
    ghost_.erase(key);
    main_.push_front({key, bytes, 0});
  } else {
    small_.push_front({key, bytes, 0});
  }
}

void S3FifoCache::evict_one() {
  if (main_.bytes() > main_share_ || small_.empty()) {
    evict_main();
  } else {
    evict_small();
  }
}

void S3FifoCache::evict_small() {
  while (!small_.empty()) {
    ByteList::Item t = small_.pop_back();
    if (t.freq >= 1) {
      t.freq = 0;
      main_.push_front(t);
      continue;
    }
    ++evictions_;
    t.freq = 0;
    ghost_.push_front(t);
    while (ghost_.bytes() > main_share_) ghost_.pop_back();
    return;
  }
}

void S3FifoCache::evict_main() {
  while (!main_.empty()) {
    ByteList::Item t = main_.pop_back();
    if (t.freq >= 1) {
      --t.freq;
      main_.push_front(t);
      continue;
    }
    ++evictions_;
    return;
  }
}

}  // namespace cairn
