// Tests for the repository many processes share (format 2): records, pack segments, compact
// commit records, refresh, checkpoints and compaction, migration of format 1, gc beside a live
// writer, and kill -9 during group commit, compaction and migration
// (docs/repository-format.md).
#include <nlohmann/json.hpp>

#include "unit/tiers/repo_test_util.hpp"

namespace {

// A pipe the forked writer reports acknowledged ids through.
struct AckPipe {
  int fd[2] = {-1, -1};
  AckPipe() { REQUIRE(::pipe(fd) == 0); }
  ~AckPipe() {
    if (fd[0] >= 0) ::close(fd[0]);
    if (fd[1] >= 0) ::close(fd[1]);
  }
  void send(const std::string& id) {
    std::string line = id + "\n";
    ssize_t n = ::write(fd[1], line.data(), line.size());
    (void)n;
  }
  std::vector<std::string> drain() {
    ::close(fd[1]);
    fd[1] = -1;
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd[0], buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
    std::vector<std::string> ids;
    size_t pos = 0;
    for (size_t nl; (nl = all.find('\n', pos)) != std::string::npos; pos = nl + 1)
      ids.push_back(all.substr(pos, nl - pos));
    return ids;
  }
};

uint64_t count_files(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) ++n;
  return n;
}

// The bytes of model i of a writer: one small tensor of its own plus, for children, the parent's.
ModelManifest small_model(ChunkStore& store, const std::string& id, const std::string& parent,
                          const ModelManifest* parent_m, uint64_t seed) {
  std::vector<TensorManifest> ts;
  if (parent_m) ts = parent_m->tensors.vec();
  ts.push_back(u8_tensor(store, "own." + id, 300 + seed % 700, seed));
  return make_model(id, parent, std::move(ts));
}

}  // namespace

TEST_CASE("records: round trip, torn ends and garbage", "[repository][records]") {
  std::string a = pfs::encode_record(pfs::RecordType::kCommit, R"({"id":"x"})");
  std::string b = pfs::encode_record(pfs::RecordType::kRemove, R"({"id":"y"})");
  const std::string both = a + b;  // the parsed records point into it
  auto r = pfs::parse_records(both);
  REQUIRE(r.stop == pfs::ParseResult::kEnd);
  REQUIRE(r.records.size() == 2);
  CHECK(r.records[1].type == pfs::RecordType::kRemove);
  CHECK(r.records[1].payload == R"({"id":"y"})");
  CHECK(r.consumed == a.size() + b.size());
  for (size_t cut = 1; cut < b.size(); ++cut) {
    auto t = pfs::parse_records(a + b.substr(0, cut));
    CHECK(t.records.size() == 1);
    CHECK(t.consumed == a.size());
    CHECK(t.stop == pfs::ParseResult::kIncomplete);
  }
  std::string flipped = a;
  flipped.back() ^= 1;
  auto f = pfs::parse_records(flipped);
  CHECK(f.stop == pfs::ParseResult::kBad);
  CHECK_THAT(f.why, Catch::Contains("checksum"));
  auto g = pfs::parse_records("garbage that is long enough to be a header or more");
  CHECK(g.stop == pfs::ParseResult::kBad);
  CHECK_THAT(g.why, Catch::Contains("magic"));
  std::string unknown = a;
  unknown[4] = 99;
  CHECK_THAT(pfs::parse_records(unknown).why, Catch::Contains("unknown type"));
  std::string huge = a;
  huge[15] = 0x7f;
  CHECK_THAT(pfs::parse_records(huge).why, Catch::Contains("payload"));
}

