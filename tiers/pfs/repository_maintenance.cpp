// Maintenance: remove (a model deleted at once), retire and gc (deleted later, in bulk, with the
// space given back: whole packs deleted, holes punched in packs still in use), and fsck (a check
// that changes nothing).
//
// Crash-safety: records go first (a remove, retire or collect record durable in this writer's log),
// and only then is data freed, and only data no record references; so a crash at any step leaves
// every model whole, and at worst bytes nobody references, which the next gc frees. Children are
// removed before their parents.
//
// Many writers: gc runs under the maintenance lease (one collector at a time; a dead collector's
// lease is broken by the next). Bytes in files another live writer may still append to are never
// touched; and while other writers are alive, bytes are freed only gc_grace after the records that
// made them dead, since another writer may be planning a commit against a view from before them
// (it refreshes when its view is older than a quarter of the grace: docs/repository-format.md).
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::ends_with;
using pfs::fsync_dir;
using pfs::join_path;
using pfs::kPackSuffix;
using pfs::list_dir;
using pfs::quote;
using pfs::UniqueFd;

}  // namespace

// ---- remove ----

Status Repository::Impl::remove(const std::string& id) {
  CAIRN_RETURN_IF_ERROR(check_writable());
  std::lock_guard write_lock(write_mu_);
  const std::string model = "model " + quote(id);
  {
    ReaderLock lock(mu_);
    if (!models_.count(id)) return not_found(model + " is not in repository " + dir_);
    auto cit = children_.find(id);
    if (cit != children_.end() && !cit->second.empty()) {
      std::string list;
      for (size_t k = 0; k < cit->second.size() && k < 3; ++k) list += (k ? ", " : "") + quote(cit->second[k]);
      if (cit->second.size() > 3) list += ", ...";
      return busy(model + " has " + std::to_string(cit->second.size()) + " child model(s) (" + list +
                  ") whose lineage needs it; remove them first");
    }
  }
  nlohmann::json body = {{"id", id}};
  CAIRN_RETURN_IF_ERROR(
      append_durable(pfs::encode_record(pfs::RecordType::kRemove, body.dump()), 1).with_context("removing " + model));
  std::vector<std::string> dead;
  {
    WriterLock lock(mu_);
    collected_base_.erase(id);
    dead = drop_model(id);
  }
  // Whole packs nothing references: deleted now when no other writer may be planning against them
  // (else the next gc does it, after the grace).
  if (!others_alive()) {
    bool deleted = false;
    for (const std::string& pack : dead) {
      if (owner_may_append(pack)) continue;
      forget_pack_file(pack);
      if (::unlink(join_path(packs_dir_, pack).c_str()) == 0) deleted = true;
    }
    if (deleted) (void)fsync_dir(packs_dir_);
  }
  return Status::OK();
}

bool Repository::Impl::others_alive() const {
  for (const std::string& w : coord_->registered_writers())
    if (w != wid() && coord_->alive(w)) return true;
  return false;
}

// ---- retire, gc, fsck ----

Status Repository::Impl::retire(const std::string& id) {
  CAIRN_RETURN_IF_ERROR(check_writable());
  std::lock_guard write_lock(write_mu_);
  std::shared_ptr<const ModelManifest> old;
  {
    ReaderLock lock(mu_);
    auto it = models_.find(id);
    if (it == models_.end()) return not_found("model " + quote(id) + " is not in repository " + dir_);
    old = it->second;
  }
  if (old->retired_ns != 0) return Status::OK();
  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json body = {{"id", id}, {"retired_ns", std::max<int64_t>(now, 1)}};
  CAIRN_RETURN_IF_ERROR(append_durable(pfs::encode_record(pfs::RecordType::kRetire, body.dump()), 1)
                            .with_context("retiring model " + quote(id)));
  auto m = std::make_shared<ModelManifest>(*old);
  m->retired_ns = std::max<int64_t>(now, 1);
  WriterLock lock(mu_);
  auto it = models_.find(id);
  if (it != models_.end() && it->second->retired_ns == 0) {
    it->second = std::move(m);
    ++retired_;
  }
  return Status::OK();
}

