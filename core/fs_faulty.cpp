// FaultyFileSystem (core/fs.hpp): the fault injector that wraps another FileSystem.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "core/fs.hpp"
#include "core/fs_internal.hpp"

namespace cairn {

using fs_internal::at;

// Effects act where they mean something: kShortWrite and kDropWrite on writes, kFlipBit on reads
// (and on writes, where it stores the bytes with one bit flipped); any other pairing (a kFlipBit
// rule on kSync, say) fails the operation as kFail would; kDelay delays any operation it matches. kSync rules match
// File::sync and sync_dir; kRename rules match either name. truncate, size, make_dirs, list, exists and remove_all are
// never changed.

struct FaultyFileSystem::State {
  mutable std::mutex mu;
  std::vector<RuleState> rules;  // skip and times count down in place
  uint64_t injected = 0;

  // The effect to apply to one operation on path (or on either of two paths), if a rule matches.
  // A kDelay rule sleeps here (outside the lock) and lets the operation run: nullopt.
  std::optional<Rule> match(Op op, const std::string& path, const std::string& path2 = {}) {
    std::optional<Rule> hit;
    {
      std::lock_guard lock(mu);
      for (RuleState& s : rules) {
        Rule& r = s.rule;
        if (r.op != op || r.times == 0) continue;
        if (!r.path_contains.empty() && path.find(r.path_contains) == std::string::npos &&
            (path2.empty() || path2.find(r.path_contains) == std::string::npos))
          continue;
        if (r.skip > 0) {
          --r.skip;  // let this one through; a later rule may still match it
          continue;
        }
        if (r.times > 0) --r.times;
        ++injected;
        ++s.injected;
        hit = r;
        break;
      }
    }
    if (hit && hit->effect == Effect::kDelay) {
      std::this_thread::sleep_for(std::chrono::milliseconds(hit->delay_ms));
      return std::nullopt;
    }
    return hit;
  }
};

namespace {

using Faulty = FaultyFileSystem;

constexpr Faulty::Named<Faulty::Op> kOps[] = {
    {"open", Faulty::Op::kOpen},     {"write", Faulty::Op::kWrite},       {"read", Faulty::Op::kRead},
    {"sync", Faulty::Op::kSync},     {"allocate", Faulty::Op::kAllocate}, {"rename", Faulty::Op::kRename},
    {"unlink", Faulty::Op::kUnlink},
};
constexpr Faulty::Named<Faulty::Effect> kEffects[] = {
    {"fail", Faulty::Effect::kFail},        {"short_write", Faulty::Effect::kShortWrite},
    {"flip_bit", Faulty::Effect::kFlipBit}, {"drop_write", Faulty::Effect::kDropWrite},
    {"delay", Faulty::Effect::kDelay},
};
constexpr Faulty::Named<int> kErrors[] = {
    {"EIO", EIO},
    {"ENOSPC", ENOSPC},
    {"EDQUOT", EDQUOT},
    {"EROFS", EROFS},
    {"EACCES", EACCES},
    {"EPERM", EPERM},
    {"ENOENT", ENOENT},
    {"EEXIST", EEXIST},
    {"EBUSY", EBUSY},
    {"EAGAIN", EAGAIN},
    {"EINTR", EINTR},
    {"ETIMEDOUT", ETIMEDOUT},
    {"ENOMEM", ENOMEM},
    {"EMFILE", EMFILE},
    {"ENFILE", ENFILE},
    {"EFBIG", EFBIG},
    {"ENODEV", ENODEV},
    {"ENXIO", ENXIO},
    {"ESTALE", ESTALE},
    {"EINVAL", EINVAL},
    {"EBADF", EBADF},
    {"EXDEV", EXDEV},
    {"ENAMETOOLONG", ENAMETOOLONG},
};

Status injected_error(const std::string& what, const Faulty::Rule& r) {
  const char* name = "errno";
  for (const auto& e : kErrors)
    if (e.value == r.err) name = e.name;
  return errno_status(what + " (injected " + name + ")", r.err);
}

struct AlignedDelete {
  void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t(kDirectAlignment)); }
};