TEST_CASE("small models share one pack segment and one log: few files", "[repository][shared]") {
  TempDir tmp;
  ChunkStore store;
  std::vector<ModelManifest> models;
  {
    auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
    for (int i = 0; i < 300; ++i) {
      const ModelManifest* parent = i ? &models[static_cast<size_t>(i / 2)] : nullptr;
      ModelManifest m = small_model(store, "m" + std::to_string(i), parent ? parent->id : "", parent, 1000 + i);
      REQUIRE(repo->commit(m, store.source()).ok());
      models.push_back(m);
    }
    // A metadata-only child: its record says "tensors": "parent".
    ModelManifest meta = make_model("meta", "m299", models.back().tensors.vec());
    REQUIRE(repo->commit(meta, store.source()).ok());
    models.push_back(meta);
    CHECK(repo->stats().models == 301);
  }
  // FORMAT, one log, one segment (+ nothing else but empty dirs).
  CHECK(count_files(tmp.repo()) == 3);
  auto log = only_file(tmp.repo() + "/logs");
  const std::string log_bytes = slurp(log);
  auto pr = pfs::parse_records(log_bytes);
  bool compact = false;
  for (const auto& r : pr.records)
    if (r.type == pfs::RecordType::kCommit)
      compact = compact || r.payload.find(R"("tensors":"parent")") != std::string::npos;
  CHECK(compact);
  auto repo = open_repo(tmp.repo());
  CHECK(repo->stats().models == 301);
  for (const auto& m : models) {
    auto got = repo->get(m.id);
    REQUIRE(got.ok());
    CHECK(got->tensors.size() == m.tensors.size());
    require_model_bytes(*repo, m.id, store);
  }
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
  CHECK(f->orphaned.empty());
}

TEST_CASE("compaction: a checkpoint replaces the logs of writers that are gone", "[repository][shared]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.compact_after_logs = 0;  // only when asked
  std::vector<ModelManifest> models;
  auto watcher = open_repo(tmp.repo(), kChunk, opts);  // opened before anything, reads later
  for (int w = 0; w < 5; ++w) {
    auto repo = open_repo(tmp.repo(), kChunk, opts);
    for (int i = 0; i < 20; ++i) {
      const ModelManifest* parent = models.empty() ? nullptr : &models[models.size() / 2];
      ModelManifest m = small_model(store, "w" + std::to_string(w) + "-" + std::to_string(i), parent ? parent->id : "",
                                    parent, 10 * w + i);
      REQUIRE(repo->commit(m, store.source()).ok());
      models.push_back(m);
    }
    if (w == 2) REQUIRE(repo->retire(models[3].id).ok());
  }
  CHECK(files_in(tmp.repo() + "/logs").size() == 5);
  {
    auto compactor = open_repo(tmp.repo(), kChunk, opts);
    auto c = compactor->compact();
    INFO(c.status().to_string());
    REQUIRE(c.ok());
    CHECK(c->models == models.size());
    CHECK(c->logs_deleted == 5);
    CHECK(files_in(tmp.repo() + "/checkpoints").size() == 1);
    CHECK(files_in(tmp.repo() + "/logs").empty());
  }
  // The watcher had read nothing of the deleted logs: it notices and rebuilds from the checkpoint.
  auto rr = watcher->refresh();
  REQUIRE(rr.ok());
  CHECK(rr->reloaded);
  CHECK(watcher->stats().models == models.size());
  CHECK(watcher->get(models[3].id)->retired_ns != 0);
  // A fresh open reads the checkpoint alone.
  auto repo = open_repo(tmp.repo(), kChunk, opts);
  CHECK(repo->list().size() == models.size());
  for (const auto& m : models) require_model_bytes(*repo, m.id, store);
  // And keeps working: commits after it land in a new log, a second compaction folds that in.
  ModelManifest late = small_model(store, "late", models[0].id, &models[0], 999);
  REQUIRE(repo->commit(late, store.source()).ok());
  REQUIRE(repo->compact().ok());
  repo.reset();
  auto again = open_repo(tmp.repo(), kChunk, opts);
  CHECK(again->contains("late"));
  require_model_bytes(*again, "late", store);
  CHECK(files_in(tmp.repo() + "/checkpoints").size() == 1);
}

TEST_CASE("a format-1 repository is migrated on open, every model exact", "[repository][migrate]") {
  TempDir tmp;
  fs::create_directories(tmp.path);
  fs::copy(std::string(CAIRN_SOURCE_DIR) + "/tests/fixtures/repo-v1", tmp.repo(), fs::copy_options::recursive);
  auto expected = nlohmann::json::parse(slurp(std::string(CAIRN_SOURCE_DIR) + "/tests/fixtures/repo-v1-expected.json"));
  const auto packs_before = files_in(tmp.repo() + "/packs");
  auto check = [&](Repository& repo) {
    CHECK(repo.stats().models == expected.size());
    for (auto& [id, want] : expected.items()) {
      INFO("model " << id);
      auto m = repo.get(id);
      REQUIRE(m.ok());
      CHECK(m->parent == want["parent"].get<std::string>());
      CHECK(m->metadata == want["metadata"]);
      CHECK(m->collected == want["collected"].get<bool>());
      CHECK(m->tensors.size() == want["tensors"].size());
      for (const auto& t : m->tensors) {
        const auto& wt = want["tensors"][t.name];
        REQUIRE(wt.is_array());
        REQUIRE(t.chunks.size() == wt[2].size());
        for (size_t k = 0; k < t.chunks.size(); ++k) CHECK(t.chunks[k].hash.hex() == wt[2][k].get<std::string>());
        read_tensor(repo, t);  // every chunk reads back and matches its hash
      }
    }
  };
  {
    auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
    check(*repo);
  }
  CHECK(slurp(tmp.repo() + "/FORMAT") == "cairn-repository 3\nchunk_size 65536\n");
  CHECK_FALSE(fs::exists(tmp.repo() + "/manifests"));
  CHECK(files_in(tmp.repo() + "/packs") == packs_before);  // no byte of data moved
  auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  check(*repo);
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
}

