// NvmeTier: the write path: put (plan, make space, write, record) and the model records.
//
// A put stores a chunk in three steps, in the order that makes it crash-safe:
//   1. plan: skip chunks already held (a clean one asked for dirty is re-recorded dirty), wait for
//      chunks another put is storing (inflight), and claim the rest;
//   2. space: allocate extents, evicting clean unpinned chunks in policy order; an evicted extent is
//      reused only once its DEL record is durable (the quarantine, nvme_tier_journal.cpp);
//   3. write the bytes and fdatasync the data file, and only then append and sync the PUT records:
//      a record always names complete bytes, and an extent torn by a crash has no record. The
//      chunks become visible once their records are durable.
// On any failure the claimed extents are given back and nothing names them.
#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

#include "tiers/nvme/extent_io.hpp"
#include "tiers/nvme/journal.hpp"
#include "tiers/nvme/nvme_tier_impl.hpp"

namespace cairn {

using nvme::AlignedBuffer;
using nvme::append_record;
using nvme::put_payload;
using nvme::round_up;

Status NvmeTier::put(std::span<const Put> chunks) {
  for (const Put& p : chunks)
    if (p.length == 0)
      return invalid_argument("chunk " + p.hash.hex() + " is empty: a chunk in the burst buffer has at least one byte");
  Impl& im = *impl_;
  std::vector<Put> later;  // chunks another put was storing: stored (or found) once it is done
  Status st = im.put_batch(chunks, later);
  while (st.ok() && !later.empty()) {
    {
      cairn::MutexLock l(im.mu);
      im.landed.wait(l, [&] {
        return std::none_of(later.begin(), later.end(),
                            [&](const Put& p) CAIRN_REQUIRES(im.mu) { return im.inflight.count(p.hash) > 0; });
      });
    }
    std::vector<Put> again;
    st = im.put_batch(later, again);
    later.swap(again);
  }
  return st;
}

Status NvmeTier::Impl::put_batch(std::span<const Put> chunks, std::vector<Put>& later) {
  Impl& im = *this;
  struct Planned {
    const Put* put;
    uint64_t offset = 0;
    bool placed = false;
  };
  std::vector<Planned> planned;
  std::vector<ChunkHash> redirty;  // held clean, asked for dirty
  uint64_t need = 0;
  {
    cairn::MutexLock l(im.mu);
    std::unordered_set<ChunkHash, ChunkHashHasher> seen;
    for (const Put& p : chunks) {
      if (!seen.insert(p.hash).second) continue;
      auto it = im.entries.find(p.hash);
      for (;;) {
        if (im.inflight.count(p.hash)) break;
        it = im.entries.find(p.hash);
        auto d = im.doomed.find(p.hash);
        if (it == im.entries.end() || d == im.doomed.end()) break;
        if (!d->second) {
          // Removed while being read: its bytes are good, so it simply stays.
          im.doomed.erase(d);
          break;
        }
        // A corrupt copy still being read: once its last reader drops it, store the chunk anew.
        im.unpinned.wait(l);
      }
      if (im.inflight.count(p.hash)) {
        later.push_back(p);
        continue;
      }
      if (it != im.entries.end()) {
        if (p.dirty && !it->second.dirty) redirty.push_back(p.hash);
        continue;
      }
      need += round_up(p.length);
      planned.push_back(Planned{&p});
      im.inflight.insert(p.hash);
    }
  }
  // However this put ends, its chunks are no longer in flight.
  struct Landing {
    Impl& im;
    const std::vector<Planned>& planned;
    ~Landing() {
      {
        cairn::MutexLock l(im.mu);
        for (const auto& pl : planned) im.inflight.erase(pl.put->hash);
      }
      im.landed.notify_all();
    }
  } landing{im, planned};
  if (!redirty.empty()) {
    // The repository lost them (gc) and a new commit brought them back: their only copy is here.
    cairn::MutexLock jl(im.jmu);
    std::string rec;
    {
      cairn::MutexLock l(im.mu);
      for (const ChunkHash& h : redirty) {
        auto it = im.entries.find(h);
        if (it == im.entries.end() || it->second.dirty) continue;
        it->second.dirty = true;
        im.dirty_bytes += it->second.length;
        append_record(rec, nvme::kPut, put_payload(h, it->second.offset, it->second.length, true));
      }
    }
    CAIRN_RETURN_IF_ERROR(im.append_locked(rec, false).with_context("writing the burst buffer journal"));
  }
  auto give_back_locked = [&]() CAIRN_REQUIRES(im.mu) {
    for (auto& pl : planned)
      if (pl.placed) im.alloc->free(pl.offset, round_up(pl.put->length));
  };

  // Space: allocate, evicting clean unpinned chunks in policy order, only as many as the chunks
  // still to place need. An evicted extent is reusable once its DEL record is durable, so when the
  // evicted (quarantined) and free bytes cover the rest, the records are synced and allocation
  // retried; fragmentation may then need further evictions.
  for (;;) {
    bool release = false, stuck = false;
    {
      cairn::MutexLock jl(im.jmu);
      std::string dels;  // of the evictions
      cairn::MutexLock l(im.mu);
      for (size_t i = 0; i < planned.size() && !release && !stuck; ++i) {
        Planned& pl = planned[i];
        if (pl.placed) continue;
        for (;;) {
          if (auto off = im.alloc->allocate(round_up(pl.put->length))) {
            pl.offset = *off;
            pl.placed = true;
            break;
          }
          uint64_t rest = 0, quarantined = 0;
          for (size_t j = i; j < planned.size(); ++j)
            if (!planned[j].placed) rest += round_up(planned[j].put->length);
          for (const auto& q : im.quarantine) quarantined += q.second;
          if (!im.quarantine.empty() && quarantined + im.alloc->free_bytes() >= rest) {
            release = true;
            break;
          }
          auto victim = im.policy->pick_victim([&](const ChunkHash& h) CAIRN_REQUIRES(im.mu) {
            auto it = im.entries.find(h);
            return it != im.entries.end() && !it->second.dirty && it->second.pins == 0 && !im.doomed.count(h);
          });
          if (!victim) {
            (im.quarantine.empty() ? stuck : release) = true;
            break;
          }
          im.drop_locked(*victim, dels);
        }
      }
      l.unlock();
      Status st = im.append_locked(dels, release);
      if (!st.ok()) {
        l.lock();
        give_back_locked();
        return st.with_context("writing the burst buffer journal");
      }
    }
    if (!release && !stuck) break;
    if (release) continue;
    uint64_t dirty = 0, reading = 0;
    {
      cairn::MutexLock l(im.mu);
      give_back_locked();
      dirty = im.dirty_bytes;
      for (const auto& [h, e] : im.entries)
        if (e.pins && !e.dirty) reading += e.length;
    }
    Status st = no_space("the burst buffer " + im.opt.path + " cannot take " + std::to_string(need) +
                         " more bytes: " + std::to_string(dirty) + " of its " + std::to_string(im.opt.capacity) +
                         " bytes hold chunks not yet in the repository and " + std::to_string(reading) +
                         " bytes chunks being read (the flusher frees space as it writes dirty chunks to the "
                         "repository)");
    return st;
  }

  // Write the bytes, make them durable, then record them.
  std::vector<IoRequest> reqs;
  std::vector<std::unique_ptr<AlignedBuffer>> keep;
  Status st;
  for (const auto& pl : planned)
    if (st.ok()) st = nvme::write_extent(*im.data, pl.offset, pl.put->data, pl.put->length, reqs, keep);
  if (st.ok() && !reqs.empty()) st = im.data->write_many(reqs);
  if (st.ok() && !planned.empty()) st = im.data->sync(true);
  if (!st.ok()) {
    {
      cairn::MutexLock l(im.mu);
      give_back_locked();  // nothing names these bytes
    }
    return st.with_context("writing to the burst buffer " + im.data_path);
  }
  std::string records;
  for (const auto& pl : planned)
    append_record(records, nvme::kPut, put_payload(pl.put->hash, pl.offset, pl.put->length, pl.put->dirty));
  Status js = im.append(records, true, [&]() CAIRN_REQUIRES(im.mu) {
    for (const auto& pl : planned) {
      im.entries[pl.put->hash] = Entry{pl.offset, pl.put->length, pl.put->dirty, 0};
      im.policy->track(pl.put->hash, pl.put->length);
      im.bytes_in += pl.put->length;
      if (pl.put->dirty) im.dirty_bytes += pl.put->length;
    }
  });
  if (!js.ok()) {
    // The bytes are written but their records may or may not be in the journal. The append marked
    // the journal broken, so it is rewritten from the state (which lacks these chunks) before any
    // other record: the extents can be given out again.
    cairn::MutexLock l(im.mu);
    give_back_locked();
    return js.with_context("writing the burst buffer journal");
  }
  return im.maybe_compact();
}

Status NvmeTier::put_model(uint64_t seq, const std::string& id, const std::string& manifest_json) {
  const std::string p = nvme::model_payload(seq, id, manifest_json);
  if (p.size() > nvme::kMaxRecordPayload)
    return invalid_argument("model '" + id + "': its manifest is larger than a burst buffer record may be");
  std::string rec;
  append_record(rec, nvme::kModel, p);
  cairn::MutexLock jl(impl_->jmu);
  {
    cairn::MutexLock l(impl_->mu);
    impl_->models[id] = PendingModel{seq, id, manifest_json};
  }
  return impl_->append_locked(rec, true).with_context("recording model '" + id + "' in the burst buffer");
}

Status NvmeTier::model_done(const std::string& id) {
  std::string rec;
  cairn::MutexLock jl(impl_->jmu);
  {
    cairn::MutexLock l(impl_->mu);
    if (!impl_->models.erase(id)) return Status::OK();
  }
  append_record(rec, nvme::kDone, id);
  return impl_->append_locked(rec, false);
}

}  // namespace cairn
