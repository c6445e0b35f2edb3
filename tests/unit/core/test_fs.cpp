// Tests for the filesystem/device seam (core/fs.hpp): posix_fs() on a real temporary directory
// (buffered and O_DIRECT, batched I/O through io_uring), MemoryFileSystem's POSIX-like semantics,
// and FaultyFileSystem's rules and effects.
#include <sys/stat.h>
#include <sys/vfs.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/fs.hpp"
#include "unit/temp_dir.hpp"

namespace cairn {
namespace {

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("cairn-test-fs") {}
};

// A buffer aligned for direct I/O.
struct AlignedBuf {
  struct Free {
    void operator()(char* p) const { ::operator delete(p, std::align_val_t(kDirectAlignment)); }
  };
  std::unique_ptr<char, Free> p;
  size_t n;
  explicit AlignedBuf(size_t size)
      : p(static_cast<char*>(::operator new(size, std::align_val_t(kDirectAlignment)))), n(size) {
    std::memset(p.get(), 0, n);
  }
  char* data() { return p.get(); }
  std::string str() const { return std::string(p.get(), n); }
  void fill(uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      p.get()[i] = static_cast<char>(x & 0xFF);
    }
  }
};

std::unique_ptr<File> open_ok(FileSystem& fs, const std::string& path, unsigned flags) {
  auto r = fs.open(path, flags);
  INFO(path << ": " << r.status().to_string());
  REQUIRE(r.ok());
  return std::move(r).value();
}

void require_ok(const Status& s) {
  INFO(s.to_string());
  REQUIRE(s.ok());
}

std::string read_all(File& f) {
  auto size = f.size();
  REQUIRE(size.ok());
  std::string out(*size, '\0');
  size_t got = 0;
  require_ok(f.pread(out.data(), out.size(), 0, &got));
  REQUIRE(got == out.size());
  return out;
}

void write_str(FileSystem& fs, const std::string& path, const std::string& data) {
  auto f = open_ok(fs, path, kCreate | kTruncate);
  require_ok(f->pwrite(data.data(), data.size(), 0));
}

std::string read_str(FileSystem& fs, const std::string& path) {
  auto f = open_ok(fs, path, kRead);
  return read_all(*f);
}

// Number of bits in which a and b differ.
int bits_differing(const std::string& a, const std::string& b) {
  REQUIRE(a.size() == b.size());
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += __builtin_popcount(static_cast<unsigned char>(a[i] ^ b[i]));
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// posix_fs()

TEST_CASE("posix files round-trip bytes, buffered and direct", "[fs][posix]") {
  TempDir tmp;
  FileSystem& fs = posix_fs();

  SECTION("buffered, at odd offsets") {
    auto f = open_ok(fs, tmp.path + "/plain", kCreate);
    CHECK_FALSE(f->direct());
    CHECK(f->path() == tmp.path + "/plain");
    std::string data = "hello, seam";
    require_ok(f->pwrite(data.data(), data.size(), 3));
    CHECK(*f->size() == 3 + data.size());
    std::string back(data.size(), '\0');
    size_t got = 0;
    require_ok(f->pread(back.data(), back.size(), 3, &got));
    CHECK(got == data.size());
    CHECK(back == data);
    // Past the end: fewer bytes, not an error.
    require_ok(f->pread(back.data(), back.size(), 10, &got));
    CHECK(got == 4);
    require_ok(f->sync(false));
    require_ok(f->sync(true));
    require_ok(f->allocate(0, 1 << 20));
    CHECK(*f->size() == 1 << 20);
    require_ok(f->truncate(5));
    CHECK(*f->size() == 5);
  }

  SECTION("direct (O_DIRECT on ext4/xfs, buffered where refused)") {
    auto f = open_ok(fs, tmp.path + "/direct", kCreate | kDirect);
    // ext4 takes O_DIRECT; tmpfs would refuse it and the file falls back to buffered I/O.
    struct statfs sfs {};
    REQUIRE(::statfs(tmp.path.c_str(), &sfs) == 0);
    constexpr long kExt4Magic = 0xEF53;
    if (sfs.f_type == kExt4Magic) CHECK(f->direct());
    INFO("direct() = " << f->direct());
    AlignedBuf out(3 * kDirectAlignment);
    out.fill(7);
    require_ok(f->pwrite(out.data(), out.n, kDirectAlignment));
    require_ok(f->sync(true));
    CHECK(*f->size() == 4 * kDirectAlignment);
    AlignedBuf in(3 * kDirectAlignment);
    size_t got = 0;
    require_ok(f->pread(in.data(), in.n, kDirectAlignment, &got));
    CHECK(got == in.n);
    CHECK(in.str() == out.str());
    // Reopened buffered, the bytes are the same.
    auto g = open_ok(fs, tmp.path + "/direct", kRead);
    CHECK(read_all(*g).substr(kDirectAlignment) == out.str());
  }

  SECTION("open flags") {
    auto r = fs.open(tmp.path + "/missing", kRead);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains(tmp.path + "/missing"));
    write_str(fs, tmp.path + "/f", "abc");
    auto ex = fs.open(tmp.path + "/f", kCreate | kExclusive);
    REQUIRE_FALSE(ex.ok());
    CHECK(ex.status().code() == StatusCode::kExists);
    auto t = open_ok(fs, tmp.path + "/f", kReadWrite | kTruncate);
    CHECK(*t->size() == 0);
    auto ro = open_ok(fs, tmp.path + "/f", kRead);
    CHECK_FALSE(ro->pwrite("x", 1, 0).ok());
  }
}