namespace {

// Allocated bytes of fd within [begin, end), by SEEK_DATA/SEEK_HOLE. Whole file systems blocks:
// callers pass block-aligned ranges.
uint64_t allocated_bytes(int fd, uint64_t begin, uint64_t end) {
  uint64_t total = 0;
  auto pos = static_cast<off_t>(begin);
  while (static_cast<uint64_t>(pos) < end) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= end) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    uint64_t stop = hole < 0 ? end : std::min<uint64_t>(static_cast<uint64_t>(hole), end);
    total += stop - static_cast<uint64_t>(data);
    pos = static_cast<off_t>(stop);
  }
  return total;
}

struct Range {
  uint64_t begin, end;
};

// The block-aligned parts of [data_begin, data_end) that no live range touches.
std::vector<Range> dead_ranges(std::vector<Range> live, uint64_t data_begin, uint64_t data_end, uint64_t block) {
  std::sort(live.begin(), live.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  uint64_t pos = data_begin;
  auto gap = [&](uint64_t b, uint64_t e) {
    uint64_t ab = (b + block - 1) / block * block, ae = e / block * block;
    if (ab < ae) out.push_back({ab, ae});
  };
  for (const Range& r : live) {
    if (r.begin > pos) gap(pos, r.begin);
    pos = std::max(pos, r.end);
  }
  if (data_end > pos) gap(pos, data_end);
  return out;
}

}  // namespace