// Flips one bit of buf's first byte: a byte the caller uses when it reads from where its data starts.
void flip_bit(void* buf, size_t len) {
  if (len == 0) return;
  static_cast<uint8_t*>(buf)[0] ^= 0x10;
}

// What a flipped read does to the bytes it returns. A direct read may start and end in alignment
// padding around the bytes its caller uses (a repository chunk at an unaligned offset), so there one
// bit of every byte is flipped: whichever bytes the caller uses are wrong. Else one bit of the first.
void flip_read(void* buf, size_t len, bool direct) {
  if (!direct) return flip_bit(buf, len);
  auto* p = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < len; ++i) p[i] ^= 0x10;
}

class FaultyFile final : public File {
 public:
  FaultyFile(std::unique_ptr<File> base, std::shared_ptr<Faulty::State> state)
      : base_(std::move(base)), state_(std::move(state)) {}

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }

  Status pwrite(const void* buf, size_t len, uint64_t offset) override {
    std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kWrite, path());
    if (!r) return base_->pwrite(buf, len, offset);
    return faulty_write(*r, buf, len, offset);
  }

  Status pread(void* buf, size_t len, uint64_t offset, size_t* got) override {
    *got = 0;
    std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kRead, path());
    if (!r) return base_->pread(buf, len, offset, got);
    if (r->effect != Faulty::Effect::kFlipBit) return injected_error("reading " + at(path(), offset), *r);
    CAIRN_RETURN_IF_ERROR(base_->pread(buf, len, offset, got));
    flip_read(buf, *got, direct());
    return Status::OK();
  }

  // Requests no rule matches go to the base as one batch; the others are handled one by one
  // afterwards. The first error is returned, after every request has been tried (the header
  // allows some requests to have completed on failure).
  Status write_many(std::span<const IoRequest> reqs) override {
    std::vector<IoRequest> plain;
    std::vector<std::pair<IoRequest, Faulty::Rule>> hit;
    for (const IoRequest& q : reqs) {
      std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kWrite, path());
      if (r) {
        hit.emplace_back(q, *r);
      } else {
        plain.push_back(q);
      }
    }
    if (hit.empty()) return base_->write_many(reqs);
    Status first = base_->write_many(plain);
    for (const auto& [q, r] : hit) {
      Status s = faulty_write(r, q.buf, q.len, q.offset);
      if (first.ok()) first = s;
    }
    return first;
  }

  Status read_many(std::span<const IoRequest> reqs) override {
    std::vector<IoRequest> plain;
    std::vector<IoRequest> flipped;
    Status first;
    for (const IoRequest& q : reqs) {
      std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kRead, path());
      if (!r) {
        plain.push_back(q);
      } else if (r->effect == Faulty::Effect::kFlipBit) {
        plain.push_back(q);
        flipped.push_back(q);
      } else if (first.ok()) {
        first = injected_error("reading " + at(path(), q.offset), *r);
      }
    }
    if (plain.size() == reqs.size() && flipped.empty()) return base_->read_many(reqs);
    Status s = base_->read_many(plain);
    if (s.ok()) {
      for (const IoRequest& q : flipped) flip_read(q.buf, q.len, direct());
    }
    return first.ok() ? s : first;
  }

  Status sync(bool data_only) override {
    if (auto r = state_->match(Faulty::Op::kSync, path())) return injected_error("syncing " + path(), *r);
    return base_->sync(data_only);
  }

  Status allocate(uint64_t offset, uint64_t len) override {
    if (auto r = state_->match(Faulty::Op::kAllocate, path()))
      return injected_error("reserving " + std::to_string(len) + " bytes of " + at(path(), offset), *r);
    return base_->allocate(offset, len);
  }

  Status truncate(uint64_t size) override { return base_->truncate(size); }
  Result<uint64_t> size() override { return base_->size(); }

 private:
  Status faulty_write(const Faulty::Rule& r, const void* buf, size_t len, uint64_t offset) {
    const std::string what = "writing " + at(path(), offset);
    switch (r.effect) {
      case Faulty::Effect::kDropWrite:
        return Status::OK();
      case Faulty::Effect::kShortWrite: {
        size_t half = len / 2;
        if (direct()) half -= half % kDirectAlignment;  // the base would refuse a misaligned half
        if (half > 0) CAIRN_RETURN_IF_ERROR(base_->pwrite(buf, half, offset));
        return errno_status(what + ": only " + std::to_string(half) + " of " + std::to_string(len) +
                                " bytes written (injected torn write)",
                            EIO);
      }
      case Faulty::Effect::kFlipBit: {
        // Stores corrupted bytes and leaves the caller's buffer intact. The copy is aligned so
        // that a direct file accepts it.
        std::unique_ptr<uint8_t, AlignedDelete> copy(
            static_cast<uint8_t*>(::operator new(std::max<size_t>(len, 1), std::align_val_t(kDirectAlignment))));
        std::memcpy(copy.get(), buf, len);
        flip_bit(copy.get(), len);
        return base_->pwrite(copy.get(), len, offset);
      }
      case Faulty::Effect::kFail:
      case Faulty::Effect::kDelay:  // handled in match()
        break;
    }
    return injected_error(what, r);
  }

  std::unique_ptr<File> base_;
  std::shared_ptr<Faulty::State> state_;
};

}  // namespace