TEST_CASE("direct files reject misaligned requests, naming what is misaligned", "[fs][posix]") {
  TempDir tmp;
  auto f = open_ok(posix_fs(), tmp.path + "/direct", kCreate | kDirect);
  if (!f->direct()) {
    WARN("the filesystem of " << tmp.path << " refuses O_DIRECT; nothing to check");
    return;
  }
  AlignedBuf buf(2 * kDirectAlignment);
  size_t got = 0;

  Status s = f->pwrite(buf.data() + 1, kDirectAlignment, 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("buffer address"));

  s = f->pwrite(buf.data(), 100, 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("length 100"));

  s = f->pread(buf.data(), kDirectAlignment, 512, &got);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("offset 512"));
  CHECK_THAT(s.message(), !Catch::Contains("length"));

  std::vector<IoRequest> reqs = {{buf.data(), kDirectAlignment, 0}, {buf.data() + 8, kDirectAlignment, 8192}};
  s = f->write_many(reqs);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  s = f->read_many(reqs);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(*f->size() == 0);  // nothing was written
}

TEST_CASE("a direct read past the end of a file whose length is not a block multiple returns what is there",
          "[fs][posix]") {
  // A pack of 4096 + 752 bytes (another writer may still be appending to it): a direct read of its
  // first 3 blocks gets 4,848 bytes, not EINVAL from reading on at the misaligned end (found by the
  // torture harness: "reading ...pack at 1180400: Invalid argument").
  TempDir tmp;
  const std::string path = tmp.path + "/short";
  {
    auto w = open_ok(posix_fs(), path, kCreate);
    std::vector<uint8_t> bytes(kDirectAlignment + 752, 0x3c);
    REQUIRE(w->pwrite(bytes.data(), bytes.size(), 0).ok());
  }
  auto f = open_ok(posix_fs(), path, kDirect);
  if (!f->direct()) {
    WARN("the filesystem of " << tmp.path << " refuses O_DIRECT; nothing to check");
    return;
  }
  AlignedBuf buf(3 * kDirectAlignment);
  size_t got = 0;
  Status s = f->pread(buf.data(), 3 * kDirectAlignment, 0, &got);
  INFO(s.to_string());
  REQUIRE(s.ok());
  CHECK(got == kDirectAlignment + 752);
  CHECK(buf.data()[kDirectAlignment + 751] == 0x3c);
}

