// Records and what is built from them: applying a record to the catalog, loading the catalog (the
// newest checkpoint, then every log from where the checkpoint covers it), refresh (the new records
// of every other writer's log), and compaction (a new checkpoint, and the logs it makes redundant
// deleted).
//
// A commit record stores a derived model compactly: a tensor equal to its parent's tensor of the
// same position k is written as the number k, and a model that is exactly its parent's tensors
// (a metadata-only commit) as "tensors": "parent" (encode_commit / decode_commit). The parent is
// always applied before its child: a child whose parent is not known yet is deferred.
//
// Crash-safety: a checkpoint is published whole (atomic rename) and names, for every log, the
// offset up to which it holds that log's records; a log is deleted only once a published
// checkpoint covers all of it and its writer is gone, so at every moment the newest checkpoint
// plus the logs from their covered offsets hold every acknowledged record.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::ends_with;
using pfs::join_path;
using pfs::list_dir;
using pfs::quote;
using pfs::RecordType;
using pfs::starts_with;

constexpr std::string_view kCkptPrefix = "ckpt-";

// "ckpt-<16 hex>.ckpt" -> seq, or 0.
uint64_t checkpoint_seq(const std::string& name) {
  if (!starts_with(name, kCkptPrefix) || !ends_with(name, pfs::kCheckpointSuffix)) return 0;
  std::string hex = name.substr(kCkptPrefix.size(), name.size() - kCkptPrefix.size() - pfs::kCheckpointSuffix.size());
  if (hex.size() != 16) return 0;
  uint64_t v = 0;
  for (char c : hex) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return 0;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

std::string checkpoint_name(uint64_t seq) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "ckpt-%016llx.ckpt", static_cast<unsigned long long>(seq));
  return buf;
}

json parse_json(std::string_view payload) { return json::parse(payload.begin(), payload.end(), nullptr, false); }