void Repository::Impl::reclaim(const std::vector<std::string>& dead, GcReport* report, OperationProgress* progress) {
  bool unlinked = false;
  for (const std::string& pack : dead) {
    if (owner_may_append(pack)) continue;
    forget_pack_file(pack);
    if (::unlink(join_path(packs_dir_, pack).c_str()) == 0) {
      unlinked = true;
      ++report->packs_deleted;
    }
  }
  // Files nothing references whose writers are gone: packs of commits that died before their
  // record, temporary files of a crash, claims of dead writers.
  std::vector<std::string> names;
  if (list_dir(packs_dir_, &names).ok()) {
    for (const std::string& name : names) {
      bool tmp = pfs::starts_with(name, pfs::kTmpPrefix);
      std::string owner = tmp ? file_writer(name.substr(pfs::kTmpPrefix.size())) : file_writer(name);
      if (!tmp && !(ends_with(name, kPackSuffix) || ends_with(name, pfs::kSegmentSuffix))) continue;
      if (tmp ? (!owner.empty() && (owner == wid() || coord_->alive(owner))) : owner_may_append(name)) continue;
      {
        ReaderLock lock(mu_);
        if (!tmp && packs_.count(name)) continue;
      }
      forget_pack_file(name);
      if (::unlink(join_path(packs_dir_, name).c_str()) == 0) {
        unlinked = true;
        if (!tmp) ++report->packs_deleted;
      }
    }
  }
  if (unlinked) (void)fsync_dir(packs_dir_);
  // The intents files of writers that are gone: their claims are void.
  std::vector<std::string> claims;
  std::string cdir = join_path(dir_, pfs::kClaimsDir);
  if (list_dir(cdir, &claims).ok()) {
    for (const std::string& c : claims) {
      std::string owner = file_writer(c.size() > 17 ? c.substr(0, 17) + "-" : c);
      if (owner.empty() || owner == wid() || coord_->alive(owner)) continue;
      ::unlink(join_path(cdir, c).c_str());
    }
  }

  // Dead ranges inside live packs that no live writer appends to.
  struct Plan {
    std::string pack;
    uint64_t data_begin;
    std::vector<Range> live;
  };
  std::vector<Plan> plan;
  std::vector<std::string> pack_names;
  {
    ReaderLock lock(mu_);
    for (const auto& [name, info] : packs_) pack_names.push_back(name);
  }
  std::unordered_set<std::string> skip;
  for (const std::string& name : pack_names)
    if (name != seg_name_ && owner_may_append(name)) skip.insert(name);
  size_t view_models = 0;
  {
    // Live: every location some manifest names. From the chunk index (every copy of a chunk), and
    // again from the manifests themselves: nothing is freed unless both agree it is dead, and a
    // disagreement (a counting error in the index) is reported.
    ReaderLock lock(mu_);
    view_models = models_.size();
    std::unordered_map<std::string, std::vector<Range>> live;
    std::set<std::tuple<std::string, uint64_t, uint64_t>> indexed;
    for (const auto& [h, info] : chunks_) {
      live[info.ref.pack].push_back({info.ref.offset, info.ref.offset + info.ref.stored_bytes()});
      indexed.emplace(info.ref.pack, info.ref.offset, info.ref.stored_bytes());
      for (const ChunkCopy& c : info.copies) {
        live[c.ref.pack].push_back({c.ref.offset, c.ref.offset + c.ref.stored_bytes()});
        indexed.emplace(c.ref.pack, c.ref.offset, c.ref.stored_bytes());
      }
    }
    std::unordered_set<const void*> lists;
    uint64_t missed = 0;
    std::string example;
    for (const auto& [model_id, m] : models_) {
      if (const void* list = m->tensors.identity(); list && !lists.insert(list).second) continue;
      const std::string& id = model_id;  // a structured binding cannot be captured (clang 14)
      for (const TensorManifest& t : m->tensors)
        for (const ChunkRef& chunk : t.chunks)
          for_each_location(chunk, [&](const ChunkRef& c) {
            if (indexed.count({c.pack, c.offset, c.stored_bytes()})) return;
            indexed.emplace(c.pack, c.offset, c.stored_bytes());
            live[c.pack].push_back({c.offset, c.offset + c.stored_bytes()});
            if (missed++ == 0) example = "model " + quote(id) + ", pack " + c.pack + " at " + std::to_string(c.offset);
          });
    }
    if (missed > 0)
      CAIRN_LOG_ERROR(
          "repository {}: gc: the chunk index lacked {} chunk location(s) that manifests name (e.g. {}); "
          "they were kept",
          dir_, missed, example);
    for (const auto& [name, info] : packs_) {
      if (skip.count(name)) continue;
      Plan p{name, info.data_begin, {}};
      if (auto it = live.find(name); it != live.end()) p.live = std::move(it->second);
      plan.push_back(std::move(p));
    }
  }
  if (progress) progress->begin_phase("reclaiming packs", ProgressUnit::kItems, plan.size());
  for (Plan& p : plan) {
    if (progress) progress->add(1);
    std::string path = join_path(packs_dir_, p.pack);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) continue;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) continue;
    uint64_t block = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : 4096;
    uint64_t end = static_cast<uint64_t>(st.st_size);
    if (p.pack == seg_name_) end = std::min(end, seg_end_);
    uint64_t punched = 0, ranges = 0;
    std::string where;
    for (const Range& r : dead_ranges(std::move(p.live), p.data_begin, end, block)) {
      uint64_t before = allocated_bytes(fd.get(), r.begin, r.end);
      if (before == 0) continue;
      if (::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.begin),
                      static_cast<off_t>(r.end - r.begin)) != 0) {
        report->bytes_unreclaimable += before;
        continue;
      }
      uint64_t freed = before - allocated_bytes(fd.get(), r.begin, r.end);
      report->bytes_punched += freed;
      punched += freed;
      if (ranges++ < 8)
        where += (where.empty() ? "" : " ") + std::to_string(r.begin) + "+" + std::to_string(r.end - r.begin);
    }
    if (punched > 0)
      CAIRN_LOG_INFO("repository {}: gc freed {} bytes in {} range(s) of pack {} ({}{}; the view held {} models)", dir_,
                     punched, ranges, p.pack, where, ranges > 8 ? " ..." : "", view_models);
  }
}