TEST_CASE("read_many and write_many move 100 requests", "[fs][posix]") {
  TempDir tmp;
  unsigned flags = GENERATE(unsigned{kCreate}, unsigned{kCreate | kDirect});
  auto f = open_ok(posix_fs(), tmp.path + "/batch", flags);
  INFO("flags " << flags << ", direct() = " << f->direct());
  constexpr size_t kN = 100;
  // Varied sizes (1..3 blocks), written in reverse order of their offsets.
  std::vector<AlignedBuf> out;
  std::vector<IoRequest> writes;
  uint64_t offset = 0;
  for (size_t i = 0; i < kN; ++i) {
    out.emplace_back((1 + i % 3) * kDirectAlignment);
    out.back().fill(i + 1);
  }
  for (size_t i = 0; i < kN; ++i) {
    writes.push_back({out[i].data(), out[i].n, offset});
    offset += out[i].n;
  }
  std::reverse(writes.begin(), writes.end());
  require_ok(f->write_many(writes));
  CHECK(*f->size() == offset);

  std::vector<AlignedBuf> in;
  std::vector<IoRequest> reads;
  for (size_t i = 0; i < kN; ++i) in.emplace_back(out[i].n);
  offset = 0;
  for (size_t i = 0; i < kN; ++i) {
    reads.push_back({in[i].data(), in[i].n, offset});
    offset += in[i].n;
  }
  require_ok(f->read_many(reads));
  for (size_t i = 0; i < kN; ++i) {
    INFO("request " << i);
    REQUIRE(in[i].str() == out[i].str());
  }
  // Empty batches and zero-length requests are fine.
  require_ok(f->read_many({}));
  require_ok(f->write_many(std::vector<IoRequest>{{out[0].data(), 0, 0}, {out[1].data(), 0, 4096}}));
}

TEST_CASE("one posix file takes batches from several threads at once", "[fs][posix]") {
  TempDir tmp;
  auto f = open_ok(posix_fs(), tmp.path + "/shared", kCreate);
  constexpr int kThreads = 4;
  constexpr size_t kPerThread = 40;
  constexpr size_t kLen = 8192;
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<AlignedBuf> bufs;
      std::vector<IoRequest> reqs;
      for (size_t i = 0; i < kPerThread; ++i) {
        bufs.emplace_back(kLen);
        std::memset(bufs.back().data(), 'a' + t, kLen);
      }
      for (size_t i = 0; i < kPerThread; ++i) reqs.push_back({bufs[i].data(), kLen, (i * kThreads + t) * kLen});
      results[t] = f->write_many(reqs);
      if (!results[t].ok()) return;
      for (auto& b : bufs) std::memset(b.data(), 0, kLen);
      results[t] = f->read_many(reqs);
      for (auto& b : bufs)
        if (results[t].ok() && b.str() != std::string(kLen, static_cast<char>('a' + t)))
          results[t] = internal_error("thread " + std::to_string(t) + " read back other bytes");
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : results) require_ok(s);
}

TEST_CASE("a read past the end of the file in read_many is an error", "[fs][posix]") {
  TempDir tmp;
  auto f = open_ok(posix_fs(), tmp.path + "/short", kCreate);
  std::string data(10000, 'x');
  require_ok(f->pwrite(data.data(), data.size(), 0));
  std::string a(4096, '\0'), b(4096, '\0'), c(4096, '\0');
  SECTION("in a batch") {
    std::vector<IoRequest> reqs = {{a.data(), 4096, 0}, {b.data(), 4096, 4096}, {c.data(), 4096, 8192}};
    Status s = f->read_many(reqs);
    CHECK(s.code() == StatusCode::kIo);
    CHECK_THAT(s.message(), Catch::Contains(tmp.path + "/short"));
  }
  SECTION("alone") {
    std::vector<IoRequest> reqs = {{c.data(), 4096, 8192}};
    CHECK(f->read_many(reqs).code() == StatusCode::kIo);
  }
  SECTION("entirely past the end") {
    std::vector<IoRequest> reqs = {{a.data(), 4096, 0}, {c.data(), 4096, 1 << 20}};
    CHECK(f->read_many(reqs).code() == StatusCode::kIo);
  }
}

