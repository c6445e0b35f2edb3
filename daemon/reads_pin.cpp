// Reads::pin_tensors: making the chunks of several tensors resident and pinned (daemon/reads.hpp).
//
// Three steps. Claim every chunk of every tensor (resident: pinned at once; being loaded by another
// reader: waited for at the end; missing: this reader loads it) and take DRAM space for the missing
// ones, all or nothing. Then read the missing chunks of all the tensors through one pool of workers,
// so that a model's tensors stream back to back without a pause at each tensor's end (which a
// peer's stream and the repository's readahead both feel). Then wait for the chunks other readers
// load, and either hand out the extents or, on any failure, leave nothing pinned.
#include <algorithm>
#include <atomic>
#include <thread>

#include "daemon/reads.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

namespace {

// Reads in flight at once for one request: enough to overlap reading, checking and copying and to
// keep a peer's stream full; few enough that one request does not take every disk queue slot.
constexpr size_t kParallelReads = 8;

// One tensor's state while it is pinned.
struct TensorLoad {
  const TensorManifest* t = nullptr;
  std::vector<DramTier::Claim> claims;
  std::vector<size_t> to_load, to_wait;  // chunk indices
  std::vector<uint64_t> offsets;         // per chunk, once have[i]
  std::vector<char> have;                // pinned by this request
  std::vector<const char*> served;       // the tier each chunk came from, for the trace
  std::vector<uint64_t> load_off;        // per to_load entry
  std::vector<Extent> granted;           // DRAM space taken for to_load
  std::vector<Status> results;           // per to_load entry
  std::vector<char> loaded;              // per to_load entry
  uint32_t reloaded = 0;                 // to_wait chunks this request read itself (their loader failed)
};

}  // namespace

Status Reads::explain_failure(const std::string& model, const Status& failure) const {
  const StatusCode code = failure.code();
  if (code != StatusCode::kCorruption && code != StatusCode::kIo && code != StatusCode::kNotFound) return failure;
  auto now = p_.models.find_fresh(model);
  if (now.ok() || now.status().code() != StatusCode::kNotFound) return failure;
  // Not the failure's own advice (such as "restore the pack from a copy"): nothing is damaged.
  return not_found(now.status().message() + " (it was removed while it was being read)");
}