Status Repository::Impl::whole_view_locked() {
  // gc decides from the view what is dead, and frees what it does not reference: the view must hold
  // every model. A refresh that found logs compacted under it rebuilds the view only when no commit
  // holds the write lock, and else leaves that to the next refresh (reload_needed_); gc holds the
  // write lock here, so it rebuilds now. Deciding or freeing on the partial view punched holes over
  // chunks live models use (found by the torture harness: whole ranges of packs failed fsck after
  // gcs beside kill -9s).
  std::lock_guard rlock(refresh_mu_);
  bool reload = false;
  RefreshReport ignored;
  CAIRN_RETURN_IF_ERROR(read_logs(&ignored, &reload, /*own_too=*/false));
  if (reload || reload_needed_) {
    CAIRN_RETURN_IF_ERROR(wait_durable(queued_gen()));
    CAIRN_RETURN_IF_ERROR(load(nullptr));
    reload_needed_ = false;
  }
  return Status::OK();
}

Status Repository::Impl::revive_parents(
    const std::unordered_map<std::string, std::shared_ptr<const ModelManifest>>& removed_as_was, GcReport* report) {
  // Another writer planning against a view from before the remove records may have committed a
  // child of a model this gc removed: its record cannot be applied without its parent (it names the
  // parent's tensors by position), so no catalog would hold it, and the bytes it stored would be
  // freed as nobody's. Such parents come back, collected: their record as it was, then a collect.
  std::set<std::string> wanted;
  {
    ReaderLock lock(mu_);
    for (const Deferred& d : deferred_) {
      if (d.type != pfs::RecordType::kCommit) continue;
      nlohmann::json j = nlohmann::json::parse(d.payload, nullptr, false);
      if (!j.is_object() || !j.contains("parent") || !j["parent"].is_string()) continue;
      // The parent and, when gc removed them too, its ancestors.
      for (std::string p = j["parent"].get<std::string>(); removed_as_was.count(p) && !models_.count(p);) {
        if (!wanted.insert(p).second) break;
        p = removed_as_was.at(p)->parent;
      }
    }
  }
  if (wanted.empty()) return Status::OK();
  // Parents first: report->removed lists children before their parents.
  std::vector<std::string> order;
  for (auto it = report->removed.rbegin(); it != report->removed.rend(); ++it)
    if (wanted.count(*it)) order.push_back(*it);
  std::string records;
  std::vector<std::pair<pfs::RecordType, std::string>> applied;
  for (const std::string& id : order) {
    std::string commit = encode_commit(*removed_as_was.at(id), nullptr);
    std::string collect = nlohmann::json{{"id", id}}.dump();
    records += pfs::encode_record(pfs::RecordType::kCommit, commit);
    records += pfs::encode_record(pfs::RecordType::kCollect, collect);
    applied.emplace_back(pfs::RecordType::kCommit, std::move(commit));
    applied.emplace_back(pfs::RecordType::kCollect, std::move(collect));
  }
  CAIRN_RETURN_IF_ERROR(append_durable(records, applied.size()).with_context("gc: keeping parents of new children"));
  {
    WriterLock lock(mu_);
    for (const auto& [type, payload] : applied)
      CAIRN_RETURN_IF_ERROR(apply(type, payload, log_name_, 0, nullptr).with_context("gc: keeping a parent"));
    apply_deferred(nullptr);
  }
  for (const std::string& id : order) {
    CAIRN_LOG_WARN(
        "repository {}: gc: model {} was removed while another daemon committed a child of it; it is "
        "kept, collected (its lineage stays, its bytes that no child uses go)",
        dir_, quote(id));
    report->removed.erase(std::remove(report->removed.begin(), report->removed.end(), id), report->removed.end());
    report->collected.push_back(id);
  }
  return Status::OK();
}