TEST_CASE("a format-1 repository that cannot be written is refused, naming cairn migrate", "[repository][migrate]") {
  if (::geteuid() == 0)
    SUCCEED("running as root: permissions do not stop root, so this case cannot be made here");
  else {
    TempDir tmp;
    fs::create_directories(tmp.path);
    fs::copy(std::string(CAIRN_SOURCE_DIR) + "/tests/fixtures/repo-v1", tmp.repo(), fs::copy_options::recursive);
    fs::permissions(tmp.repo(), fs::perms::owner_write, fs::perm_options::remove);
    auto r = Repository::open(tmp.repo(), kChunk);
    fs::permissions(tmp.repo(), fs::perms::owner_write, fs::perm_options::add);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("cairn migrate"));
  }
}

TEST_CASE("gc beside a live writer waits the grace and loses nothing it commits", "[repository][shared][gc]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(300);
  auto a = open_repo(tmp.repo(), kChunk, opts);
  auto b = open_repo(tmp.repo(), kChunk, opts);
  std::vector<ModelManifest> models;
  for (int i = 0; i < 40; ++i) {
    ModelManifest m =
        make_model("r" + std::to_string(i), "", {u8_tensor(store, "t" + std::to_string(i), 2000 + i, 50 + i)});
    REQUIRE(a->commit(m, store.source()).ok());
    models.push_back(m);
  }
  for (int i = 0; i < 40; i += 2) REQUIRE(a->retire(models[static_cast<size_t>(i)].id).ok());
  REQUIRE(b->refresh().ok());
  // b is a live writer once it has written.
  ModelManifest first = make_model("b-first", "", {u8_tensor(store, "bf", 100, 77)});
  REQUIRE(b->commit(first, store.source()).ok());
  // b commits models that reuse the retired models' chunks while a collects.
  std::atomic<bool> done{false};
  std::vector<std::string> committed;
  std::thread writer([&] {
    for (int i = 0; i < 40 && !done; i += 2) {
      ModelManifest m = make_model("reuse" + std::to_string(i), "", {models[static_cast<size_t>(i)].tensors[0]});
      m.tensors.mut()[0].name = "t" + std::to_string(i);
      if (b->commit(m, store.source()).ok()) committed.push_back(m.id);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = a->gc();
  auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  writer.join();
  REQUIRE(r.ok());
  CHECK(took >= opts.gc_grace);
  CHECK(r->removed.size() == 20);
  REQUIRE(a->refresh().ok());
  for (const std::string& id : committed) require_model_bytes(*a, id, store);
  for (int i = 1; i < 40; i += 2) require_model_bytes(*a, models[static_cast<size_t>(i)].id, store);
  auto f = a->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
}

TEST_CASE("kill -9 during group commit, beside another writer: every acknowledged model reads back",
          "[repository][shared][crash]") {
  TempDir tmp;
  ChunkStore store;
  std::mt19937_64 rng(5);
  // Both the child and the parent know every model's bytes: they are deterministic.
  std::vector<ModelManifest> planned;
  for (int i = 0; i < 400; ++i) planned.push_back(small_model(store, "k" + std::to_string(i), "", nullptr, 7000 + i));
  { auto init = open_repo(tmp.repo(), kChunk, RepositoryOptions{}); }
  auto other = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  std::set<std::string> acked;
  int other_n = 0;
  for (int trial = 0; trial < 6; ++trial) {
    AckPipe pipe;
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto repo = Repository::open(tmp.repo(), kChunk);
      if (!repo.ok()) ::_exit(3);
      // Batches of 8 through commit_batch (group commit), ids this trial owns.
      for (int i = trial; i < 400; i += 6 * 8) {
        std::vector<ModelManifest> batch;
        for (int k = i; k < i + 8 * 6 && k < 400; k += 6) batch.push_back(planned[static_cast<size_t>(k)]);
        std::vector<Status> results;
        (void)(*repo)->commit_batch(batch, store.source(), &results);
        for (size_t k = 0; k < batch.size(); ++k)
          if (results[k].ok()) pipe.send(batch[k].id);
      }
      ::_exit(0);
    }
    // Meanwhile the other writer commits too.
    for (int k = 0; k < 5; ++k) {
      ModelManifest m = small_model(store, "o" + std::to_string(other_n), "", nullptr, 90000 + other_n);
      ++other_n;
      REQUIRE(other->commit(m, store.source()).ok());
    }
    ::usleep(static_cast<useconds_t>(rng() % 30000));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    for (const std::string& id : pipe.drain()) acked.insert(id);
    auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
    for (const std::string& id : acked) {
      INFO("acknowledged " << id << " in trial " << trial);
      REQUIRE(repo->contains(id));
      require_model_bytes(*repo, id, store);
    }
    for (int k = 0; k < other_n; ++k) REQUIRE(repo->contains("o" + std::to_string(k)));
    auto f = repo->fsck(true);
    REQUIRE(f.ok());
    REQUIRE(f->dangling.empty());
  }
  WARN("models acknowledged before the kills: " << acked.size());
}

TEST_CASE("kill -9 during compaction and during migration loses nothing", "[repository][crash]") {
  std::mt19937_64 rng(9);
  SECTION("compaction") {
    TempDir tmp;
    ChunkStore store;
    RepositoryOptions opts;
    opts.compact_after_logs = 0;
    std::vector<std::string> ids;
    for (int w = 0; w < 6; ++w) {
      auto repo = open_repo(tmp.repo(), kChunk, opts);
      for (int i = 0; i < 60; ++i) {
        ModelManifest m =
            small_model(store, "c" + std::to_string(w) + "-" + std::to_string(i), "", nullptr, 100 * w + i);
        REQUIRE(repo->commit(m, store.source()).ok());
        ids.push_back(m.id);
      }
    }
    bool completed = false;
    for (int trial = 0; trial < 8 && !completed; ++trial) {
      completed = fork_and_kill(
          [&] {
            RepositoryOptions o;
            o.compact_after_logs = 0;
            auto repo = Repository::open(tmp.repo(), kChunk, nullptr, o);
            if (!repo.ok()) return 3;
            return (*repo)->compact().ok() ? 0 : 4;
          },
          rng, 20000, trial >= 7);
      auto repo = open_repo(tmp.repo(), kChunk, opts);
      REQUIRE(repo->stats().models == ids.size());
      for (const std::string& id : ids) require_model_bytes(*repo, id, store);
    }
  }
  SECTION("migration") {
    bool completed = false;
    for (int trial = 0; trial < 8 && !completed; ++trial) {
      TempDir tmp;
      fs::create_directories(tmp.path);
      fs::copy(std::string(CAIRN_SOURCE_DIR) + "/tests/fixtures/repo-v1", tmp.repo(), fs::copy_options::recursive);
      completed =
          fork_and_kill([&] { return Repository::open(tmp.repo(), kChunk).ok() ? 0 : 4; }, rng, 3000, trial >= 7);
      auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
      CHECK(repo->stats().models == 5);
      for (const std::string& id : repo->list()) {
        auto m = repo->get(id);
        REQUIRE(m.ok());
        for (const auto& t : m->tensors) read_tensor(*repo, t);
      }
      CHECK_FALSE(fs::exists(tmp.repo() + "/manifests"));
    }
  }
}

TEST_CASE("gc's steps: the caller's part runs under the lease and ends before the grace", "[repository][shared][gc]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(400);
  auto a = open_repo(tmp.repo(), kChunk, opts);
  auto b = open_repo(tmp.repo(), kChunk, opts);
  std::vector<ModelManifest> models;
  for (int i = 0; i < 6; ++i) {
    ModelManifest m =
        make_model("s" + std::to_string(i), "", {u8_tensor(store, "t" + std::to_string(i), 3000 + i, 90 + i)});
    REQUIRE(a->commit(m, store.source()).ok());
    models.push_back(m);
  }
  for (int i = 0; i < 6; i += 2) REQUIRE(a->retire(models[static_cast<size_t>(i)].id).ok());
  ModelManifest first = make_model("b-first", "", {u8_tensor(store, "bf", 100, 78)});
  REQUIRE(b->commit(first, store.source()).ok());  // b is a live writer: a's gc takes the grace

  // A caller's error at `deciding` ends gc before anything changed, and gives the lease back.
  GcSteps refuse;
  refuse.deciding = [] { return busy("the caller says no"); };
  bool refused_decided = false;
  refuse.decided = [&](const GcReport&) { refused_decided = true; };
  auto r0 = a->gc(refuse);
  REQUIRE_FALSE(r0.ok());
  CHECK(r0.status().code() == StatusCode::kBusy);
  CHECK_FALSE(refused_decided);
  require_model_bytes(*a, models[0].id, store);

  // Another process's maintenance first: `deciding` waits for the lease, not the other way round.
  using Clock = std::chrono::steady_clock;
  Clock::time_point t_deciding{}, t_decided{};
  int decidings = 0;
  std::vector<std::string> decided_removed;
  GcSteps steps;
  steps.deciding = [&] {
    ++decidings;
    t_deciding = Clock::now();
    return Status::OK();
  };
  std::atomic<bool> is_decided{false};
  steps.decided = [&](const GcReport& rep) {
    t_decided = Clock::now();
    decided_removed = rep.removed;
    is_decided = true;
  };
  // (b's gc holds the lease 300 ms, then its caller calls it off.)
  std::atomic<bool> b_in_gc{false};
  Status b_gc;
  std::thread other([&] {
    GcSteps hold;
    hold.deciding = [&] {
      b_in_gc = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return busy("called off");
    };
    b_gc = b->gc(hold).status();
  });
  while (!b_in_gc) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // a commits during its own gc's grace (on another thread: the caller's commits go on), reusing
  // a retired model's bytes; it must survive the freeing.
  std::atomic<bool> committed{false};
  ModelManifest reuse = make_model("reuse-during-grace", "", {models[2].tensors[0]});
  std::thread writer([&] {
    while (!is_decided) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    committed = a->commit(reuse, store.source()).ok();
  });
  auto t0 = Clock::now();
  auto r = a->gc(steps);
  auto t_end = Clock::now();
  writer.join();
  other.join();
  CHECK(b_gc.code() == StatusCode::kBusy);
  REQUIRE(r.ok());
  CHECK(decidings == 1);
  // b's gc held the lease: a's caller was not called while a waited for it.
  CHECK(t_deciding - t0 >= std::chrono::milliseconds(200));
  CHECK(decided_removed == r->removed);
  CHECK(r->removed.size() == 3);
  // The grace comes after `decided`.
  CHECK(t_end - t_decided >= opts.gc_grace);
  REQUIRE(committed.load());
  require_model_bytes(*a, reuse.id, store);
  for (int i = 1; i < 6; i += 2) require_model_bytes(*a, models[static_cast<size_t>(i)].id, store);
  auto f = a->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
}

TEST_CASE("a parent collected by gc: its other writer's child still opens, before and after compaction",
          "[repository][shared][gc]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(50);
  opts.compact_after_logs = 0;
  {
    auto a = open_repo(tmp.repo(), kChunk, opts);
    auto b = open_repo(tmp.repo(), kChunk, opts);
    ModelManifest p = make_model("p", "", {u8_tensor(store, "a", 3000, 1), u8_tensor(store, "b", 4000, 2)});
    REQUIRE(a->commit(p, store.source()).ok());
    // The child inherits tensor 1 ("b") by position.
    ModelManifest c = make_model("p/c", "p", {u8_tensor(store, "x", 500, 3), p.tensors[1]});
    REQUIRE(b->commit(c, store.source()).ok());
    REQUIRE(a->retire("p").ok());
    auto r = a->gc();
    REQUIRE(r.ok());
    CHECK(r->collected == std::vector<std::string>{"p"});
  }
  auto check = [&] {
    auto repo = open_repo(tmp.repo(), kChunk, opts);
    auto c = repo->get("p/c");
    REQUIRE(c.ok());
    REQUIRE(c->tensors.size() == 2);
    CHECK(c->tensors[1].name == "b");
    require_model_bytes(*repo, "p/c", store);
    CHECK(repo->get("p")->collected);
    return repo;
  };
  check();
  REQUIRE(check()->compact().ok());
  check();
}

TEST_CASE("refresh() reports what any internal refresh read (a lookup's, a claim's)", "[repository][shared]") {
  TempDir tmp;
  ChunkStore store;
  auto a = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  auto b = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  ModelManifest m = make_model("m", "", {u8_tensor(store, "w", 100, 1)});
  REQUIRE(a->commit(m, store.source()).ok());
  REQUIRE(b->contains("m"));  // found on the spot by a lookup's refresh
  ModelManifest n = make_model("n", "", {u8_tensor(store, "v", 100, 2)});
  REQUIRE(a->commit(n, store.source()).ok());
  REQUIRE(b->claim("z").ok());  // a claim reads every log too
  b->release_claim("z");
  REQUIRE(a->retire("m").ok());
  auto r = b->refresh();
  REQUIRE(r.ok());
  std::set<std::string> added;
  for (const auto& x : r->added) added.insert(x->id);
  CHECK(added == std::set<std::string>{"m", "n"});
  CHECK(r->retired == std::vector<std::string>{"m"});
  auto again = b->refresh();
  REQUIRE(again.ok());
  CHECK(again->added.empty());
}

TEST_CASE("compact_if_needed folds the logs of writers that are gone, and only then", "[repository][shared]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.compact_after_logs = 3;
  auto live = open_repo(tmp.repo(), kChunk, opts);
  for (int w = 0; w < 3; ++w) {
    auto gone = open_repo(tmp.repo(), kChunk, opts);
    ModelManifest m = small_model(store, "g" + std::to_string(w), "", nullptr, 40 + w);
    REQUIRE(gone->commit(m, store.source()).ok());
    if (w == 1) {
      REQUIRE(live->refresh().ok());
      auto none = live->compact_if_needed();
      REQUIRE(none.ok());
      CHECK(none->checkpoint_seq == 0);  // two dead logs: not yet
    }
  }
  REQUIRE(live->refresh().ok());
  auto c = live->compact_if_needed();
  REQUIRE(c.ok());
  CHECK(c->checkpoint_seq != 0);
  CHECK(c->logs_deleted == 3);
  CHECK(files_in(tmp.repo() + "/logs").empty());
  auto again = open_repo(tmp.repo(), kChunk, opts);
  CHECK(again->stats().models == 3);
  for (int w = 0; w < 3; ++w) require_model_bytes(*again, "g" + std::to_string(w), store);
}

TEST_CASE("a daemon's stamp is kept, though another writer's later model was seen first or it comes out of order",
          "[repository][shared]") {
  // A daemon stamps a model when it becomes visible; its readers check that stamp. Two daemons on one
  // repository: B publishes a model stamped later than A's, A refreshes and sees it, then A's flusher
  // commits its own (earlier-stamped) model. The repository must keep A's stamp: restamping it made
  // every reader that had opened it fail as if its id had been deleted and committed again.
  TempDir tmp;
  ChunkStore store;
  auto a = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  auto b = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  ModelManifest late = small_model(store, "late", "", nullptr, 1);
  late.created_ns = 2'000'000'000'000'000'000;
  REQUIRE(b->commit(late, store.source()).ok());
  CHECK(late.created_ns == 2'000'000'000'000'000'000);
  REQUIRE(a->get("late").ok());  // A has indexed B's model now
  ModelManifest early = small_model(store, "early", "", nullptr, 2);
  early.created_ns = 1'900'000'000'000'000'000;
  REQUIRE(a->commit(early, store.source()).ok());
  CHECK(early.created_ns == 1'900'000'000'000'000'000);
  auto got = a->get("early");
  REQUIRE(got.ok());
  CHECK(got->created_ns == 1'900'000'000'000'000'000);
  // Two of A's commits that became visible in one order and reach the repository in the other keep
  // their stamps too.
  ModelManifest again = small_model(store, "again", "", nullptr, 3);
  again.created_ns = 1'800'000'000'000'000'000;
  REQUIRE(a->commit(again, store.source()).ok());
  CHECK(again.created_ns == 1'800'000'000'000'000'000);
  // A commit without a stamp (the tool without a daemon) takes one after every stamp seen.
  ModelManifest plain = small_model(store, "plain", "", nullptr, 4);
  plain.created_ns = 0;
  REQUIRE(a->commit(plain, store.source()).ok());
  CHECK(plain.created_ns > 2'000'000'000'000'000'000);
}

TEST_CASE("maintenance from two threads of one writer at once: each runs or is told busy", "[repository][shared]") {
  // Two clients of one daemon asking for gc at once, or a gc beside a compaction: the maintenance
  // lease is taken through a temporary file; two calls sharing its name made one fail with
  // "creating .../maintenance.lease: No such file or directory" (found by the torture harness).
  TempDir tmp;
  ChunkStore store;
  auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  ModelManifest m = small_model(store, "m", "", nullptr, 7);
  REQUIRE(repo->commit(m, store.source()).ok());
  std::atomic<int> other_errors{0};
  std::string first_error;
  std::mutex mu;
  auto run = [&](bool gc) {
    for (int i = 0; i < 150; ++i) {
      Status s = gc ? repo->gc().status() : repo->compact().status();
      if (!s.ok() && s.code() != StatusCode::kBusy) {
        std::lock_guard lock(mu);
        if (other_errors++ == 0) first_error = s.to_string();
      }
    }
  };
  std::thread a(run, true), b(run, false), c(run, true);
  a.join();
  b.join();
  c.join();
  INFO(first_error);
  CHECK(other_errors == 0);
  require_model_bytes(*repo, "m", store);
}

TEST_CASE("a chunk stored twice: gc frees neither copy while a manifest names it (collected parent in a checkpoint)",
          "[repository][shared][gc]") {
  // A collected parent is written to checkpoints as it was before gc, naming its chunks where gc
  // freed them; a later model stores one of those chunks again elsewhere. Reopened, the catalog
  // holds two copies of that chunk. Counting only the first (the freed one) made the next gc punch
  // the second under the model that reads it, and made new commits reuse the freed bytes.
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(20);
  opts.compact_after_logs = 0;
  TensorManifest shared_t = u8_tensor(store, "h", 3000, 11);
  {
    auto a = open_repo(tmp.repo(), kChunk, opts);
    ModelManifest p = make_model("p", "", {shared_t, u8_tensor(store, "pb", 2000, 12)});
    REQUIRE(a->commit(p, store.source()).ok());
    ModelManifest c = make_model("p/c", "p", {p.tensors[1], u8_tensor(store, "cx", 700, 13)});
    REQUIRE(a->commit(c, store.source()).ok());
    REQUIRE(a->retire("p").ok());
    auto r = a->gc();
    REQUIRE(r.ok());
    REQUIRE(r->collected == std::vector<std::string>{"p"});
    // The same bytes again: stored anew, since gc freed the first copy.
    ModelManifest m = make_model("m", "", {shared_t});
    REQUIRE(a->commit(m, store.source()).ok());
    auto mm = a->get("m");
    REQUIRE(mm.ok());
    REQUIRE(a->compact().ok());
  }
  {
    auto a = open_repo(tmp.repo(), kChunk, opts);
    require_model_bytes(*a, "m", store);
    auto r = a->gc();
    REQUIRE(r.ok());
    require_model_bytes(*a, "m", store);
    // A new commit of those bytes reuses a copy that is still there.
    ModelManifest n = make_model("n", "", {shared_t});
    REQUIRE(a->commit(n, store.source()).ok());
    require_model_bytes(*a, "n", store);
    auto f = a->fsck(true);
    REQUIRE(f.ok());
    for (const auto& d : f->dangling) UNSCOPED_INFO(d.model + " " + d.pack + " " + d.detail);
    CHECK(f->ok());
  }
  auto a = open_repo(tmp.repo(), kChunk, opts);
  require_model_bytes(*a, "m", store);
  require_model_bytes(*a, "n", store);
}

TEST_CASE("gc removes a retired parent while another writer commits a child of it: the parent comes back, collected",
          "[repository][shared][gc]") {
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(1200);
  auto a = open_repo(tmp.repo(), kChunk, opts);
  FaultyFileSystem slow(posix_fs());
  auto br = Repository::open(tmp.repo(), kChunk, &slow, opts);
  REQUIRE(br.ok());
  auto b = std::move(br).value();
  ModelManifest p = make_model("p", "", {u8_tensor(store, "pa", 3000, 21), u8_tensor(store, "pb", 4000, 22)});
  REQUIRE(a->commit(p, store.source()).ok());
  REQUIRE(a->retire("p").ok());
  ModelManifest first = make_model("b-first", "", {u8_tensor(store, "bf", 100, 23)});
  REQUIRE(b->commit(first, store.source()).ok());  // b is a live writer
  REQUIRE(b->refresh().ok());
  // b plans the child against a view that has p, and its record reaches the log only after a's gc
  // decided (a slow log write), well inside the grace.
  ModelManifest c = make_model("p/c", "p", {p.tensors[1], u8_tensor(store, "cx", 900, 24)});
  FaultyFileSystem::Rule delay;
  delay.op = FaultyFileSystem::Op::kWrite;
  delay.path_contains = "/logs/";
  delay.effect = FaultyFileSystem::Effect::kDelay;
  delay.delay_ms = 500;
  slow.add(delay);
  Status child;
  std::thread writer([&] { child = b->commit(c, store.source()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto r = a->gc();
  writer.join();
  REQUIRE(child.ok());
  REQUIRE(r.ok());
  CHECK(r->removed.empty());
  CHECK(r->collected == std::vector<std::string>{"p"});
  auto check = [&](Repository& repo) {
    auto pm = repo.get("p");
    REQUIRE(pm.ok());
    CHECK(pm->collected);
    auto cm = repo.get("p/c");
    REQUIRE(cm.ok());
    CHECK(cm->parent == "p");
    require_model_bytes(repo, "p/c", store);
    auto f = repo.fsck(true);
    REQUIRE(f.ok());
    for (const auto& d : f->dangling) UNSCOPED_INFO(d.model + " " + d.pack + " " + d.detail);
    CHECK(f->ok());
  };
  check(*a);
  b.reset();
  a.reset();
  auto fresh = open_repo(tmp.repo(), kChunk, opts);
  check(*fresh);
  REQUIRE(fresh->compact().ok());
  check(*open_repo(tmp.repo(), kChunk, opts));
}

TEST_CASE("a record that waits does not make the next open apply the records after it again",
          "[repository][shared][gc]") {
  // b retires x after a's gc removed it (b's view was older): readers can never apply that retire.
  // Covering b's log only up to it made every open apply b's later records again, among them the
  // commit of z, whose remove (in a's log) the checkpoint had folded in: z came back from the dead,
  // naming bytes gc had freed.
  TempDir tmp;
  ChunkStore store;
  RepositoryOptions opts;
  opts.gc_grace = std::chrono::milliseconds(400);
  opts.compact_after_logs = 0;
  auto commit = [&](Repository& r, const std::string& id, uint64_t seed) {
    ModelManifest m = make_model(id, "", {u8_tensor(store, id, 3000, seed)});
    return r.commit(m, store.source());
  };
  {
    auto a = open_repo(tmp.repo(), kChunk, opts);
    auto b = open_repo(tmp.repo(), kChunk, opts);
    REQUIRE(commit(*a, "x", 31).ok());
    REQUIRE(commit(*a, "keep", 32).ok());
    REQUIRE(commit(*b, "b0", 33).ok());
    REQUIRE(b->refresh().ok());
    REQUIRE(a->retire("x").ok());
    Status late;
    std::thread stale([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      late = b->retire("x");  // b's view still has x, not retired
    });
    auto g1 = a->gc();
    stale.join();
    REQUIRE(g1.ok());
    REQUIRE(g1->removed == std::vector<std::string>{"x"});
    REQUIRE(late.ok());
    REQUIRE(commit(*b, "z", 34).ok());
    REQUIRE(b->retire("z").ok());
    auto g2 = a->gc();
    REQUIRE(g2.ok());
    REQUIRE(g2->removed == std::vector<std::string>{"z"});
    REQUIRE(a->compact().ok());
  }
  for (int round = 0; round < 2; ++round) {
    auto c = open_repo(tmp.repo(), kChunk, opts);
    CHECK(c->get("z").status().code() == StatusCode::kNotFound);
    CHECK(c->get("x").status().code() == StatusCode::kNotFound);
    require_model_bytes(*c, "keep", store);
    auto f = c->fsck(true);
    REQUIRE(f.ok());
    for (const auto& d : f->dangling) UNSCOPED_INFO(d.model + " " + d.pack + " " + d.detail);
    CHECK(f->ok());
    REQUIRE(c->compact().ok());
  }
}