TEST_CASE("posix directories: make_dirs, list, rename, unlink, sync_dir, remove_all", "[fs][posix]") {
  TempDir tmp;
  FileSystem& fs = posix_fs();
  std::string d = tmp.path + "/a/b/c";
  require_ok(fs.make_dirs(d));
  require_ok(fs.make_dirs(d));  // already there: fine
  require_ok(fs.make_dirs(tmp.path + "/private", /*private_dir=*/true));
  struct stat st {};
  REQUIRE(::stat((tmp.path + "/private").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(fs.exists(d));

  write_str(fs, d + "/zeta", "z");
  write_str(fs, d + "/alpha", "a");
  require_ok(fs.make_dirs(d + "/mid"));
  auto names = fs.list(d);
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"alpha", "mid", "zeta"});
  CHECK(fs.list(tmp.path + "/nope").status().code() == StatusCode::kNotFound);

  require_ok(fs.rename(d + "/alpha", d + "/zeta"));  // over an existing file
  CHECK_FALSE(fs.exists(d + "/alpha"));
  CHECK(read_str(fs, d + "/zeta") == "a");
  CHECK(fs.rename(d + "/alpha", d + "/beta").code() == StatusCode::kNotFound);

  require_ok(fs.unlink(d + "/zeta"));
  CHECK(fs.unlink(d + "/zeta").code() == StatusCode::kNotFound);
  require_ok(fs.sync_dir(d));
  CHECK_FALSE(fs.sync_dir(tmp.path + "/nope").ok());

  require_ok(fs.remove_all(tmp.path + "/a"));
  CHECK_FALSE(fs.exists(tmp.path + "/a"));
  require_ok(fs.remove_all(tmp.path + "/a"));  // missing: fine
}

// ---------------------------------------------------------------------------------------------
// MemoryFileSystem

TEST_CASE("memory files: round trip, directories, flags", "[fs][memory]") {
  MemoryFileSystem fs;
  CHECK(fs.open("/d/f", kCreate).status().code() == StatusCode::kNotFound);  // no directory
  require_ok(fs.make_dirs("/d/e"));
  CHECK(fs.exists("/d"));
  CHECK(fs.exists("/d/e"));
  auto f = open_ok(fs, "/d/f", kCreate);
  CHECK_FALSE(f->direct());
  require_ok(f->pwrite("world", 5, 6));
  require_ok(f->pwrite("hello", 5, 0));
  CHECK(read_all(*f) == std::string("hello\0world", 11));
  CHECK(fs.bytes_used() == 11);
  size_t got = 0;
  char buf[8];
  require_ok(f->pread(buf, sizeof buf, 8, &got));
  CHECK(got == 3);

  CHECK(fs.open("/d/f", kCreate | kExclusive).status().code() == StatusCode::kExists);
  CHECK(fs.open("/d/g", kRead).status().code() == StatusCode::kNotFound);
  auto ro = open_ok(fs, "/d/f", kRead);
  CHECK_FALSE(ro->pwrite("x", 1, 0).ok());
  auto t = open_ok(fs, "/d/f", kReadWrite | kTruncate);
  CHECK(*f->size() == 0);  // the same file
  CHECK(fs.bytes_used() == 0);

  write_str(fs, "/d/b", "b");
  auto names = fs.list("/d");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"b", "e", "f"});
  CHECK(fs.list("/nope").status().code() == StatusCode::kNotFound);
  require_ok(fs.sync_dir("/d"));
  require_ok(f->sync(false));

  std::string x(100, 'x');
  std::vector<IoRequest> w = {{x.data(), 50, 0}, {x.data(), 50, 50}};
  require_ok(f->write_many(w));
  std::string a(50, '\0'), b(60, '\0');
  std::vector<IoRequest> r = {{a.data(), 50, 0}, {b.data(), 60, 50}};
  CHECK(f->read_many(r).code() == StatusCode::kIo);  // past the end

  require_ok(fs.remove_all("/d"));
  CHECK_FALSE(fs.exists("/d"));
  CHECK_FALSE(fs.exists("/d/f"));
  require_ok(fs.remove_all("/d"));
}