std::span<const Faulty::Named<Faulty::Op>> FaultyFileSystem::op_names() { return kOps; }
std::span<const Faulty::Named<Faulty::Effect>> FaultyFileSystem::effect_names() { return kEffects; }
std::span<const Faulty::Named<int>> FaultyFileSystem::error_names() { return kErrors; }

FaultyFileSystem::FaultyFileSystem(FileSystem& base) : base_(base), state_(std::make_shared<State>()) {}
FaultyFileSystem::~FaultyFileSystem() = default;

void FaultyFileSystem::add(Rule rule) {
  std::lock_guard lock(state_->mu);
  state_->rules.push_back(RuleState{std::move(rule), 0});
}

std::vector<FaultyFileSystem::RuleState> FaultyFileSystem::rules() const {
  std::lock_guard lock(state_->mu);
  return state_->rules;
}

bool is_posix(FileSystem& fs) {
  if (&fs == &posix_fs()) return true;
  auto* faulty = dynamic_cast<FaultyFileSystem*>(&fs);
  return faulty != nullptr && is_posix(faulty->base());
}

void FaultyFileSystem::clear() {
  std::lock_guard lock(state_->mu);
  state_->rules.clear();
}

uint64_t FaultyFileSystem::injected() const {
  std::lock_guard lock(state_->mu);
  return state_->injected;
}

Result<std::unique_ptr<File>> FaultyFileSystem::open(const std::string& path, unsigned flags) {
  if (auto r = state_->match(Op::kOpen, path)) return injected_error("opening " + path, *r);
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<File> f, base_.open(path, flags));
  return std::unique_ptr<File>(new FaultyFile(std::move(f), state_));
}

Status FaultyFileSystem::rename(const std::string& from, const std::string& to) {
  if (auto r = state_->match(Op::kRename, from, to)) return injected_error("renaming " + from + " to " + to, *r);
  return base_.rename(from, to);
}

Status FaultyFileSystem::unlink(const std::string& path) {
  if (auto r = state_->match(Op::kUnlink, path)) return injected_error("deleting " + path, *r);
  return base_.unlink(path);
}

Status FaultyFileSystem::sync_dir(const std::string& dir) {
  if (auto r = state_->match(Op::kSync, dir)) return injected_error("syncing directory " + dir, *r);
  return base_.sync_dir(dir);
}

Status FaultyFileSystem::make_dirs(const std::string& dir, bool private_dir) {
  return base_.make_dirs(dir, private_dir);
}

Result<std::vector<std::string>> FaultyFileSystem::list(const std::string& dir) { return base_.list(dir); }

bool FaultyFileSystem::exists(const std::string& path) { return base_.exists(path); }

Status FaultyFileSystem::remove_all(const std::string& dir) { return base_.remove_all(dir); }

}  // namespace cairn