// The id field of a small record, or "".
std::string record_id(const json& j) {
  if (!j.is_object()) return {};
  auto it = j.find("id");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string file_writer(const std::string& name) {
  if (name.size() < 18 || name[0] != 'w' || name[17] != '-') return {};
  for (size_t i = 1; i < 17; ++i) {
    char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return {};
  }
  return name.substr(0, 17);
}

// ---- the compact commit record ----

std::string encode_commit(const ModelManifest& m, const ModelManifest* parent) {
  if (parent != nullptr && !parent->tensors.empty() && m.tensors == parent->tensors) {
    // A metadata-only child: its tensors are never serialized (the list is shared, not copied).
    ModelManifest head = m;
    head.tensors.clear();
    json j = manifest_to_json(head);
    j["tensors"] = "parent";
    return j.dump();
  }
  json j = manifest_to_json(m);
  if (parent != nullptr && !parent->tensors.empty()) {
    {
      json& ts = j["tensors"];
      for (size_t k = 0; k < m.tensors.size(); ++k)
        if (k < parent->tensors.size() && m.tensors[k] == parent->tensors[k]) ts[k] = k;
    }
  }
  return j.dump();
}

Result<ModelManifest> decode_commit(json j, const ModelManifest* parent) {
  std::vector<std::pair<size_t, size_t>> from_parent;  // (position, parent's index)
  auto it = j.is_object() ? j.find("tensors") : j.end();
  bool all_parent = false;
  if (it != j.end()) {
    if (it->is_string()) {
      if (it->get<std::string>() != "parent") return invalid_argument("tensors: expected an array or \"parent\"");
      if (parent == nullptr) return invalid_argument("tensors: \"parent\" in a model without a parent");
      all_parent = true;
      *it = json::array();
    } else if (it->is_array()) {
      json kept = json::array();
      for (size_t k = 0; k < it->size(); ++k) {
        const json& t = (*it)[k];
        if (t.is_number_unsigned()) {
          auto idx = t.get<uint64_t>();
          if (parent == nullptr || idx >= parent->tensors.size())
            return invalid_argument("tensors[" + std::to_string(k) + "]: parent tensor " + std::to_string(idx) +
                                    " does not exist");
          from_parent.emplace_back(k, static_cast<size_t>(idx));
        } else {
          kept.push_back(t);
        }
      }
      *it = std::move(kept);
    }
  }
  CAIRN_ASSIGN_OR_RETURN(ModelManifest m, manifest_from_json(j));
  if (all_parent) {
    m.tensors = parent->tensors;
  } else if (!from_parent.empty()) {
    std::vector<TensorManifest> own = std::move(m.tensors.mut());
    m.tensors.clear();
    m.tensors.reserve(own.size() + from_parent.size());
    size_t next_own = 0, fp = 0;
    for (size_t k = 0; k < own.size() + from_parent.size(); ++k) {
      if (fp < from_parent.size() && from_parent[fp].first == k) {
        m.tensors.push_back(parent->tensors[from_parent[fp].second]);
        ++fp;
      } else {
        if (next_own >= own.size()) return invalid_argument("tensors: positions out of order");
        m.tensors.push_back(std::move(own[next_own++]));
      }
    }
    std::vector<std::string> names;
    for (const auto& t : m.tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    if (std::adjacent_find(names.begin(), names.end()) != names.end())
      return invalid_argument("tensors: an inherited tensor repeats a name");
  }
  return m;
}

// ---- applying records (mu_ held exclusively) ----

Status Repository::Impl::apply(RecordType type, std::string_view payload, const std::string& log, uint64_t offset,
                               RefreshReport* rep) {
  const std::string where = (log.empty() ? std::string("a checkpoint") : "log " + join_path(logs_dir_, log)) + ", " +
                            pfs::record_type_name(type) + " record at byte " + std::to_string(offset);
  auto defer = [&]() CAIRN_REQUIRES(mu_) {
    deferred_.push_back({type, std::string(payload), log, offset});
    return Status::OK();
  };
  json j = parse_json(payload);
  if (j.is_discarded()) return corruption(where + ": the payload is not JSON");
  switch (type) {
    case RecordType::kCommit: {
      std::string id = record_id(j);
      std::string parent_id;
      if (j.is_object() && j.contains("parent") && j["parent"].is_string()) parent_id = j["parent"].get<std::string>();
      std::shared_ptr<const ModelManifest> parent;
      if (!parent_id.empty()) {
        auto pit = models_.find(parent_id);
        if (pit == models_.end()) return defer();
        parent = pit->second;
        // A child names its parent's tensors as they were when it was committed.
        if (parent->collected) {
          auto bit = collected_base_.find(parent_id);
          if (bit != collected_base_.end()) parent = bit->second;
        }
      }
      if (models_.count(id)) {
        // Two writers published one id: claims make this impossible unless a writer was judged
        // dead while it was not (no flock and a heartbeat 60 s late). The first one applied stays.
        CAIRN_LOG_WARN("{}: model {} is in the repository already; this record is ignored", where, quote(id));
        return Status::OK();
      }
      Result<ModelManifest> r = decode_commit(std::move(j), parent.get());
      if (!r.ok()) return corruption(where + ": " + r.status().message());
      Status cs = validate_chunking(*r, chunk_size_);
      if (!cs.ok()) return corruption(where + ": " + cs.message());
      auto m = std::make_shared<const ModelManifest>(std::move(r).value());
      CAIRN_RETURN_IF_ERROR(add_model(m).with_context(where + ", model " + quote(m->id)));
      unreported_.added.push_back(m);
      if (rep) rep->added.push_back(std::move(m));
      return Status::OK();
    }
    case RecordType::kRetire:
    case RecordType::kCollect:
    case RecordType::kRemove: {
      std::string id = record_id(j);
      if (id.empty()) return corruption(where + ": no model id");
      auto mit = models_.find(id);
      if (mit == models_.end()) return defer();
      std::shared_ptr<const ModelManifest> old = mit->second;
      if (type == RecordType::kRemove) {
        // A child this view holds stays its child: the gc that wrote the record commits the
        // parent again, collected, when it finds a child committed meanwhile (revive_parents).
        std::vector<std::string> kids;
        if (auto cit = children_.find(id); cit != children_.end()) kids = cit->second;
        std::vector<std::string> dead = drop_model(id);
        (void)dead;  // files are deleted by the gc that wrote the record
        if (!kids.empty()) children_[id] = std::move(kids);
        collected_base_.erase(id);
        unreported_.removed.push_back(id);
        if (rep) rep->removed.push_back(id);
        return Status::OK();
      }
      auto m = std::make_shared<ModelManifest>(*old);
      if (type == RecordType::kRetire) {
        if (old->retired_ns != 0) return Status::OK();
        auto ns = j.value("retired_ns", int64_t{1});
        m->retired_ns = ns > 0 ? ns : 1;
        ++retired_;
      } else {
        if (old->collected) return Status::OK();
        collected_base_[id] = old;
        std::vector<std::string> dead;
        release_data(*old, &dead);
        m->tensors.clear();
        m->pack.clear();
        m->source_header.clear();
        m->collected = true;
        if (m->retired_ns == 0) {
          m->retired_ns = 1;
          ++retired_;
        }
      }
      mit->second = std::move(m);
      unreported_.retired.push_back(id);
      if (rep) rep->retired.push_back(id);
      return Status::OK();
    }
    case RecordType::kSeal: {
      for (const char* key : {"log", "pack"})
        if (j.is_object() && j.contains(key) && j[key].is_string()) sealed_.insert(j[key].get<std::string>());
      return Status::OK();
    }
    case RecordType::kCheckpointBegin:
    case RecordType::kCheckpointEnd:
      return corruption(where + ": a checkpoint record in a log");
  }
  return corruption(where + ": unknown record type");
}

void Repository::Impl::apply_deferred(RefreshReport* rep) {
  for (bool progress = true; progress && !deferred_.empty();) {
    progress = false;
    std::vector<Deferred> waiting = std::move(deferred_);
    deferred_.clear();
    for (Deferred& d : waiting) {
      size_t before = deferred_.size();
      Status s = apply(d.type, d.payload, d.log, d.offset, rep);
      if (!s.ok()) CAIRN_LOG_ERROR("repository {}: {}", dir_, s.to_string());
      if (deferred_.size() == before) progress = true;
    }
  }
}

// ---- checkpoints ----

Status Repository::Impl::publish_checkpoint(
    uint64_t seq, const std::map<std::string, uint64_t>& covers,
    const std::vector<std::shared_ptr<const ModelManifest>>& models,
    const std::unordered_map<std::string, std::shared_ptr<const ModelManifest>>& bases,
    const std::vector<Deferred>& carried) {
  uint64_t carried_commits = 0;
  for (const Deferred& d : carried) carried_commits += d.type == RecordType::kCommit ? 1 : 0;
  json begin = {{"seq", seq}, {"models", models.size() + carried_commits}, {"covers", covers}};
  std::string bytes = pfs::encode_record(RecordType::kCheckpointBegin, begin.dump());
  std::unordered_map<std::string, const ModelManifest*> by_id;
  for (const auto& m : models) by_id.emplace(m->id, m.get());
  // A collected model whose state before gc is known is written as it was, then collected, so its
  // children's records (which name its tensors by position) still decode.
  std::unordered_map<std::string, const ModelManifest*> base;
  for (const auto& [id, m] : bases) {
    base.emplace(id, m.get());
  }
  uint64_t records = 0;
  for (const auto& m : models) {
    const ModelManifest* written = m.get();
    if (m->collected) {
      auto b = base.find(m->id);
      if (b != base.end()) written = b->second;
    }
    const ModelManifest* parent = nullptr;
    if (!m->parent.empty()) {
      auto it = base.find(m->parent);
      if (it != base.end())
        parent = it->second;
      else if (auto it2 = by_id.find(m->parent); it2 != by_id.end())
        parent = it2->second;
    }
    std::string payload;
    try {
      payload = encode_commit(*written, parent);
    } catch (const json::exception& e) {
      return internal_error("checkpoint: model " + quote(m->id) + " cannot be written as JSON: " + e.what());
    }
    bytes += pfs::encode_record(RecordType::kCommit, payload);
    ++records;
    if (written != m.get()) {
      bytes += pfs::encode_record(RecordType::kCollect, json{{"id", m->id}}.dump());
      ++records;
    }
  }
  // Records the checkpoint read could not apply yet (a model whose parent is not known): carried
  // over as they are, or the next checkpoint would lose them.
  for (const Deferred& d : carried) {
    bytes += pfs::encode_record(d.type, d.payload);
    ++records;
  }
  json end = {{"seq", seq}, {"models", models.size() + carried_commits}, {"records", records}};
  bytes += pfs::encode_record(RecordType::kCheckpointEnd, end.dump());
  std::vector<iovec> iov{{bytes.data(), bytes.size()}};
  return pfs::AtomicFileWriter::publish(*fs_, ckpt_dir_, checkpoint_name(seq), iov, tmp_name());
}

Status Repository::Impl::read_checkpoint(const std::string& name, uint64_t* seq,
                                         std::map<std::string, uint64_t>* covers, bool header_only,
                                         RefreshReport* rep) {
  std::string path = join_path(ckpt_dir_, name);
  std::string bytes;
  if (header_only) {
    CAIRN_ASSIGN_OR_RETURN(auto f, fs_->open(path, kRead));
    std::string head(pfs::kRecordHeaderBytes, '\0');
    size_t got = 0;
    CAIRN_RETURN_IF_ERROR(f->pread(head.data(), head.size(), 0, &got));
    uint64_t len = 0;
    for (int b = 15; b >= 8; --b) len = len << 8 | static_cast<uint8_t>(head[b]);
    if (got < head.size() || len > pfs::kMaxRecordPayload) return corruption("checkpoint " + path + " is truncated");
    bytes = head;
    bytes.resize(head.size() + len);
    CAIRN_RETURN_IF_ERROR(f->pread(bytes.data() + head.size(), len, head.size(), &got));
    if (got < len) return corruption("checkpoint " + path + " is truncated");
  } else {
    CAIRN_RETURN_IF_ERROR(read_small_file(path, 1ull << 40, &bytes));
  }
  pfs::ParseResult pr = pfs::parse_records(bytes);
  const std::string todo = "; move it out of checkpoints/ to fall back to an older one (with its logs), or restore it";
  if (!header_only && pr.stop != pfs::ParseResult::kEnd)
    return corruption("checkpoint " + path + ": " + (pr.why.empty() ? "it ends inside a record" : pr.why) + todo);
  if (pr.records.empty() || pr.records.front().type != RecordType::kCheckpointBegin)
    return corruption("checkpoint " + path + " does not start with a checkpoint record" + todo);
  json begin = parse_json(pr.records.front().payload);
  if (!begin.is_object() || !begin.contains("seq") || !begin["seq"].is_number_unsigned() || !begin.contains("covers") ||
      !begin["covers"].is_object() || !begin.contains("models") || !begin["models"].is_number_unsigned())
    return corruption("checkpoint " + path + ": its first record lacks seq, models or covers" + todo);
  *seq = begin["seq"].get<uint64_t>();
  covers->clear();
  for (auto& [log, off] : begin["covers"].items()) {
    if (!off.is_number_unsigned())
      return corruption("checkpoint " + path + ": covers." + log + " is not an offset" + todo);
    (*covers)[log] = off.get<uint64_t>();
  }
  if (header_only) return Status::OK();
  uint64_t n = begin["models"].get<uint64_t>();
  if (pr.records.back().type != RecordType::kCheckpointEnd)
    return corruption("checkpoint " + path + " does not end with a checkpoint record" + todo);
  WriterLock lock(mu_);
  uint64_t commits = 0;
  for (size_t k = 1; k + 1 < pr.records.size(); ++k) {
    const pfs::ParsedRecord& r = pr.records[k];
    // Models, collects, and the retires and removes of models still waiting for their parent.
    if (r.type != RecordType::kCommit && r.type != RecordType::kCollect && r.type != RecordType::kRetire &&
        r.type != RecordType::kRemove)
      return corruption("checkpoint " + path + ": record " + std::to_string(k) +
                        " is neither a model nor a collect, retire or remove" + todo);
    if (r.type == RecordType::kCommit) ++commits;
    CAIRN_RETURN_IF_ERROR(apply(r.type, r.payload, "", r.offset, rep).with_context("checkpoint " + path));
  }
  if (commits != n)
    return corruption("checkpoint " + path + " holds " + std::to_string(commits) + " models where its header says " +
                      std::to_string(n) + todo);
  return Status::OK();
}

// The newest checkpoint's name, or "".
std::string Repository::Impl::newest_checkpoint() const {
  std::lock_guard lock(listing_mu_);
  const std::vector<std::string>& names = ckpt_listing_.get(ckpt_dir_);
  std::string best;
  uint64_t best_seq = 0;
  for (const std::string& n : names) {
    uint64_t s = checkpoint_seq(n);
    if (s > best_seq) {
      best_seq = s;
      best = n;
    }
  }
  return best;
}

// ---- load and refresh ----

Status Repository::Impl::load(RefreshReport* rep) {
  // A compaction (another process's, or a gc of this one) may write a newer checkpoint and delete the
  // logs it folded in while this reads: then the view would lack what those logs held (models
  // "removed" from every catalog built on it, found by the torture harness). read_logs says so
  // (`reload`), and so does a checkpoint deleted before it is read: read everything again.
  constexpr int kAttempts = 20;
  for (int attempt = 1;; ++attempt) {
    {
      WriterLock lock(mu_);
      clear_catalog();
      deferred_.clear();
      collected_base_.clear();
    }
    read_to_.clear();
    log_files_.clear();
    ckpt_seq_ = 0;
    RefreshReport mine;
    bool reload = false;
    std::string newest = newest_checkpoint();
    Status st;
    if (!newest.empty()) {
      std::map<std::string, uint64_t> covers;
      st = read_checkpoint(newest, &ckpt_seq_, &covers, /*header_only=*/false, &mine);
      if (st.ok())
        read_to_ = std::move(covers);
      else if (st.code() == StatusCode::kNotFound)
        reload = true;  // replaced by a newer one just now
    }
    if (st.ok()) st = read_logs(&mine, &reload, /*own_too=*/true);
    if (!st.ok() && !reload) return st;
    if (!reload || attempt == kAttempts) {
      if (reload)
        CAIRN_LOG_WARN(
            "repository {}: compacted {} times while it was being read; the view may lack "
            "models until the next refresh",
            dir_, kAttempts);
      if (rep) {
        rep->added.insert(rep->added.end(), mine.added.begin(), mine.added.end());
        rep->removed.insert(rep->removed.end(), mine.removed.begin(), mine.removed.end());
        rep->retired.insert(rep->retired.end(), mine.retired.begin(), mine.retired.end());
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * attempt));
  }
  view_time_ = last_refresh_ = std::chrono::steady_clock::now();
  {
    ReaderLock lock(mu_);
    std::string logs;
    for (const auto& [name, at] : read_to_) logs += (logs.empty() ? "" : ", ") + name + ":" + std::to_string(at);
    CAIRN_LOG_INFO("repository {}: loaded checkpoint {} and the logs ({}): {} models, {} records waiting", dir_,
                   ckpt_seq_, logs, models_.size(), deferred_.size());
  }
  return check_packs_present();
}

Status Repository::Impl::check_packs_present() {
  ReaderLock lock(mu_);
  for (const auto& [name, info] : packs_) {
    if (!info.missing) continue;
    for (const std::string& id : order_) {
      const ModelManifest& m = *models_.at(id);
      bool uses = m.pack == name;
      for (const TensorManifest& t : m.tensors)
        for (const ChunkRef& c : t.chunks) uses = uses || c.pack == name || (c.base && c.base->pack == name);
      if (uses)
        return corruption("model " + quote(id) + " references pack " + join_path(packs_dir_, name) +
                          ", which is missing; restore the pack from a copy");
    }
  }
  return Status::OK();
}

Status Repository::Impl::read_logs(RefreshReport* rep, bool* reload, bool own_too) {
  *reload = false;
  std::vector<std::string> names;
  {
    std::lock_guard lock(listing_mu_);
    names = logs_listing_.get(logs_dir_);
  }
  std::set<std::string> present;
  std::string buf;
  for (const std::string& name : names) {
    if (!ends_with(name, pfs::kLogSuffix) || starts_with(name, pfs::kTmpPrefix)) continue;
    present.insert(name);
    if (!own_too && file_writer(name) == wid()) continue;
    uint64_t& at = read_to_[name];
    auto fit = log_files_.find(name);
    if (fit == log_files_.end()) {
      Result<std::unique_ptr<File>> f = fs_->open(join_path(logs_dir_, name), kRead);
      if (!f.ok()) {
        if (f.status().code() == StatusCode::kNotFound) {
          // Compacted just now, between the listing and here: as if it had not been listed, so that
          // the check below reloads when the newest checkpoint covers what we never read of it.
          present.erase(name);
          read_to_.erase(name);
          continue;
        }
        return f.status().with_context("reading log " + name);
      }
      fit = log_files_.emplace(name, std::move(f).value()).first;
    }
    CAIRN_ASSIGN_OR_RETURN(uint64_t size, fit->second->size());
    if (size <= at) continue;
    buf.resize(size - at);
    size_t got = 0;
    CAIRN_RETURN_IF_ERROR(fit->second->pread(buf.data(), buf.size(), at, &got));
    buf.resize(got);
    pfs::ParseResult pr = pfs::parse_records(buf);
    {
      WriterLock lock(mu_);
      for (const pfs::ParsedRecord& r : pr.records) {
        Status s = apply(r.type, r.payload, name, at + r.offset, rep);
        if (!s.ok()) return s;
      }
      apply_deferred(rep);
    }
    if (pr.stop == pfs::ParseResult::kBad) {
      // A crash tears at most the last record (nothing after it was acknowledged). A valid record
      // after a bad one means the bad one was acknowledged and then damaged: corruption.
      for (size_t k = pr.consumed + 1; k + pfs::kRecordHeaderBytes <= buf.size(); ++k) {
        k = buf.find("CRL1", k);
        if (k == std::string::npos) break;
        pfs::ParseResult later = pfs::parse_records(std::string_view(buf).substr(k));
        if (!later.records.empty())
          return corruption("log " + join_path(logs_dir_, name) + ": " + pr.why + " (file offset " +
                            std::to_string(at + pr.consumed) + "), and valid records follow it at offset " +
                            std::to_string(at + k) + "; restore the log from a copy");
      }
      if (!owner_may_append(name) && warned_.insert(name).second)
        CAIRN_LOG_WARN("log {}: {}; its writer is gone, so what follows was never acknowledged and is ignored",
                       join_path(logs_dir_, name), pr.why);
    }
    at += pr.consumed;
  }
  // Logs gone since we last looked were compacted: fine if the newest checkpoint covers what we
  // had not read of them; otherwise (or a checkpoint covers a log we never read whole) reload.
  std::string newest = newest_checkpoint();
  uint64_t newest_seq = checkpoint_seq(newest);
  std::map<std::string, uint64_t> covers;
  bool have_covers = false;
  if (newest_seq > ckpt_seq_) {
    uint64_t s = 0;
    if (read_checkpoint(newest, &s, &covers, /*header_only=*/true, nullptr).ok()) have_covers = true;
  }
  for (auto it = read_to_.begin(); it != read_to_.end();) {
    if (present.count(it->first) || file_writer(it->first) == wid()) {
      ++it;
      continue;
    }
    if (have_covers) {
      auto c = covers.find(it->first);
      if (c != covers.end() && c->second > it->second) *reload = true;
    }
    log_files_.erase(it->first);
    it = read_to_.erase(it);
  }
  if (have_covers) {
    for (const auto& [log, off] : covers) {
      if (present.count(log) || file_writer(log) == wid()) continue;
      if (off > 0 && !read_to_.count(log)) *reload = true;  // a log we never saw, compacted away
    }
  }
  return Status::OK();
}

Status Repository::Impl::refresh(RefreshReport* rep) {
  coord_->heartbeat();
  std::lock_guard lock(refresh_mu_);
  bool reload = false;
  CAIRN_RETURN_IF_ERROR(read_logs(rep, &reload, /*own_too=*/false));
  last_refresh_ = std::chrono::steady_clock::now();
  if (reload || reload_needed_) {
    // Rebuild from the newest checkpoint. Our own records must be in our log first.
    if (!write_mu_.try_lock()) {
      reload_needed_ = true;  // a commit of ours holds it: the next refresh does it
      return Status::OK();
    }
    std::lock_guard wlock(write_mu_, std::adopt_lock);
    Status d = wait_durable(queued_gen());
    if (!d.ok()) return d;
    std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> before;
    {
      ReaderLock slock(mu_);
      before = models_;
    }
    CAIRN_RETURN_IF_ERROR(load(nullptr));
    reload_needed_ = false;
    rep->reloaded = true;
    {
      WriterLock ulock(mu_);
      // What the rebuild changed, as seen from before it (load() reported every model as new).
      unreported_ = RefreshReport{};
      unreported_.reloaded = true;
      for (const std::string& id : order_) {
        const auto& m = models_.at(id);
        auto b = before.find(id);
        if (b == before.end())
          unreported_.added.push_back(m);
        else if (b->second->retired_ns != m->retired_ns || b->second->collected != m->collected)
          unreported_.retired.push_back(id);
      }
      for (const auto& [id, m] : before)
        if (!models_.count(id)) unreported_.removed.push_back(id);
      rep->added.insert(rep->added.end(), unreported_.added.begin(), unreported_.added.end());
      rep->removed.insert(rep->removed.end(), unreported_.removed.begin(), unreported_.removed.end());
      rep->retired.insert(rep->retired.end(), unreported_.retired.begin(), unreported_.retired.end());
    }
    CAIRN_LOG_INFO("repository {}: logs were compacted under this process; the catalog was rebuilt", dir_);
  }
  view_time_ = last_refresh_;
  return Status::OK();
}

Status Repository::Impl::refresh_if_older(std::chrono::milliseconds max_age) {
  {
    std::lock_guard lock(refresh_mu_);
    if (std::chrono::steady_clock::now() - last_refresh_ < max_age) return Status::OK();
  }
  RefreshReport ignored;
  return refresh(&ignored);
}

// ---- compaction ----

bool Repository::Impl::owner_may_append(const std::string& name) const {
  std::string w = file_writer(name);
  if (w.empty()) return false;  // version 1's packs: nobody appends to them
  if (w == wid()) return name == log_name_ || name == seg_name_;
  {
    ReaderLock lock(mu_);
    if (sealed_.count(name)) return false;
  }
  return coord_->alive(w);
}

Status Repository::Impl::compact(CompactReport* report, bool take_lease, std::chrono::milliseconds lease_wait) {
  CAIRN_RETURN_IF_ERROR(check_writable());
  if (take_lease) CAIRN_RETURN_IF_ERROR(coord_->take_lease("compacting repository " + dir_, lease_wait));
  struct Release {
    pfs::Coordination* c;
    bool on;
    ~Release() {
      if (on) c->release_lease();
    }
  } release{coord_.get(), take_lease};
  std::lock_guard wlock(write_mu_);
  CAIRN_RETURN_IF_ERROR(wait_durable(queued_gen()));
  std::lock_guard rlock(refresh_mu_);
  RefreshReport ignored;
  bool reload = false;
  CAIRN_RETURN_IF_ERROR(read_logs(&ignored, &reload, /*own_too=*/false));
  if (reload) CAIRN_RETURN_IF_ERROR(load(nullptr));
  std::map<std::string, uint64_t> covers = read_to_;
  if (!log_name_.empty()) {
    std::lock_guard slock(sync_mu_);
    covers[log_name_] = log_written_;
  }
  for (const auto& [name, end] : own_sealed_logs_) covers[name] = end;
  // A log holding a deferred record is covered only up to it (the record is not in the catalog).
  std::vector<std::shared_ptr<const ModelManifest>> models;
  // Records read but not applied, every log having been read: a child whose parent is gone (its
  // record waits for the parent: gc's revive_parents may commit it again) and records about it are
  // carried into the checkpoint; the others name models removed since (a retire or a remove read
  // after the model's own remove) and are dropped. covers says how far each log was read, applied
  // or not: a load reads no record twice. (Covering a log only up to its first waiting record, as
  // before, made every load apply again the commits after it, also of models a gc removed since,
  // whose remove record the checkpoint had folded in: models came back from the dead, naming bytes
  // gc had freed, and new commits of the same bytes reused the freed copy. Found by the torture
  // harness.)
  std::vector<Deferred> carried;
  {
    ReaderLock lock(mu_);
    std::set<std::string> waiting;
    for (const Deferred& d : deferred_) {
      if (d.type != RecordType::kCommit) continue;
      json j = parse_json(d.payload);
      if (std::string id = record_id(j); !id.empty()) waiting.insert(id);
    }
    for (const Deferred& d : deferred_) {
      if (d.type == RecordType::kCommit) {
        carried.push_back(d);
        continue;
      }
      if (d.type == RecordType::kSeal) continue;
      json j = parse_json(d.payload);
      if (waiting.count(record_id(j))) carried.push_back(d);
    }
    models.reserve(order_.size());
    for (const std::string& id : order_) models.push_back(models_.at(id));
  }
  uint64_t seq = std::max(ckpt_seq_, checkpoint_seq(newest_checkpoint())) + 1;
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> bases;
  {
    ReaderLock lock(mu_);
    bases = collected_base_;
  }
  CAIRN_RETURN_IF_ERROR(
      publish_checkpoint(seq, covers, models, bases, carried).with_context("compacting repository " + dir_));
  ckpt_seq_ = seq;
  {
    std::string logs;
    for (const auto& [name, at] : covers) logs += (logs.empty() ? "" : ", ") + name + ":" + std::to_string(at);
    CAIRN_LOG_INFO("repository {}: wrote checkpoint {}: {} models, {} records carried, covering {}", dir_, seq,
                   models.size(), carried.size(), logs);
  }
  report->checkpoint_seq = seq;
  report->models = models.size();
  // Logs the checkpoint holds whole, whose writers append no more.
  bool deleted = false;
  for (const auto& [name, off] : covers) {
    if (owner_may_append(name)) continue;
    Result<std::unique_ptr<File>> f = fs_->open(join_path(logs_dir_, name), kRead);
    if (!f.ok()) continue;
    Result<uint64_t> size = (*f)->size();
    if (!size.ok() || *size > off) continue;
    if (fs_->unlink(join_path(logs_dir_, name)).ok()) {
      ++report->logs_deleted;
      deleted = true;
      log_files_.erase(name);
      read_to_.erase(name);
      own_sealed_logs_.erase(name);
    }
  }
  if (deleted) (void)fs_->sync_dir(logs_dir_);
  std::vector<std::string> names;
  (void)list_dir(ckpt_dir_, &names, nullptr);
  for (const std::string& n : names) {
    uint64_t s = checkpoint_seq(n);
    if ((s != 0 && s < seq) || starts_with(n, pfs::kTmpPrefix)) {
      if (fs_->unlink(join_path(ckpt_dir_, n)).ok() && s != 0) ++report->checkpoints_deleted;
    }
  }
  // Writers that are gone and have no log left.
  std::set<std::string> with_logs;
  for (const auto& [name, off] : read_to_) with_logs.insert(file_writer(name));
  for (const std::string& w : coord_->registered_writers()) {
    if (w == wid() || with_logs.count(w) || coord_->alive(w)) continue;
    coord_->forget_dead(w);
    ++report->writers_forgotten;
  }
  return Status::OK();
}

}  // namespace cairn