TEST_CASE("memory capacity: writes and allocate beyond it are kNoSpace", "[fs][memory]") {
  MemoryFileSystem fs(1000);
  require_ok(fs.make_dirs("/m"));
  auto f = open_ok(fs, "/m/a", kCreate);
  std::string data(600, 'a');
  require_ok(f->pwrite(data.data(), data.size(), 0));
  auto g = open_ok(fs, "/m/b", kCreate);
  Status s = g->pwrite(data.data(), data.size(), 0);
  CHECK(s.code() == StatusCode::kNoSpace);
  CHECK_THAT(s.message(), Catch::Contains("/m/b"));
  CHECK(*g->size() == 0);  // nothing stored
  CHECK(g->allocate(0, 401).code() == StatusCode::kNoSpace);
  require_ok(g->allocate(0, 400));
  CHECK(fs.bytes_used() == 1000);
  // Overwriting in place needs no more space.
  require_ok(f->pwrite(data.data(), 600, 0));
  // Freeing space makes room again.
  require_ok(f->truncate(100));
  require_ok(g->pwrite(data.data(), 500, 400));
  CHECK(fs.bytes_used() == 1000);
}

TEST_CASE("memory rename replaces the target, unlink keeps open files readable", "[fs][memory]") {
  MemoryFileSystem fs;
  require_ok(fs.make_dirs("/r"));
  write_str(fs, "/r/old", "old contents");
  write_str(fs, "/r/new", "new");
  auto held = open_ok(fs, "/r/old", kRead);
  require_ok(fs.rename("/r/new", "/r/old"));
  CHECK_FALSE(fs.exists("/r/new"));
  CHECK(read_str(fs, "/r/old") == "new");
  // The descriptor opened before the rename still sees the replaced file.
  CHECK(read_all(*held) == "old contents");
  CHECK(fs.bytes_used() == 3 + 12);
  held.reset();
  CHECK(fs.bytes_used() == 3);

  CHECK(fs.rename("/r/missing", "/r/x").code() == StatusCode::kNotFound);
  CHECK(fs.rename("/r/old", "/nodir/x").code() == StatusCode::kNotFound);

  // Unlink while open: the name goes, the data stays until the file is closed.
  auto open = open_ok(fs, "/r/old", kReadWrite);
  require_ok(fs.unlink("/r/old"));
  CHECK_FALSE(fs.exists("/r/old"));
  CHECK(fs.unlink("/r/old").code() == StatusCode::kNotFound);
  CHECK(read_all(*open) == "new");
  require_ok(open->pwrite("!", 1, 3));
  CHECK(read_all(*open) == "new!");
  CHECK(fs.bytes_used() == 4);
  // A new file of the same name is another file.
  write_str(fs, "/r/old", "fresh");
  CHECK(read_all(*open) == "new!");
  open.reset();
  CHECK(fs.bytes_used() == 5);
}

// ---------------------------------------------------------------------------------------------
// FaultyFileSystem

