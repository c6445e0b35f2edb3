#include "daemon/trace_recorder.hpp"

#include <algorithm>
#include <cstring>

#include "core/log.hpp"

namespace cairn {

Result<std::unique_ptr<TraceRecorder>> TraceRecorder::open(const std::string& path, const Clock& clock) {
  CAIRN_ASSIGN_OR_RETURN(auto writer, TraceWriter::open(path));
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(std::move(writer), clock));
}

void TraceRecorder::write(TraceEvent e) {
  if (failed_.load()) return;
  e.time_ns = clock_.now_ns();
  Status st = writer_->append(e);
  if (st.ok() && (events_.fetch_add(1) + 1) % kFlushEvery == 0) st = writer_->flush();
  if (!st.ok() && !failed_.exchange(true))
    CAIRN_LOG_ERROR("policy.trace: {}; recording stops (requests are not affected)", st.to_string());
}

void TraceRecorder::access(const std::string& model, const ChunkHash& chunk, uint64_t bytes, const char* tier,
                           bool prefetch) {
  if (prefetch) return;
  TraceEvent e;
  e.kind = TraceEventKind::kAccess;
  e.models = {model};
  e.chunk = chunk.hex();
  e.bytes = bytes;
  if (std::strcmp(tier, "dram") == 0)
    e.tier = TraceTier::kDram;
  else if (std::strcmp(tier, "nvme") == 0)
    e.tier = TraceTier::kNvme;
  else if (std::strcmp(tier, "repository") == 0)
    e.tier = TraceTier::kRepository;
  else if (std::strcmp(tier, "peer") == 0)
    e.tier = TraceTier::kPeer;
  write(std::move(e));
}

void TraceRecorder::commit(const std::string& model, const ChunkHash& chunk, uint64_t bytes) {
  TraceEvent e;
  e.kind = TraceEventKind::kInsert;
  e.models = {model};
  e.chunk = chunk.hex();
  e.bytes = bytes;
  e.tier = TraceTier::kDram;
  write(std::move(e));
}

void TraceRecorder::inherit(const std::string& model, const ChunkHash& chunk, uint64_t bytes) {
  TraceEvent e;
  e.kind = TraceEventKind::kInherit;
  e.models = {model};
  e.chunk = chunk.hex();
  e.bytes = bytes;
  write(std::move(e));
}

void TraceRecorder::inherit(const std::string& model, const TensorManifest& t) {
  for (const ChunkRef& c : t.chunks) inherit(model, c.hash, c.length);
}

void TraceRecorder::expect(const std::string& model, const ChunkHash& chunk, uint64_t bytes, double when_s) {
  TraceEvent e;
  e.kind = TraceEventKind::kHint;
  e.hint = HintKind::kWillLoad;
  e.models = {model};
  e.chunk = chunk.hex();
  e.bytes = bytes;
  if (when_s > 0) e.when_s = when_s;
  write(std::move(e));
}

void TraceRecorder::hint(const Hint& h) {
  TraceEvent e;
  e.kind = TraceEventKind::kHint;
  e.models = h.models;
  switch (h.kind) {
    case Hint::Kind::kWillLoad:
      e.hint = HintKind::kWillLoad;
      if (h.when_s > 0) e.when_s = h.when_s;
      break;
    case Hint::Kind::kPopulation:
      e.hint = HintKind::kPopulation;
      break;
    case Hint::Kind::kSequence:
      e.hint = HintKind::kSequence;
      break;
    case Hint::Kind::kDone:
      e.hint = HintKind::kDone;
      break;
  }
  if (e.models.empty()) return;  // nothing a replay could use
  write(std::move(e));
  // A population with scores: each member's chance to be the next parent, one line each after it.
  for (size_t i = 0; i < h.parent_chance.size() && i < h.models.size(); ++i) {
    TraceEvent p;
    p.kind = TraceEventKind::kHint;
    p.hint = HintKind::kParentChance;
    p.models = {h.models[i]};
    p.when_s = std::clamp(h.parent_chance[i], 0.0, 1.0);
    write(std::move(p));
  }
}

}  // namespace cairn