Result<GcReport> Repository::Impl::gc(const GcSteps& steps) {
  CAIRN_RETURN_IF_ERROR(check_writable());
  std::lock_guard run_lock(gc_run_mu_);
  // Waiting for another process's maintenance holds none of the caller's locks (steps.deciding
  // comes after).
  CAIRN_RETURN_IF_ERROR(coord_->take_lease("gc of repository " + dir_, std::chrono::seconds(30)));
  struct Release {
    pfs::Coordination* c;
    ~Release() { c->release_lease(); }
  } release{coord_.get()};
  if (steps.deciding) CAIRN_RETURN_IF_ERROR(steps.deciding());
  RefreshReport ignored;
  CAIRN_RETURN_IF_ERROR(refresh(&ignored));
  std::unique_lock write_lock(write_mu_);
  CAIRN_RETURN_IF_ERROR(whole_view_locked());
  GcReport report;
  // Retired models with no descendant left go (children before parents); retired models that
  // live descendants still name as an ancestor stay, collected.
  std::vector<std::string> to_collect;
  uint64_t physical_before;
  {
    ReaderLock lock(mu_);
    physical_before = physical_bytes_;
    std::unordered_set<std::string> removing;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const auto& m = models_.at(*it);
      if (m->retired_ns == 0) continue;
      bool leaf = true;
      if (auto cit = children_.find(*it); cit != children_.end())
        for (const std::string& c : cit->second) leaf = leaf && removing.count(c) > 0;
      if (leaf) {
        removing.insert(*it);
        report.removed.push_back(*it);
      } else if (!m->collected) {
        to_collect.push_back(*it);
      }
    }
  }
  // 1. The records: collects, then removes (children first), durable before anything is freed.
  std::string records;
  for (const std::string& id : to_collect)
    records += pfs::encode_record(pfs::RecordType::kCollect, nlohmann::json{{"id", id}}.dump());
  for (const std::string& id : report.removed)
    records += pfs::encode_record(pfs::RecordType::kRemove, nlohmann::json{{"id", id}}.dump());
  uint64_t count = to_collect.size() + report.removed.size();
  if (count > 0) CAIRN_RETURN_IF_ERROR(append_durable(records, count).with_context("gc"));
  if (count > 0) {
    std::string ids;
    for (size_t k = 0; k < report.removed.size() && k < 40; ++k) ids += (k ? " " : "") + report.removed[k];
    CAIRN_LOG_INFO("repository {}: gc removes {} model(s) ({}{}) and collects {}", dir_, report.removed.size(), ids,
                   report.removed.size() > 40 ? " ..." : "", to_collect.size());
  }
  // 2. The catalog.
  std::vector<std::string> dead;
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> removed_as_was;  // before gc
  {
    WriterLock lock(mu_);
    for (const std::string& id : to_collect) {
      std::shared_ptr<const ModelManifest>& slot = models_.at(id);
      auto m = std::make_shared<ModelManifest>(*slot);
      collected_base_[id] = slot;
      release_data(*slot, &dead);
      m->tensors.clear();
      m->pack.clear();
      m->source_header.clear();
      m->collected = true;
      slot = std::move(m);
      report.collected.push_back(id);
    }
    for (const std::string& id : report.removed) {
      auto b = collected_base_.find(id);
      removed_as_was[id] = b != collected_base_.end() ? b->second : models_.at(id);
      collected_base_.erase(id);
      auto d = drop_model(id);
      dead.insert(dead.end(), d.begin(), d.end());
    }
    report.bytes_released = physical_before - physical_bytes_;
  }
  // The decision is made: what this process plans from here on sees the view without it (the
  // caller's commits and reads may go on through the grace; its own commits meanwhile count as
  // live below, as another writer's do).
  if (steps.decided) steps.decided(report);
  // 3. Other live writers may be planning against a view from before these records: give them the
  // grace, then look at their logs again (what they committed meanwhile counts as live).
  if (others_alive()) {
    write_lock.unlock();
    std::this_thread::sleep_for(options_.gc_grace);
    CAIRN_RETURN_IF_ERROR(refresh(&ignored));
    write_lock.lock();
    CAIRN_RETURN_IF_ERROR(whole_view_locked());  // reclaim frees what this view does not reference
    CAIRN_RETURN_IF_ERROR(revive_parents(removed_as_was, &report));
    ReaderLock lock(mu_);
    dead.erase(std::remove_if(dead.begin(), dead.end(),
                              [&](const std::string& p) CAIRN_REQUIRES_SHARED(mu_) { return packs_.count(p) > 0; }),
               dead.end());
  }
  // 4. The bytes: only what no record references.
  reclaim(dead, &report, steps.progress);
  return report;
}