TEST_CASE("faulty fs: each effect", "[fs][faulty]") {
  MemoryFileSystem mem;
  require_ok(mem.make_dirs("/x"));
  FaultyFileSystem fs(mem);
  std::string data = "0123456789abcdef";
  using Op = FaultyFileSystem::Op;
  using Effect = FaultyFileSystem::Effect;

  SECTION("kFail with ENOSPC on a write is kNoSpace") {
    fs.add({.op = Op::kWrite, .effect = Effect::kFail, .err = ENOSPC});
    auto f = open_ok(fs, "/x/f", kCreate);
    Status s = f->pwrite(data.data(), data.size(), 0);
    CHECK(s.code() == StatusCode::kNoSpace);
    CHECK_THAT(s.message(), Catch::Contains("/x/f"));
    CHECK(*f->size() == 0);
    require_ok(f->pwrite(data.data(), data.size(), 0));  // times = 1: the next one passes
    CHECK(fs.injected() == 1);
  }
  SECTION("kFail with EIO on a read is kIo") {
    write_str(mem, "/x/f", data);
    fs.add({.op = Op::kRead});
    auto f = open_ok(fs, "/x/f", kRead);
    std::string buf(16, '\0');
    size_t got = 0;
    CHECK(f->pread(buf.data(), buf.size(), 0, &got).code() == StatusCode::kIo);
  }
  SECTION("kShortWrite stores the first half and fails") {
    fs.add({.op = Op::kWrite, .effect = Effect::kShortWrite});
    auto f = open_ok(fs, "/x/f", kCreate);
    Status s = f->pwrite(data.data(), data.size(), 0);
    CHECK(s.code() == StatusCode::kIo);
    CHECK(read_str(mem, "/x/f") == data.substr(0, 8));
  }
  SECTION("kFlipBit flips one bit of what a read returns") {
    write_str(mem, "/x/f", data);
    fs.add({.op = Op::kRead, .effect = Effect::kFlipBit});
    auto f = open_ok(fs, "/x/f", kRead);
    std::string buf(16, '\0');
    size_t got = 0;
    require_ok(f->pread(buf.data(), buf.size(), 0, &got));
    CHECK(got == 16);
    CHECK(bits_differing(buf, data) == 1);
    CHECK(read_str(mem, "/x/f") == data);  // the stored bytes are intact
  }
  SECTION("kDropWrite reports success and stores nothing") {
    write_str(mem, "/x/f", std::string(16, '.'));
    fs.add({.op = Op::kWrite, .effect = Effect::kDropWrite});
    auto f = open_ok(fs, "/x/f", kReadWrite);
    require_ok(f->pwrite(data.data(), data.size(), 0));
    CHECK(read_str(mem, "/x/f") == std::string(16, '.'));
  }
  SECTION("open, sync, sync_dir, allocate, rename and unlink fail with the given errno") {
    write_str(mem, "/x/f", data);
    fs.add({.op = Op::kOpen, .path_contains = "/x/f", .err = EACCES});
    CHECK(fs.open("/x/f", kRead).status().code() == StatusCode::kPermission);
    auto f = open_ok(fs, "/x/f", kReadWrite);
    fs.add({.op = Op::kSync, .times = 2});
    CHECK(f->sync(true).code() == StatusCode::kIo);
    CHECK(fs.sync_dir("/x").code() == StatusCode::kIo);
    require_ok(fs.sync_dir("/x"));
    fs.add({.op = Op::kAllocate, .err = ENOSPC});
    CHECK(f->allocate(0, 100).code() == StatusCode::kNoSpace);
    fs.add({.op = Op::kRename, .path_contains = "/x/g"});  // matches the target name too
    CHECK_FALSE(fs.rename("/x/f", "/x/g").ok());
    CHECK(mem.exists("/x/f"));
    fs.add({.op = Op::kUnlink});
    CHECK_FALSE(fs.unlink("/x/f").ok());
    CHECK(mem.exists("/x/f"));
    CHECK(fs.injected() == 6);
    require_ok(fs.unlink("/x/f"));
  }
}