Status Reads::pin_tensors(std::span<const TensorManifest* const> tensors, const std::string& model, bool prefetch,
                          std::vector<PinnedTensor>& out) {
  DramTier& dram = p_.dram;
  std::vector<TensorLoad> loads(tensors.size());
  Status failure;

  // 1. Claims, and space for what this request loads (one allocation per wholly missing tensor,
  //    so that it is contiguous in the arena and can be mapped without assembling).
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    TensorLoad& L = loads[ti];
    const TensorManifest& t = *tensors[ti];
    const size_t n = t.chunks.size();
    L.t = &t;
    L.claims.resize(n);
    L.offsets.assign(n, 0);
    L.have.assign(n, 0);
    L.served.assign(n, "dram");
    for (size_t i = 0; i < n; ++i) {
      L.claims[i] = dram.claim(t.chunks[i].hash);
      switch (L.claims[i].kind) {
        case DramTier::ClaimKind::kResident:
          L.offsets[i] = L.claims[i].offset, L.have[i] = 1;
          break;
        case DramTier::ClaimKind::kLoad:
          L.to_load.push_back(i);
          break;
        case DramTier::ClaimKind::kLoading:
          L.to_wait.push_back(i);
          break;
      }
    }
    L.load_off.resize(L.to_load.size());
    L.results.resize(L.to_load.size());
    L.loaded.assign(L.to_load.size(), 0);
    if (L.to_load.empty() || !failure.ok()) continue;
    if (L.to_load.size() == n && n > 1) {
      auto off = dram.allocate(t.nbytes);
      if (!off.ok())
        failure = off.status();
      else {
        L.granted.push_back(Extent{*off, t.nbytes});
        for (size_t k = 0; k < L.to_load.size(); ++k) L.load_off[k] = *off + L.to_load[k] * p_.chunk_size;
      }
    } else {
      for (size_t k = 0; failure.ok() && k < L.to_load.size(); ++k) {
        auto a = dram.allocate(t.chunks[L.to_load[k]].length);
        if (!a.ok())
          failure = a.status();
        else
          L.granted.push_back(Extent{*a, t.chunks[L.to_load[k]].length}), L.load_off[k] = *a;
      }
    }
  }

  // 2. The reads, all tensors through one pool. Each chunk is resident as soon as it is in, not
  //    when its tensor is: a reader waiting for it (here, or a peer member that the group's
  //    directory told to wait for this daemon's load) has it while the rest still loads. Each chunk
  //    owns its sub-range of a whole-tensor allocation.
  const bool read_any = failure.ok();
  if (read_any) {
    std::vector<std::pair<size_t, size_t>> work;  // (tensor, to_load entry)
    for (size_t ti = 0; ti < loads.size(); ++ti)
      for (size_t k = 0; k < loads[ti].to_load.size(); ++k) work.emplace_back(ti, k);
    auto read_one = [&](size_t w) {
      auto [ti, k] = work[w];
      TensorLoad& L = loads[ti];
      const size_t i = L.to_load[k];
      const ChunkRef& ref = L.t->chunks[i];
      // The fastest intact copy below DRAM, verified (tiers/tier_manager.hpp).
      L.results[k] = p_.tiers.fetch(ref, dram.base() + L.load_off[k], &L.served[i]);
      if (L.results[k].ok()) {
        dram.finish_load(ref.hash, L.load_off[k], ref.length);
        L.loaded[k] = 1;
      }
    };
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t w; (w = next++) < work.size();) read_one(w);
    };
    std::vector<std::thread> helpers;
    for (size_t h = 1; h < std::min(kParallelReads, work.size()); ++h) helpers.emplace_back(worker);
    worker();
    for (auto& th : helpers) th.join();
    // (Reads per source are counted by the tier manager, which knows where each chunk came from.)
    for (TensorLoad& L : loads)
      for (size_t k = 0; k < L.results.size(); ++k)
        if (failure.ok() && !L.results[k].ok()) failure = L.results[k].with_context("tensor '" + L.t->name + "'");
  }
  for (TensorLoad& L : loads) {
    if (!read_any) {
      // No space: nothing was read; give back what was granted and let waiters try again.
      for (const auto& g : L.granted) dram.release(g.offset, g.length);
      for (size_t i : L.to_load) dram.abort_load(L.t->chunks[i].hash);
      continue;
    }
    for (size_t k = 0; k < L.to_load.size(); ++k) {
      const size_t i = L.to_load[k];
      if (L.loaded[k]) {
        L.offsets[i] = L.load_off[k];
        L.have[i] = 1;  // pinned by finish_load; unpinned below if the request fails
      } else {
        // Its space goes back (its own allocation, or its sub-range of the tensor's) and waiters
        // try again.
        dram.release(L.load_off[k], L.t->chunks[i].length);
        dram.abort_load(L.t->chunks[i].hash);
      }
    }
  }

  // 3. The chunks another reader was loading: wait for them (or load them when that reader failed).
  for (TensorLoad& L : loads) {
    for (size_t i : L.to_wait) {
      if (!failure.ok()) break;
      const ChunkRef& ref = L.t->chunks[i];
      for (;;) {
        if (auto off = dram.wait_pin(ref.hash)) {
          L.offsets[i] = *off;
          L.have[i] = 1;
          break;
        }
        // The other loader failed: try ourselves.
        auto c = dram.claim(ref.hash);
        if (c.kind == DramTier::ClaimKind::kResident) {
          L.offsets[i] = c.offset;
          L.have[i] = 1;
          break;
        }
        if (c.kind == DramTier::ClaimKind::kLoading) continue;
        auto a = dram.allocate(ref.length);
        Status st = !a.ok() ? a.status() : p_.tiers.fetch(ref, dram.base() + *a, &L.served[i]);
        if (!st.ok()) {
          if (a.ok()) dram.release(*a, ref.length);
          dram.abort_load(ref.hash);
          failure = st.with_context("tensor '" + L.t->name + "'");
          break;
        }
        dram.finish_load(ref.hash, *a, ref.length);
        L.offsets[i] = *a;
        L.have[i] = 1;
        ++L.reloaded;
        break;
      }
    }
  }

  if (!failure.ok()) {
    for (TensorLoad& L : loads)
      for (size_t i = 0; i < L.have.size(); ++i)
        if (L.have[i]) dram.unpin(L.t->chunks[i].hash);
    return explain_failure(model, failure);
  }
  out.resize(loads.size());
  for (size_t ti = 0; ti < loads.size(); ++ti) {
    TensorLoad& L = loads[ti];
    const auto& chunks = L.t->chunks;
    out[ti].loaded = static_cast<uint32_t>(L.to_load.size()) + L.reloaded;
    for (size_t i = 0; i < chunks.size(); ++i) {
      out[ti].pinned.push_back(chunks[i].hash);
      out[ti].extents.push_back(Extent{L.offsets[i], chunks[i].length});
    }
    if (trace_)
      for (size_t i = 0; i < chunks.size(); ++i)
        trace_->access(model, chunks[i].hash, chunks[i].length, L.served[i], prefetch);
    if (p_.usage && !prefetch)
      for (size_t i = 0; i < chunks.size(); ++i) p_.usage->chunk_leased(L.served[i], chunks[i].length);
  }
  return Status::OK();
}

}  // namespace cairn