Result<FsckReport> Repository::Impl::fsck(bool verify_data, OperationProgress* progress) const {
  FsckReport report;
  std::vector<std::shared_ptr<const ModelManifest>> models;
  std::unordered_map<std::string, uint64_t> data_begin;  // referenced pack -> start of its data
  {
    ReaderLock lock(mu_);
    for (const std::string& id : order_) models.push_back(models_.at(id));
    for (const auto& [name, info] : packs_) data_begin.emplace(name, info.data_begin);
  }
  report.models = models.size();
  if (progress) {
    uint64_t total = 0;
    for (const auto& m : models)
      for (const TensorManifest& t : m->tensors)
        for (const ChunkRef& c : t.chunks) total += verify_data ? c.length : 1;
    progress->begin_phase(verify_data ? "verifying chunks" : "checking chunk references",
                          verify_data ? ProgressUnit::kBytes : ProgressUnit::kItems, total);
  }
  std::unordered_map<std::string, std::vector<Range>> live;
  std::vector<uint8_t> buf;
  for (const auto& m : models) {
    for (const TensorManifest& t : m->tensors) {
      for (const ChunkRef& c : t.chunks) {
        ++report.chunks;
        if (progress) progress->add(verify_data ? c.length : 1);
        auto problem = [&](const std::string& detail) {
          report.dangling.push_back({m->id, t.name, c.pack, c.offset, c.stored_bytes(), detail});
        };
        // The chunk's own range, and a delta's base's: both must be there.
        std::string missing;
        for_each_location(c, [&](const ChunkRef& at) {
          live[at.pack].push_back({at.offset, at.offset + at.stored_bytes()});
          if (!missing.empty()) return;
          const std::string what =
              &at == &c ? "the chunk" : "its base " + at.hash.hex() + " at offset " + std::to_string(at.offset);
          std::string path = join_path(packs_dir_, at.pack);
          struct stat st {};
          if (::stat(path.c_str(), &st) != 0)
            missing = "pack file " + path + " is missing" + (&at == &c ? "" : " (" + what + ")");
          else if (at.offset + at.stored_bytes() > static_cast<uint64_t>(st.st_size))
            missing = what + " lies past the end of " + path + " (" + std::to_string(st.st_size) + " bytes)";
        });
        if (!missing.empty()) {
          problem(missing);
          continue;
        }
        if (!verify_data) continue;
        buf.resize(c.length);
        Status s = read_chunk(c, buf.data());
        if (!s.ok()) {
          problem(s.message());
          continue;
        }
        report.bytes_verified += c.length;
      }
    }
  }
  // Orphans: pack files no manifest references, and allocated ranges inside referenced packs that
  // no chunk covers (gc reclaims both).
  std::vector<std::string> names;
  CAIRN_RETURN_IF_ERROR(list_dir(packs_dir_, &names));
  std::sort(names.begin(), names.end());
  if (progress) progress->begin_phase("scanning packs for orphans", ProgressUnit::kItems, names.size());
  for (const std::string& name : names) {
    if (progress) progress->add(1);
    if (!ends_with(name, kPackSuffix) && !ends_with(name, pfs::kSegmentSuffix)) continue;
    if (name != seg_name_ && owner_may_append(name)) continue;  // another writer's: it may be mid-commit
    std::string path = join_path(packs_dir_, name);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) continue;
    auto size = static_cast<uint64_t>(st.st_size);
    auto pit = data_begin.find(name);
    auto lit = live.find(name);
    if (pit == data_begin.end() || lit == live.end()) {
      uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      report.orphaned.push_back({"", "", name, 0, size, "no manifest references this pack file"});
      report.orphaned_bytes += bytes;
      continue;
    }
    uint64_t block = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : 4096;
    for (const Range& r : dead_ranges(lit->second, pit->second, size, block)) {
      uint64_t bytes = allocated_bytes(fd.get(), r.begin, r.end);
      if (bytes == 0) continue;
      report.orphaned.push_back({"", "", name, r.begin, r.end - r.begin,
                                 std::to_string(bytes) + " allocated bytes no chunk reference covers"});
      report.orphaned_bytes += bytes;
    }
  }
  return report;
}

}  // namespace cairn