TEST_CASE("faulty fs: skip, times and path filtering", "[fs][faulty]") {
  MemoryFileSystem mem;
  require_ok(mem.make_dirs("/x"));
  FaultyFileSystem fs(mem);
  using Op = FaultyFileSystem::Op;
  auto a = open_ok(fs, "/x/packs-a", kCreate);
  auto b = open_ok(fs, "/x/manifest-b", kCreate);

  SECTION("skip lets the first matches through, times bounds the failures") {
    fs.add({.op = Op::kWrite, .skip = 2, .times = 2});
    CHECK(a->pwrite("1", 1, 0).ok());
    CHECK(b->pwrite("2", 1, 0).ok());
    CHECK_FALSE(a->pwrite("3", 1, 0).ok());
    CHECK_FALSE(b->pwrite("4", 1, 0).ok());
    CHECK(a->pwrite("5", 1, 0).ok());
    CHECK(fs.injected() == 2);
  }
  SECTION("times = -1 is forever, clear() removes the rules") {
    fs.add({.op = Op::kWrite, .times = -1});
    for (int i = 0; i < 10; ++i) CHECK_FALSE(a->pwrite("x", 1, 0).ok());
    CHECK(fs.injected() == 10);
    fs.clear();
    CHECK(a->pwrite("x", 1, 0).ok());
  }
  SECTION("only paths that contain the string") {
    fs.add({.op = Op::kWrite, .path_contains = "manifest", .times = -1});
    CHECK(a->pwrite("x", 1, 0).ok());
    CHECK_FALSE(b->pwrite("x", 1, 0).ok());
    CHECK(a->pwrite("x", 1, 0).ok());
    CHECK(fs.injected() == 1);
  }
  SECTION("the op must match") {
    fs.add({.op = Op::kRead, .times = -1});
    CHECK(a->pwrite("x", 1, 0).ok());
    CHECK(fs.injected() == 0);
  }
  SECTION("rules are checked in order; a skipped rule leaves the operation to later ones") {
    fs.add({.op = Op::kWrite, .err = ENOSPC, .skip = 1});
    fs.add({.op = Op::kWrite, .err = EIO});
    CHECK(a->pwrite("x", 1, 0).code() == StatusCode::kIo);       // first rule skips, second fires
    CHECK(a->pwrite("x", 1, 0).code() == StatusCode::kNoSpace);  // first rule fires
    CHECK(a->pwrite("x", 1, 0).ok());
  }
}

TEST_CASE("faulty fs: rules apply to each request of read_many and write_many", "[fs][faulty]") {
  TempDir tmp;
  FaultyFileSystem fs(posix_fs());
  using Op = FaultyFileSystem::Op;
  using Effect = FaultyFileSystem::Effect;
  auto f = open_ok(fs, tmp.path + "/batch", kCreate);
  constexpr size_t kN = 10, kLen = 4096;
  std::vector<AlignedBuf> out;
  std::vector<IoRequest> reqs;
  for (size_t i = 0; i < kN; ++i) {
    out.emplace_back(kLen);
    out.back().fill(i + 100);
  }
  for (size_t i = 0; i < kN; ++i) reqs.push_back({out[i].data(), kLen, i * kLen});
  std::vector<AlignedBuf> in;
  std::vector<IoRequest> rreqs;
  for (size_t i = 0; i < kN; ++i) in.emplace_back(kLen);
  for (size_t i = 0; i < kN; ++i) rreqs.push_back({in[i].data(), kLen, i * kLen});

  SECTION("a dropped write in the middle of a batch") {
    fs.add({.op = Op::kWrite, .effect = Effect::kDropWrite, .skip = 4});
    require_ok(f->write_many(reqs));
    CHECK(fs.injected() == 1);
    require_ok(f->read_many(rreqs));
    for (size_t i = 0; i < kN; ++i) {
      INFO("request " << i);
      CHECK((in[i].str() == out[i].str()) == (i != 4));
    }
  }
  SECTION("a failed write fails the batch") {
    fs.add({.op = Op::kWrite, .err = ENOSPC, .skip = 7});
    CHECK(f->write_many(reqs).code() == StatusCode::kNoSpace);
  }
  SECTION("a flipped bit in one read of a batch") {
    require_ok(f->write_many(reqs));
    fs.add({.op = Op::kRead, .effect = Effect::kFlipBit, .skip = 3});
    require_ok(f->read_many(rreqs));
    for (size_t i = 0; i < kN; ++i) {
      INFO("request " << i);
      CHECK(bits_differing(in[i].str(), out[i].str()) == (i == 3 ? 1 : 0));
    }
  }
  SECTION("a flipped read of a direct file flips a bit of every byte (padding may surround what is used)") {
    require_ok(f->write_many(reqs));
    auto d = open_ok(fs, tmp.path + "/batch", kRead | kDirect);
    if (!d->direct()) {
      WARN("the filesystem of " << tmp.path << " refuses O_DIRECT; nothing to check");
      return;
    }
    fs.add({.op = Op::kRead, .effect = Effect::kFlipBit, .skip = 1});
    require_ok(d->read_many(rreqs));
    for (size_t i = 0; i < kN; ++i) {
      INFO("request " << i);
      CHECK(bits_differing(in[i].str(), out[i].str()) == (i == 1 ? static_cast<int>(kLen) : 0));
    }
  }
  SECTION("a failed read fails the batch") {
    require_ok(f->write_many(reqs));
    fs.add({.op = Op::kRead, .skip = 9});
    CHECK(f->read_many(rreqs).code() == StatusCode::kIo);
    CHECK(fs.injected() == 1);
  }
}

TEST_CASE("faulty fs: delay, per-rule counts, names, is_posix", "[fs][faulty]") {
  MemoryFileSystem mem;
  require_ok(mem.make_dirs("/x"));
  FaultyFileSystem fs(mem);
  using Op = FaultyFileSystem::Op;
  auto a = open_ok(fs, "/x/a", kCreate);

  SECTION("a delay rule slows the operation and lets it run unchanged") {
    fs.add({.op = Op::kWrite, .effect = FaultyFileSystem::Effect::kDelay, .times = 1, .delay_ms = 150});
    const auto t0 = std::chrono::steady_clock::now();
    require_ok(a->pwrite("abc", 3, 0));
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(150));
    char got[3] = {};
    size_t n = 0;
    require_ok(a->pread(got, 3, 0, &n));
    CHECK(std::string(got, n) == "abc");
    const auto t1 = std::chrono::steady_clock::now();
    require_ok(a->pwrite("d", 1, 0));  // spent
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(150));
  }
  SECTION("rules() lists each rule's countdowns and what it injected; errors name their errno") {
    fs.add({.op = Op::kWrite, .err = ENOSPC, .times = 2});
    fs.add({.op = Op::kRead, .times = -1});
    Status st = a->pwrite("x", 1, 0);
    CHECK(st.code() == StatusCode::kNoSpace);
    CHECK(st.message().find("injected ENOSPC") != std::string::npos);
    auto rules = fs.rules();
    REQUIRE(rules.size() == 2);
    CHECK(rules[0].injected == 1);
    CHECK(rules[0].rule.times == 1);
    CHECK(rules[1].injected == 0);
    fs.clear();
    CHECK(fs.rules().empty());
    CHECK(fs.injected() == 1);
  }
  SECTION("names cover every op and effect once") {
    CHECK(FaultyFileSystem::op_names().size() == 7);
    CHECK(FaultyFileSystem::effect_names().size() == 5);
    bool enospc = false;
    for (const auto& e : FaultyFileSystem::error_names())
      enospc = enospc || (e.value == ENOSPC && std::string(e.name) == "ENOSPC");
    CHECK(enospc);
  }
  SECTION("is_posix sees through the injector") {
    CHECK(is_posix(posix_fs()));
    FaultyFileSystem over_posix(posix_fs());
    CHECK(is_posix(over_posix));
    CHECK_FALSE(is_posix(fs));
    CHECK_FALSE(is_posix(mem));
  }
}

}  // namespace cairn
