// Tests for the repository on the PFS (tiers/pfs/repository.hpp, docs/repository-format.md).
#include "unit/tiers/repo_test_util.hpp"

TEST_CASE("a new repository has FORMAT, packs/, logs/ and checkpoints/", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  CHECK(repo->chunk_size() == kChunk);
  CHECK(repo->writable());
  CHECK(slurp(tmp.repo() + "/FORMAT") == "cairn-repository 3\nchunk_size 65536\n");
  CHECK(fs::is_directory(tmp.repo() + "/packs"));
  CHECK(fs::is_directory(tmp.repo() + "/logs"));
  CHECK(fs::is_directory(tmp.repo() + "/checkpoints"));
  CHECK_FALSE(fs::exists(tmp.repo() + "/manifests"));
  CHECK(files_in(tmp.repo() + "/logs").empty());  // nothing written yet: no log
  auto st = repo->stats();
  CHECK(st.models == 0);
  CHECK(st.packs == 0);
  CHECK(st.physical_bytes == 0);
  repo.reset();
  // An existing repository keeps its own chunk size.
  auto again = open_repo(tmp.repo(), 1 << 20);
  CHECK(again->chunk_size() == kChunk);
}

TEST_CASE("open rejects what is not a cairn repository", "[repository]") {
  TempDir tmp;
  SECTION("a non-empty directory without FORMAT") {
    fs::create_directories(tmp.repo());
    spit(tmp.repo() + "/notes.txt", "hello");
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("not a cairn repository"));
    CHECK_FALSE(fs::exists(tmp.repo() + "/FORMAT"));
  }
  SECTION("an unknown format version") {
    fs::create_directories(tmp.repo());
    spit(tmp.repo() + "/FORMAT", "cairn-repository 4\nchunk_size 65536\n");
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("version 4"));
  }
  SECTION("a garbled FORMAT") {
    fs::create_directories(tmp.repo());
    spit(tmp.repo() + "/FORMAT", "cairn-repository 1\nchunk_size lots\n");
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kCorruption);
    CHECK_THAT(r.status().message(), Catch::Contains("FORMAT"));
  }
  SECTION("a zero chunk size for a new repository") {
    auto r = Repository::open(tmp.repo(), 0);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("commit then get round-trips manifests and bytes", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest m = make_model("resnet/v1 — ünïcode id", "",
                               {make_tensor(store, "conv1.weight", DType::kF32, {64, 64}, make_bytes(64 * 64 * 4, 1)),
                                u8_tensor(store, "big", 3 * kChunk + 123, 2),  // 4 chunks, the last one short
                                u8_tensor(store, "exact", 2 * kChunk, 3),      // 2 full chunks
                                make_tensor(store, "bias", DType::kBF16, {7}, make_bytes(14, 4))});
  m.architecture = nlohmann::json{{"layers", nlohmann::json::array({{{"name", "conv1"}}})}};
  m.source_header = std::string("\x10\0\0\0\0\0\0\0{\"a\":1}        ", 24);
  ModelManifest committed = m;
  Status s = repo->commit(committed, store.source());
  INFO(s.to_string());
  REQUIRE(s.ok());

  CHECK(store.bytes_asked == m.logical_bytes());
  CHECK_FALSE(committed.pack.empty());
  CHECK(committed.created_ns > 0);
  for (const TensorManifest& t : committed.tensors)
    for (const ChunkRef& c : t.chunks) {
      CHECK(c.pack == committed.pack);
      CHECK(c.offset > 8);
    }
  // One log of this writer holds the record; file names never hold the id.
  CHECK(files_in(tmp.repo() + "/logs") == std::set<std::string>{repo->writer_id() + "-000001.log"});
  CHECK(fs::exists(tmp.repo() + "/packs/" + committed.pack));

  Result<ModelManifest> got = repo->get(m.id);
  REQUIRE(got.ok());
  CHECK(*got == committed);
  CHECK(got->metadata == m.metadata);
  CHECK(got->architecture == m.architecture);
  CHECK(got->source_header == m.source_header);
  CHECK(repo->contains(m.id));
  CHECK_FALSE(repo->contains("other"));
  CHECK(repo->list() == std::vector<std::string>{m.id});
  CHECK(repo->children(m.id).empty());
  require_model_bytes(*repo, m.id, store);

  const ChunkRef& first = committed.tensors[1].chunks[0];
  auto loc = repo->locate(first.hash);
  REQUIRE(loc.has_value());
  CHECK(*loc == first);
  CHECK_FALSE(repo->locate(hash_bytes("nope", 4)).has_value());

  auto st = repo->stats();
  CHECK(st.models == 1);
  CHECK(st.packs == 1);
  CHECK(st.logical_bytes == m.logical_bytes());
  CHECK(st.physical_bytes == m.logical_bytes());
  CHECK(st.chunks == 1 + 4 + 2 + 1);

  auto missing = repo->get("absent");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("absent"));
}

TEST_CASE("a derived model stores only the tensor it changed", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest parent = make_model(
      "p", "", {u8_tensor(store, "a", 100000, 1), u8_tensor(store, "b", 70000, 2), u8_tensor(store, "c", 5000, 3)});
  REQUIRE(repo->commit(parent, store.source()).ok());
  auto before = repo->stats();

  // The child recomputes hashes of a and c (same bytes), changes b.
  ChunkStore child_store;
  ModelManifest child = make_model("c", "p",
                                   {u8_tensor(child_store, "a", 100000, 1), u8_tensor(child_store, "b", 70000, 99),
                                    u8_tensor(child_store, "c", 5000, 3)});
  REQUIRE(repo->commit(child, child_store.source()).ok());
  auto after = repo->stats();
  CHECK(after.physical_bytes - before.physical_bytes == 70000);
  CHECK(child_store.bytes_asked == 70000);
  CHECK(after.logical_bytes == 2 * parent.logical_bytes());
  CHECK(after.packs == 2);
  CHECK(child.tensors[0].chunks == parent.tensors[0].chunks);
  CHECK(child.tensors[2].chunks == parent.tensors[2].chunks);
  CHECK(child.tensors[1].chunks[0].pack == child.pack);
  CHECK(repo->children("p") == std::vector<std::string>{"c"});
  CHECK(repo->list() == std::vector<std::string>{"p", "c"});
  require_model_bytes(*repo, "c", child_store);
  require_model_bytes(*repo, "p", store);
}

TEST_CASE("an inherited tensor costs no bytes and no source call", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest parent = make_model("p", "", {u8_tensor(store, "w", 3 * kChunk, 1)});
  REQUIRE(repo->commit(parent, store.source()).ok());
  auto before = repo->stats();

  ModelManifest child = make_model("c", "p", {parent.tensors[0]});  // same ChunkRefs as the parent
  child.tensors.mut()[0].name = "w";
  ChunkStore empty;
  REQUIRE(repo->commit(child, empty.source()).ok());
  CHECK(empty.calls == 0);
  CHECK(child.pack.empty());
  CHECK(child.tensors[0].chunks == parent.tensors[0].chunks);
  auto after = repo->stats();
  CHECK(after.physical_bytes == before.physical_bytes);
  CHECK(after.packs == before.packs);
  CHECK(after.chunks == before.chunks);
  CHECK(after.models == 2);
  CHECK(files_in(tmp.repo() + "/packs").size() == 1);
  // Even with no source at all.
  ModelManifest grandchild = make_model("g", "c", {parent.tensors[0]});
  REQUIRE(repo->commit(grandchild, nullptr).ok());
  require_model_bytes(*repo, "g", store);
}

TEST_CASE("identical tensors of unrelated models are stored once", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore s1, s2;
  ModelManifest a = make_model("a", "", {u8_tensor(s1, "emb", 2 * kChunk + 10, 7)});
  ModelManifest b =
      make_model("b", "", {u8_tensor(s2, "embedding", 2 * kChunk + 10, 7), u8_tensor(s2, "head", 1000, 8)});
  REQUIRE(repo->commit(a, s1.source()).ok());
  REQUIRE(repo->commit(b, s2.source()).ok());
  CHECK(s2.bytes_asked == 1000);
  auto st = repo->stats();
  CHECK(st.physical_bytes == 2 * kChunk + 10 + 1000);
  CHECK(st.logical_bytes == 2 * (2 * kChunk + 10) + 1000);
  CHECK(st.chunks == 4);
  CHECK(b.tensors[0].chunks == a.tensors[0].chunks);
  // Same content, no new chunk at all: no pack.
  ChunkStore s3;
  ModelManifest c = make_model("c", "", {u8_tensor(s3, "x", 1000, 8)});
  REQUIRE(repo->commit(c, s3.source()).ok());
  CHECK(c.pack.empty());
  CHECK(repo->stats().packs == 2);
}

TEST_CASE("repeated chunks inside one model are written once", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  std::string zeros(3 * kChunk, '\0');
  ModelManifest m = make_model(
      "z", "",
      {make_tensor(store, "zeros", DType::kF32, {static_cast<int64_t>(3 * kChunk / 4)}, zeros),
       make_tensor(store, "more_zeros", DType::kU8, {static_cast<int64_t>(kChunk)}, std::string(kChunk, '\0'))});
  REQUIRE(repo->commit(m, store.source()).ok());
  CHECK(store.calls == 1);
  CHECK(repo->stats().physical_bytes == kChunk);
  CHECK(repo->stats().chunks == 1);
  require_model_bytes(*repo, "z", store);
  // The pack holds one entry, the chunk coded (zeros code to almost nothing): "__coded__.<hex>".
  const ChunkRef& c = m.tensors[0].chunks[0];
  CHECK(c.coding == ChunkCoding::kPlanes);
  CHECK(c.stored < 1000);
  CHECK(repo->stats().stored_bytes == c.stored);
  auto h = safetensors::read_header(tmp.repo() + "/packs/" + m.pack);
  REQUIRE(h.ok());
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].name == "__coded__." + c.hash.hex());
  CHECK(h->tensors[0].dtype == DType::kU8);
  CHECK(h->tensors[0].shape == std::vector<int64_t>{static_cast<int64_t>(c.stored)});
}

TEST_CASE("empty and 0-d tensors", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest m = make_model("m", "",
                               {make_tensor(store, "empty", DType::kF32, {0, 16}, ""),
                                make_tensor(store, "scalar", DType::kF64, {}, make_bytes(8, 5)),
                                make_tensor(store, "empty1d", DType::kI64, {0}, "")});
  REQUIRE(repo->commit(m, store.source()).ok());
  CHECK(m.tensors[0].chunks.empty());
  CHECK(m.tensors[1].chunks.size() == 1);
  CHECK(repo->stats().physical_bytes == 8);
  CHECK(repo->stats().logical_bytes == 8);
  require_model_bytes(*repo, "m", store);
  repo.reset();
  repo = open_repo(tmp.repo());
  auto got = repo->get("m");
  REQUIRE(got.ok());
  CHECK(*got == m);
  CHECK(got->tensors[1].shape.empty());
  CHECK(got->tensors[0].shape == std::vector<int64_t>{0, 16});

  // A model of only empty tensors writes no pack.
  ModelManifest e = make_model("e", "", {make_tensor(store, "nothing", DType::kBF16, {4, 0}, "")});
  REQUIRE(repo->commit(e, store.source()).ok());
  CHECK(e.pack.empty());
  // A model without tensors is fine too.
  ModelManifest bare = make_model("bare", "e", {});
  REQUIRE(repo->commit(bare, nullptr).ok());
}

TEST_CASE("reopening rebuilds the same catalog", "[repository]") {
  TempDir tmp;
  ChunkStore store;
  std::vector<ModelManifest> committed;
  RepositoryStats before;
  std::vector<std::string> order;
  {
    auto repo = open_repo(tmp.repo());
    ModelManifest a = make_model("a", "", {u8_tensor(store, "x", 3 * kChunk, 1), u8_tensor(store, "y", 500, 2)});
    ModelManifest b = make_model("b", "a", {a.tensors[0], u8_tensor(store, "z", kChunk + 1, 3)});
    ModelManifest c = make_model("c", "a", {u8_tensor(store, "y2", 500, 2)});
    ModelManifest d = make_model("d", "", {u8_tensor(store, "w", 10, 4)});
    for (ModelManifest* m : {&a, &b, &c, &d}) {
      REQUIRE(repo->commit(*m, store.source()).ok());
      committed.push_back(*m);
    }
    before = repo->stats();
    order = repo->list();
  }
  auto repo = open_repo(tmp.repo());
  CHECK(same_stats(repo->stats(), before));
  CHECK(repo->list() == order);
  CHECK(repo->children("a") == std::vector<std::string>{"b", "c"});
  for (const ModelManifest& m : committed) {
    auto got = repo->get(m.id);
    REQUIRE(got.ok());
    CHECK(*got == m);
    for (const TensorManifest& t : m.tensors)
      for (const ChunkRef& c : t.chunks) CHECK(repo->locate(c.hash).has_value());
    require_model_bytes(*repo, m.id, store);
  }
  // Commits after a reopen keep the order and dedup against what was there.
  ModelManifest e = make_model("e", "d", {u8_tensor(store, "x", 3 * kChunk, 1)});
  ChunkStore none;
  REQUIRE(repo->commit(e, none.source()).ok());
  CHECK(none.calls == 0);
  CHECK(repo->list().back() == "e");
  CHECK(e.created_ns > committed.back().created_ns);
}

TEST_CASE("a pack is an ordinary safetensors file", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest p = make_model("parent", "", {u8_tensor(store, "shared", 1000, 1)});
  REQUIRE(repo->commit(p, store.source()).ok());
  std::string fp16 = make_bytes(2 * 3 * 5000 * 2, 2);
  std::string multi = make_bytes(4 * (3 * 16384 + 5), 3);
  // "mixed" shares its first chunk with "multi", so it is not stored whole: its second chunk goes
  // in as a "__chunk__.<hex>" entry.
  std::string mixed = multi.substr(0, kChunk) + make_bytes(kChunk, 5);
  ModelManifest m = make_model("child", "parent",
                               {make_tensor(store, "fp16", DType::kF16, {2, 3, 5000}, fp16),       // 1 chunk
                                make_tensor(store, "multi", DType::kI32, {3 * 16384 + 5}, multi),  // 4 chunks
                                u8_tensor(store, "shared", 1000, 1),  // the parent's: not stored
                                make_tensor(store, "mixed", DType::kU8, {2 * kChunk}, mixed)});
  REQUIRE(repo->commit(m, store.source()).ok());

  std::string path = tmp.repo() + "/packs/" + m.pack;
  auto h = safetensors::read_header(path);
  INFO(h.status().to_string());
  REQUIRE(h.ok());
  CHECK(h->metadata.at("cairn.format") == "3");
  CHECK(h->metadata.at("cairn.model") == "child");
  CHECK(h->metadata.at("cairn.parent") == "parent");
  // Whole new tensors under their own names; the rest as chunk entries.
  const safetensors::TensorEntry* e16 = h->find("fp16");
  REQUIRE(e16 != nullptr);
  CHECK(e16->dtype == DType::kF16);
  CHECK(e16->shape == std::vector<int64_t>{2, 3, 5000});
  const safetensors::TensorEntry* ei = h->find("multi");
  REQUIRE(ei != nullptr);
  CHECK(ei->dtype == DType::kI32);
  CHECK(h->find("shared") == nullptr);
  CHECK(h->find("mixed") == nullptr);
  const std::string tail_hex = m.tensors[3].chunks[1].hash.hex();
  const safetensors::TensorEntry* ec = h->find("__chunk__." + tail_hex);
  REQUIRE(ec != nullptr);
  CHECK(h->tensors.size() == 3);

  std::string file = slurp(path);
  auto bytes_of = [&](const safetensors::TensorEntry* e) {
    return file.substr(h->data_offset() + e->begin, e->nbytes());
  };
  CHECK(bytes_of(e16) == fp16);
  CHECK(bytes_of(ei) == multi);
  CHECK(bytes_of(ec) == mixed.substr(kChunk));
  CHECK(h->data_bytes == repo->stats().physical_bytes - 1000);
  // The manifest's offsets are absolute file offsets.
  const ChunkRef& c = m.tensors[1].chunks[1];
  CHECK(file.substr(c.offset, c.length) == multi.substr(kChunk, c.length));
}

TEST_CASE("chunks at any offset read back exactly with direct I/O, a pack's last chunk too", "[repository]") {
  // A chunk's offset in a pack is not a multiple of the direct I/O block: the aligned range around it
  // is read and the chunk copied out of it. Odd sizes put chunk ends everywhere in a block, and the
  // last chunk of each pack ends inside the pack's last, partial block.
  TempDir tmp;
  ChunkStore store;
  std::vector<ModelManifest> models;
  models.push_back(
      make_model("own", "",
                 {u8_tensor(store, "a", 1, 1), u8_tensor(store, "b", 4095, 2), u8_tensor(store, "c", kChunk + 123, 3),
                  u8_tensor(store, "d", 4097, 4), u8_tensor(store, "e", 3 * kChunk - 7, 5)}));
  RepositoryOptions segments;  // small models share the writer's pack segment
  segments.own_pack_bytes = 64ull << 20;
  {
    auto repo = open_repo(tmp.repo());
    REQUIRE(repo->commit(models[0], store.source()).ok());
  }
  auto writer = open_repo(tmp.repo(), kChunk, segments);
  for (int i = 0; i < 3; ++i) {
    models.push_back(make_model("seg" + std::to_string(i), "",
                                {u8_tensor(store, "s" + std::to_string(i), 1000 + 3001 * i, 10 + i)}));
    REQUIRE(writer->commit(models.back(), store.source()).ok());
  }
  // Another handle reads while the writer's segment is still open for appending.
  auto reader = open_repo(tmp.repo());
  CHECK(reader->direct_reads());
  bool unaligned = false;
  for (const ModelManifest& m : models) {
    INFO("model " << m.id);
    require_model_bytes(*reader, m.id, store);
    for (const TensorManifest& t : m.tensors)
      for (const ChunkRef& c : t.chunks) unaligned = unaligned || c.offset % kDirectAlignment != 0;
  }
  CHECK(unaligned);
  // Again, through the scratch buffers the first reads left.
  for (const ModelManifest& m : models) require_model_bytes(*reader, m.id, store);
}

TEST_CASE("a corrupt chunk is reported, never returned", "[repository]") {
  TempDir tmp;
  ChunkStore store;
  ModelManifest m = make_model("m", "", {u8_tensor(store, "w", 2 * kChunk, 1)});
  {
    auto repo = open_repo(tmp.repo());
    REQUIRE(repo->commit(m, store.source()).ok());
  }
  const ChunkRef& c = m.tensors[0].chunks[1];
  std::string path = tmp.repo() + "/packs/" + m.pack;
  SECTION("a flipped byte") {
    std::string file = slurp(path);
    file[c.offset + 100] ^= 0x40;
    spit(path, file);
    auto repo = open_repo(tmp.repo());
    std::string buf(c.length, '\0');
    Status s = repo->read_chunk(c, buf.data());
    CHECK(s.code() == StatusCode::kCorruption);
    CHECK_THAT(s.message(), Catch::Contains(m.pack));
    CHECK_THAT(s.message(), Catch::Contains(std::to_string(c.offset)));
    CHECK_THAT(s.message(), Catch::Contains(c.hash.hex()));
    // The other chunk is fine.
    const ChunkRef& c0 = m.tensors[0].chunks[0];
    std::string buf0(c0.length, '\0');
    CHECK(repo->read_chunk(c0, buf0.data()).ok());
  }
  SECTION("a truncated pack: open works, the chunk read and fsck report it") {
    fs::resize_file(path, c.offset + 10);
    auto repo = open_repo(tmp.repo());
    std::string buf(c.length, '\0');
    Status s = repo->read_chunk(c, buf.data());
    CHECK(s.code() == StatusCode::kCorruption);
    CHECK_THAT(s.message(), Catch::Contains(m.pack));
    auto f = repo->fsck(false);
    REQUIRE(f.ok());
    CHECK(f->dangling.size() == 1);
  }
  SECTION("a missing pack fails open, naming model and pack") {
    fs::remove(path);
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kCorruption);
    CHECK_THAT(r.status().message(), Catch::Contains(m.pack));
    CHECK_THAT(r.status().message(), Catch::Contains("'m'"));
  }
  SECTION("a corrupt record followed by good ones fails open, naming the log") {
    std::string log = only_file(tmp.repo() + "/logs");
    std::string text = slurp(log);
    // A second, valid record after the first, then a flipped byte in the first one's payload.
    auto pr = pfs::parse_records(text);
    REQUIRE(pr.records.size() >= 1);
    text += pfs::encode_record(pfs::RecordType::kRetire, R"({"id":"m","retired_ns":5})");
    text[pr.records[0].offset + pfs::kRecordHeaderBytes + 3] ^= 0x01;
    spit(log, text);
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kCorruption);
    CHECK_THAT(r.status().message(), Catch::Contains(log));
    CHECK_THAT(r.status().message(), Catch::Contains("checksum"));
    CHECK(fs::exists(path));  // nothing is deleted
  }
  SECTION("a torn last record is what a crash leaves: ignored") {
    std::string log = only_file(tmp.repo() + "/logs");
    std::string text = slurp(log);
    text += pfs::encode_record(pfs::RecordType::kRetire, R"({"id":"m","retired_ns":5})").substr(0, 40);
    spit(log, text);
    auto repo = open_repo(tmp.repo());
    CHECK(repo->contains("m"));
    CHECK_FALSE(repo->get("m")->retired_ns != 0);
  }
  SECTION("a record with a bad field fails open, naming the field") {
    std::string log = only_file(tmp.repo() + "/logs");
    std::string text = slurp(log);
    auto pr = pfs::parse_records(text);
    REQUIRE(pr.records.size() >= 1);
    REQUIRE(pr.records[0].type == pfs::RecordType::kCommit);
    auto j = nlohmann::json::parse(pr.records[0].payload);
    j["tensors"][0]["dtype"] = "F17";
    std::string rest = text.substr(pr.records[0].offset + pfs::kRecordHeaderBytes + pr.records[0].payload.size());
    spit(log, pfs::encode_record(pfs::RecordType::kCommit, j.dump()) + rest);
    auto r = Repository::open(tmp.repo(), kChunk);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kCorruption);
    CHECK_THAT(r.status().message(), Catch::Contains("tensors[0].dtype"));
    CHECK_THAT(r.status().message(), Catch::Contains(log));
  }
  SECTION("reading a chunk outside the pack") {
    auto repo = open_repo(tmp.repo());
    ChunkRef far = c;
    far.offset += 1 << 20;
    std::string buf(far.length, '\0');
    CHECK(repo->read_chunk(far, buf.data()).code() == StatusCode::kCorruption);
    ChunkRef sneaky = c;
    sneaky.pack = "../FORMAT";
    CHECK(repo->read_chunk(sneaky, buf.data()).code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("what a crash leaves is inert, and gc removes it once its writer is gone", "[repository]") {
  TempDir tmp;
  ChunkStore store;
  ModelManifest m = make_model("m", "", {u8_tensor(store, "w", kChunk + 7, 1)});
  RepositoryStats before;
  {
    auto repo = open_repo(tmp.repo());
    REQUIRE(repo->commit(m, store.source()).ok());
    before = repo->stats();
  }
  std::string packs = tmp.repo() + "/packs/";
  // A dead writer's leftovers: a temporary pack, a pack whose record never landed, a claim.
  const std::string dead = "w00000000000000d1";
  spit(packs + ".tmp-" + dead + "-0", "half a pack");
  fs::copy_file(packs + m.pack, packs + dead + "-000001.safetensors");
  spit(tmp.repo() + "/writers/" + dead, "pid 1 host gone\n");  // nobody holds its lock: dead
  spit(tmp.repo() + "/claims/" + dead + ".intents", "+1:x\n");
  REQUIRE(files_in(packs).size() == 3);

  auto repo = open_repo(tmp.repo());
  CHECK(files_in(packs).size() == 3);  // open deletes nothing
  before.files = repo->stats().files;
  CHECK(same_stats(repo->stats(), before));
  require_model_bytes(*repo, "m", store);
  // Its claim does not keep the id: a dead writer's claim is broken.
  ChunkStore xs;
  ModelManifest x = make_model("x", "", {u8_tensor(xs, "w", 10, 5)});
  REQUIRE(repo->commit(x, xs.source()).ok());
  auto r = repo->gc();
  REQUIRE(r.ok());
  CHECK(files_in(packs) == std::set<std::string>{m.pack, x.pack});
  CHECK(files_in(tmp.repo() + "/claims") == std::set<std::string>{repo->writer_id() + ".intents"});
}

TEST_CASE("remove keeps lineage and packs that are still referenced", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest a = make_model("a", "", {u8_tensor(store, "t1", 2 * kChunk, 1), u8_tensor(store, "t2", 3000, 2)});
  ModelManifest b = make_model("b", "a", {a.tensors[0], u8_tensor(store, "t3", 4000, 3)});
  ModelManifest d = make_model("d", "", {u8_tensor(store, "t2", 3000, 2), u8_tensor(store, "t4", 5000, 4)});
  for (ModelManifest* m : {&a, &b, &d}) REQUIRE(repo->commit(*m, store.source()).ok());
  const std::string packs = tmp.repo() + "/packs/";
  REQUIRE(files_in(packs) == std::set<std::string>{a.pack, b.pack, d.pack});
  const uint64_t all_bytes = 2 * kChunk + 3000 + 4000 + 5000;
  CHECK(repo->stats().physical_bytes == all_bytes);

  Status s = repo->remove("a");
  CHECK(s.code() == StatusCode::kBusy);
  CHECK_THAT(s.message(), Catch::Contains("'b'"));
  CHECK(repo->contains("a"));
  CHECK(repo->remove("nope").code() == StatusCode::kNotFound);

  // A leaf: its manifest and its own pack go.
  REQUIRE(repo->remove("b").ok());
  CHECK_FALSE(repo->contains("b"));
  CHECK(repo->children("a").empty());
  CHECK(files_in(packs) == std::set<std::string>{a.pack, d.pack});
  CHECK(repo->stats().physical_bytes == all_bytes - 4000);
  CHECK_FALSE(repo->locate(b.tensors[1].chunks[0].hash).has_value());
  CHECK(repo->locate(a.tensors[0].chunks[0].hash).has_value());

  // a's pack holds t2, which d still uses: the file stays (cairn gc punches out t1's bytes), and
  // physical bytes count only what a manifest references.
  REQUIRE(repo->remove("a").ok());
  CHECK(files_in(packs) == std::set<std::string>{a.pack, d.pack});
  auto st = repo->stats();
  CHECK(st.models == 1);
  CHECK(st.packs == 2);
  CHECK(st.physical_bytes == 3000 + 5000);
  CHECK(st.logical_bytes == 8000);
  CHECK(st.chunks == 2);  // t1's chunks are no longer live
  CHECK_FALSE(repo->locate(a.tensors[0].chunks[0].hash).has_value());
  require_model_bytes(*repo, "d", store);

  // The same state after a reopen.
  repo.reset();
  repo = open_repo(tmp.repo());
  CHECK(same_stats(repo->stats(), st));
  CHECK(files_in(packs) == std::set<std::string>{a.pack, d.pack});

  REQUIRE(repo->remove("d").ok());
  CHECK(files_in(packs).empty());
  st = repo->stats();
  CHECK(st.models == 0);
  CHECK(st.packs == 0);
  CHECK(st.physical_bytes == 0);
  CHECK(st.chunks == 0);
  CHECK(st.logical_bytes == 0);
  // An id can be committed again after removal.
  ChunkStore again;
  ModelManifest a2 = make_model("a", "", {u8_tensor(again, "t1", 2 * kChunk, 1)});
  REQUIRE(repo->commit(a2, again.source()).ok());
  require_model_bytes(*repo, "a", again);
}

TEST_CASE("a failed commit leaves nothing behind", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  ModelManifest base = make_model("base", "", {u8_tensor(store, "w", kChunk + 10, 1)});
  REQUIRE(repo->commit(base, store.source()).ok());
  const auto packs_before = files_in(tmp.repo() + "/packs");
  const auto logs_before = slurp(only_file(tmp.repo() + "/logs"));
  const auto stats_before = repo->stats();

  ModelManifest m =
      make_model("new", "base", {u8_tensor(store, "x", 2 * kChunk + 3, 2), u8_tensor(store, "y", 100, 3)});
  StatusCode want = StatusCode::kOk;
  Repository::ChunkSource src = store.source();
  SECTION("duplicate id") {
    m.id = "base";
    m.parent = "";
    want = StatusCode::kExists;
  }
  SECTION("unknown parent") {
    m.parent = "ghost";
    want = StatusCode::kNotFound;
  }
  SECTION("nbytes that disagree with the shape") {
    m.tensors.mut()[1].nbytes = 99;
    want = StatusCode::kInvalidArgument;
  }
  SECTION("chunk lengths that disagree with the chunk size") {
    ChunkStore other;
    m.tensors.mut()[0] = make_tensor(other, "x", DType::kU8, {2 * static_cast<int64_t>(kChunk) + 3},
                                     make_bytes(2 * kChunk + 3, 2), kChunk / 2);
    src = other.source();
    want = StatusCode::kInvalidArgument;
  }
  SECTION("a chunk count that disagrees with nbytes") {
    m.tensors.mut()[0].chunks.pop_back();
    want = StatusCode::kInvalidArgument;
  }
  SECTION("a hash not set") {
    m.tensors.mut()[1].chunks[0].hash = ChunkHash{};
    want = StatusCode::kInvalidArgument;
  }
  SECTION("duplicate tensor names") {
    m.tensors.mut()[1].name = "x";
    want = StatusCode::kInvalidArgument;
  }
  SECTION("an invalid id") {
    m.id = std::string("bad\0id", 6);
    want = StatusCode::kInvalidArgument;
  }
  SECTION("bytes that do not match their hash") {
    src = [&](const ChunkHash& h, uint64_t len) -> Result<const void*> {
      static std::string wrong;
      wrong = store.chunks.at(h);
      wrong[len / 2] ^= 1;
      return static_cast<const void*>(wrong.data());
    };
    want = StatusCode::kInvalidArgument;
  }
  SECTION("a source that fails") {
    src = [](const ChunkHash&, uint64_t) -> Result<const void*> { return unavailable("peer gone"); };
    want = StatusCode::kUnavailable;
  }
  SECTION("no source although chunks are new") {
    src = nullptr;
    want = StatusCode::kInvalidArgument;
  }
  SECTION("metadata that is not valid UTF-8") {
    m.metadata["note"] = std::string("\xff\xfe", 2);
    want = StatusCode::kInvalidArgument;
  }
  SECTION("the pack write fails (file size limit)") {
    // RLIMIT_FSIZE makes write() fail with EFBIG part-way through the pack, like a full disk.
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = kChunk;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    ModelManifest copy = m;
    Status s = repo->commit(copy, src);
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    INFO(s.to_string());
    CHECK(s.code() == StatusCode::kIo);
    CHECK_THAT(s.message(), Catch::Contains("writing its pack"));
    want = StatusCode::kOk;  // checked above
  }
  if (want != StatusCode::kOk) {
    ModelManifest copy = m;
    Status s = repo->commit(copy, src);
    INFO(s.to_string());
    CHECK(s.code() == want);
    CHECK(copy == m);  // untouched on failure
  }
  CHECK(files_in(tmp.repo() + "/packs") == packs_before);
  CHECK(slurp(only_file(tmp.repo() + "/logs")) == logs_before);
  CHECK(same_stats(repo->stats(), stats_before));
  CHECK(repo->list() == std::vector<std::string>{"base"});
  // And a good commit still works afterwards.
  ModelManifest ok = make_model("ok", "base", {u8_tensor(store, "z", 1000, 9)});
  REQUIRE(repo->commit(ok, store.source()).ok());
}

TEST_CASE("readers run while commits land", "[repository]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  constexpr int kModels = 12;
  std::vector<ModelManifest> models(kModels);
  for (int i = 0; i < kModels; ++i) {
    std::string name = "t" + std::to_string(i);
    std::vector<TensorManifest> ts{u8_tensor(store, name, kChunk + 1000 * (i + 1), 100 + i)};
    if (i > 0) ts.push_back(models[0].tensors[0]);  // filled after model 0 commits
    models[i] = make_model("m" + std::to_string(i), i > 0 ? "m" + std::to_string(i - 1) : "", ts);
  }
  REQUIRE(repo->commit(models[0], store.source()).ok());

  std::atomic<int> committed{1};
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      unsigned k = static_cast<unsigned>(r);
      while (!done.load()) {
        int n = committed.load();
        const std::string id = "m" + std::to_string(k % static_cast<unsigned>(n));
        ++k;
        auto m = repo->get(id);
        if (!m.ok()) {
          ++failures;
          continue;
        }
        for (const TensorManifest& t : m->tensors) {
          std::string bytes;
          for (const ChunkRef& c : t.chunks) {
            std::string buf(c.length, '\0');
            if (!repo->read_chunk(c, buf.data()).ok()) ++failures;
            bytes += buf;
          }
          if (bytes != store.tensors.at(t.name)) ++failures;
          ++reads;
        }
        (void)repo->stats();
        (void)repo->list();
      }
    });
  }
  for (int i = 1; i < kModels; ++i) {
    models[i].tensors.mut()[1] = models[0].tensors[0];
    Status s = repo->commit(models[i], store.source());
    REQUIRE(s.ok());
    committed.store(i + 1);
  }
  while (reads.load() < 200) std::this_thread::yield();
  done = true;
  for (auto& t : readers) t.join();
  CHECK(failures.load() == 0);
  CHECK(repo->stats().models == kModels);
}

TEST_CASE("two handles on one repository both write, see each other and keep ids unique", "[repository][shared]") {
  TempDir tmp;
  auto one = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  auto two = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  CHECK(one->writable());
  CHECK(two->writable());
  CHECK(one->writer_id() != two->writer_id());
  ChunkStore store;
  ModelManifest a = make_model("a", "", {u8_tensor(store, "w", kChunk + 5, 1)});
  REQUIRE(one->commit(a, store.source()).ok());
  // An unknown id is looked up on the spot.
  REQUIRE(two->contains("a"));
  require_model_bytes(*two, "a", store);
  // A child through the other handle, deduplicating against the first one's chunks.
  ModelManifest b = make_model("b", "a", {a.tensors[0], u8_tensor(store, "x", 100, 2)});
  store.bytes_asked = 0;
  REQUIRE(two->commit(b, store.source()).ok());
  CHECK(store.bytes_asked == 100);
  auto rr = one->refresh();
  REQUIRE(rr.ok());
  REQUIRE(rr->added.size() == 1);
  CHECK(rr->added[0]->id == "b");
  CHECK(one->children("a") == std::vector<std::string>{"b"});
  // The same id through both: the second loses.
  ModelManifest again = make_model("a", "", {u8_tensor(store, "y", 10, 3)});
  CHECK(two->commit(again, store.source()).code() == StatusCode::kExists);
  // A claim held by a live writer: kExists naming it; released, the id is free.
  REQUIRE(one->claim("c").ok());
  Status s = two->claim("c");
  CHECK(s.code() == StatusCode::kExists);
  CHECK_THAT(s.message(), Catch::Contains(one->writer_id()));
  one->release_claim("c");
  CHECK(two->claim("c").ok());
  two->release_claim("c");
  // Retire through one, seen by the other.
  REQUIRE(one->retire("b").ok());
  REQUIRE(two->refresh().ok());
  CHECK(two->get("b")->retired_ns != 0);
  CHECK(two->stats().writers_alive == 2);
  // Both close; a reopen sees everything.
  one.reset();
  two.reset();
  auto three = open_repo(tmp.repo());
  CHECK(three->list().size() == 2);
  require_model_bytes(*three, "b", store);
  auto f = three->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
}

TEST_CASE("manifest JSON is strict and round-trips", "[repository]") {
  ModelManifest m;
  m.id = "model";
  m.parent = "parent";
  m.created_ns = 1234567890123;
  m.metadata = {{"score", 0.25}, {"tags", {"a", "b"}}};
  m.architecture = nullptr;
  m.pack = "0011223344556677-00000000000004d2.safetensors";
  m.source_header = std::string("\x02\0\0\0\0\0\0\0{}", 10);
  TensorManifest t;
  t.name = "w";
  t.dtype = DType::kBF16;
  t.shape = {2, 3};
  t.nbytes = 12;
  ChunkRef c;
  c.hash = hash_bytes("abc", 3);
  c.length = 12;
  c.pack = m.pack;
  c.offset = 128;
  t.chunks.push_back(c);
  m.tensors.push_back(t);

  nlohmann::json j = manifest_to_json(m);
  CHECK(j["format"] == 1);
  CHECK(j["tensors"][0]["dtype"] == "BF16");
  CHECK(j["source_header"] == "AgAAAAAAAAB7fQ==");
  auto back = manifest_from_json(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(*back == m);

  auto expect_error = [](const nlohmann::json& bad, const std::string& field) {
    auto r = manifest_from_json(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(field));
  };
  {
    auto bad = j;
    bad["extra"] = 1;
    expect_error(bad, "extra");
  }
  {
    auto bad = j;
    bad.erase("parent");
    expect_error(bad, "parent");
  }
  {
    auto bad = j;
    bad["format"] = 2;
    expect_error(bad, "format");
  }
  {
    auto bad = j;
    bad["tensors"][0]["chunks"][0]["pack"] = "../../etc/passwd.safetensors";
    expect_error(bad, "tensors[0].chunks[0].pack");
  }
  {
    auto bad = j;
    bad["tensors"][0]["chunks"][0]["length"] = -1;
    expect_error(bad, "tensors[0].chunks[0].length");
  }
  {
    auto bad = j;
    bad["tensors"][0]["nbytes"] = 13;
    expect_error(bad, "tensors[0]");
  }
  {
    auto bad = j;
    bad["tensors"][0]["shape"] = {2, 3.5};
    expect_error(bad, "tensors[0].shape");
  }
  {
    auto bad = j;
    bad["tensors"][0]["chunks"][0]["hash"] = "XYZ";
    expect_error(bad, "tensors[0].chunks[0].hash");
  }
  {
    auto bad = j;
    bad["source_header"] = "AgAAAAAAAAB7fQ=";
    expect_error(bad, "source_header");
  }
  {
    auto bad = j;
    bad["metadata"] = "not an object";
    expect_error(bad, "metadata");
  }
  {
    auto bad = j;
    nlohmann::json deep = nlohmann::json::object();
    for (int i = 0; i < 100; ++i) deep = nlohmann::json{{"d", deep}};
    bad["metadata"] = deep;
    expect_error(bad, "metadata");
  }
  expect_error(nlohmann::json::array(), "manifest");
}

TEST_CASE("retire and gc: collected lineage, exact reclaim, holes punched, state survives reopen", "[repository][gc]") {
  TempDir tmp;
  auto repo = open_repo(tmp.repo());
  ChunkStore store;
  // a -> b -> c; b inherits a's t1; c inherits b's t3.
  ModelManifest a = make_model("a", "", {u8_tensor(store, "t1", 2 * kChunk, 1), u8_tensor(store, "t2", kChunk, 2)});
  ModelManifest b = make_model("b", "a", {a.tensors[0], u8_tensor(store, "t3", kChunk, 3)});
  ModelManifest c = make_model("c", "b", {b.tensors[1], u8_tensor(store, "t4", kChunk, 4)});
  for (ModelManifest* m : {&a, &b, &c}) REQUIRE(repo->commit(*m, store.source()).ok());
  CHECK(repo->stats().physical_bytes == 5 * kChunk);
  CHECK(repo->retire("nope").code() == StatusCode::kNotFound);

  // Retiring changes no data; gc with nothing retired does nothing.
  auto r = repo->gc();
  REQUIRE(r.ok());
  CHECK(r->removed.empty());
  CHECK(r->bytes_released == 0);
  REQUIRE(repo->retire("a").ok());
  REQUIRE(repo->retire("a").ok());
  CHECK(repo->stats().retired == 1);
  CHECK(repo->stats().physical_bytes == 5 * kChunk);
  require_model_bytes(*repo, "a", store);

  // a has live descendants: collected. Only t2 was a's alone.
  r = repo->gc();
  REQUIRE(r.ok());
  CHECK(r->removed.empty());
  CHECK(r->collected == std::vector<std::string>{"a"});
  CHECK(r->bytes_released == kChunk);
  CHECK(r->packs_deleted == 0);  // a's pack still holds t1, which b uses
  CHECK(r->bytes_punched >= kChunk - 8192);
  CHECK(repo->stats().physical_bytes == 4 * kChunk);
  auto ga = repo->get("a");
  REQUIRE(ga.ok());
  CHECK(ga->collected);
  CHECK(ga->tensors.empty());
  require_model_bytes(*repo, "b", store);
  require_model_bytes(*repo, "c", store);
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->ok());
  CHECK(f->orphaned.empty());
  CHECK(f->bytes_verified == 5 * kChunk);  // b: t1 (2 chunks) + t3; c: t3 + t4

  // The same after a reopen.
  RepositoryStats before = repo->stats();
  repo.reset();
  repo = open_repo(tmp.repo());
  CHECK(same_stats(repo->stats(), before));
  CHECK(repo->get("a")->collected);

  // Retire the rest: c goes first (a leaf), then b and a, whose last child went.
  REQUIRE(repo->retire("b").ok());
  REQUIRE(repo->retire("c").ok());
  r = repo->gc();
  REQUIRE(r.ok());
  CHECK(r->removed == std::vector<std::string>{"c", "b", "a"});
  CHECK(r->bytes_released == 4 * kChunk);
  CHECK(repo->stats().models == 0);
  CHECK(repo->stats().physical_bytes == 0);
  CHECK(files_in(tmp.repo() + "/packs").empty());
}

TEST_CASE("gc killed with SIGKILL at random moments never loses a live model", "[repository][gc]") {
  TempDir tmp;
  ChunkStore store;
  std::mt19937_64 rng(11);
  std::vector<ModelManifest> models;
  std::set<std::string> retired;
  {
    auto repo = open_repo(tmp.repo());
    for (int i = 0; i < 120; ++i) {
      std::vector<TensorManifest> ts{u8_tensor(store, "own" + std::to_string(i), kChunk / 2 + i, 1000 + i)};
      std::string parent;
      if (i > 0) {
        const ModelManifest& p = models[rng() % models.size()];
        parent = p.id;
        for (const auto& t : p.tensors)
          if (ts.size() < 4) ts.push_back(t);
      }
      ModelManifest m = make_model("n" + std::to_string(i), parent, ts);
      REQUIRE(repo->commit(m, store.source()).ok());
      models.push_back(m);
    }
    for (const auto& m : models)
      if (rng() % 2 == 0) {
        REQUIRE(repo->retire(m.id).ok());
        retired.insert(m.id);
      }
  }
  auto check_live = [&](Repository& repo) {
    for (const auto& m : models) {
      if (retired.count(m.id)) continue;
      INFO("model " << m.id);
      REQUIRE(repo.contains(m.id));
      for (const auto& t : m.tensors)
        REQUIRE(read_tensor(repo, *repo.get(m.id)->find(t.name)) == store.tensors.at(t.name));
    }
    auto f = repo.fsck(true);
    REQUIRE(f.ok());
    REQUIRE(f->dangling.empty());
  };
  size_t interrupted_midway = 0;
  auto model_count = [&] { return open_repo(tmp.repo())->stats().models; };
  size_t models_before = model_count();
  bool completed = false;
  for (int trial = 0; trial < 12 && !completed; ++trial) {
    completed = fork_and_kill(
        [&] {
          auto repo = Repository::open(tmp.repo(), kChunk);
          if (!repo.ok() || !(*repo)->writable()) return 3;
          return (*repo)->gc().ok() ? 0 : 4;
        },
        rng, 60000, trial >= 11);
    size_t now = model_count();
    if (!completed && now != models_before) ++interrupted_midway;
    models_before = now;
    auto repo = open_repo(tmp.repo());
    check_live(*repo);
  }
  // Finish (or repeat) the collection; everything dead is gone and nothing live is.
  auto repo = open_repo(tmp.repo());
  auto r = repo->gc();
  REQUIRE(r.ok());
  check_live(*repo);
  auto f = repo->fsck(false);
  REQUIRE(f.ok());
  CHECK(f->orphaned.empty());
  uint64_t live_bytes = 0;
  std::set<ChunkHash> seen;
  for (const auto& m : models)
    if (!retired.count(m.id))
      for (const auto& t : m.tensors)
        for (const auto& c : t.chunks)
          if (seen.insert(c.hash).second) live_bytes += c.length;
  CHECK(repo->stats().physical_bytes == live_bytes);
  WARN("gc runs killed part-way: " << interrupted_midway);
}

// ---------------------------------------------------------------------------------------------
// Faults injected through the FileSystem seam (core/fs.hpp): the repository's pack and manifest
// writes and its chunk reads go through a FaultyFileSystem over the real filesystem.

namespace {

struct FaultyRepo {
  TempDir tmp;
  FaultyFileSystem faulty{posix_fs()};
  std::unique_ptr<Repository> repo;
  ChunkStore store;
  std::set<std::string> packs_before;
  std::string log_before;
  RepositoryStats stats_before;

  // Opens the repository over the faulty filesystem with one model ("base") committed.
  FaultyRepo() {
    auto r = Repository::open(tmp.repo(), kChunk, &faulty);
    INFO(r.status().to_string());
    REQUIRE(r.ok());
    repo = std::move(r).value();
    ModelManifest base = make_model("base", "", {u8_tensor(store, "w", kChunk + 10, 1)});
    REQUIRE(repo->commit(base, store.source()).ok());
    packs_before = files_in(tmp.repo() + "/packs");
    log_before = slurp(only_file(tmp.repo() + "/logs"));
    stats_before = repo->stats();
  }

  // A child of base with two new tensors (a pack of three chunks).
  ModelManifest new_model(const std::string& id) {
    return make_model(id, "base", {u8_tensor(store, "x", 2 * kChunk + 3, 2), u8_tensor(store, "y", 100, 3)});
  }

  // The failed commit of id left nothing: no model, no pack, no manifest, no temporary file.
  void require_nothing_visible(const std::string& id) {
    CHECK_FALSE(repo->contains(id));
    CHECK(repo->list() == std::vector<std::string>{"base"});
    CHECK(files_in(tmp.repo() + "/packs") == packs_before);
    CHECK(slurp(only_file(tmp.repo() + "/logs")) == log_before);
    CHECK(same_stats(repo->stats(), stats_before));
  }
};

}  // namespace

TEST_CASE("ENOSPC writing a pack: kNoSpace, nothing visible, and a later commit works", "[repository][faults]") {
  FaultyRepo t;
  t.faulty.add({.op = FaultyFileSystem::Op::kWrite, .path_contains = "/packs/", .err = ENOSPC});
  ModelManifest m = t.new_model("new");
  ModelManifest copy = m;
  Status s = t.repo->commit(copy, t.store.source());
  INFO(s.to_string());
  CHECK(s.code() == StatusCode::kNoSpace);
  CHECK_THAT(s.message(), Catch::Contains("pack segment"));
  CHECK(t.faulty.injected() == 1);
  CHECK(copy == m);
  t.require_nothing_visible("new");

  t.faulty.clear();
  copy = m;
  REQUIRE(t.repo->commit(copy, t.store.source()).ok());
  require_model_bytes(*t.repo, "new", t.store);
  t.repo.reset();
  auto reopened = open_repo(t.tmp.repo());
  CHECK(reopened->list() == std::vector<std::string>{"base", "new"});
  require_model_bytes(*reopened, "new", t.store);
}

TEST_CASE("a torn log write: the commit fails and nothing is visible", "[repository][faults]") {
  FaultyRepo t;
  t.faulty.add(
      {.op = FaultyFileSystem::Op::kWrite, .path_contains = "/logs/", .effect = FaultyFileSystem::Effect::kShortWrite});
  ModelManifest m = t.new_model("torn");
  Status s = t.repo->commit(m, t.store.source());
  INFO(s.to_string());
  CHECK(s.code() == StatusCode::kIo);
  CHECK_THAT(s.message(), Catch::Contains("writing the repository log"));
  CHECK(t.faulty.injected() == 1);
  t.require_nothing_visible("torn");  // the log was cut back; the segment's bytes are dead
  t.repo.reset();
  auto reopened = open_repo(t.tmp.repo());
  CHECK(reopened->list() == std::vector<std::string>{"base"});
}

TEST_CASE("a bit flipped while reading a chunk is kCorruption, never the bytes", "[repository][faults]") {
  FaultyRepo t;
  ModelManifest m = t.new_model("m");
  REQUIRE(t.repo->commit(m, t.store.source()).ok());
  const ChunkRef& c = m.tensors[0].chunks[1];
  t.faulty.add(
      {.op = FaultyFileSystem::Op::kRead, .path_contains = "/packs/", .effect = FaultyFileSystem::Effect::kFlipBit});
  std::string buf(c.length, '\0');
  Status s = t.repo->read_chunk(c, buf.data());
  CHECK(s.code() == StatusCode::kCorruption);
  CHECK_THAT(s.message(), Catch::Contains(c.pack));
  CHECK_THAT(s.message(), Catch::Contains(c.hash.hex()));
  CHECK(t.faulty.injected() == 1);
  // The stored bytes are intact: the next read (the rule is spent) returns them.
  REQUIRE(t.repo->read_chunk(c, buf.data()).ok());
  CHECK(hash_bytes(buf.data(), buf.size()) == c.hash);
}

TEST_CASE("a failed sync fails the commit and leaves nothing visible", "[repository][faults]") {
  FaultyRepo t;
  using Op = FaultyFileSystem::Op;
  SECTION("fsync of the pack segment") { t.faulty.add({.op = Op::kSync, .path_contains = "/packs/"}); }
  SECTION("fsync of the log") { t.faulty.add({.op = Op::kSync, .path_contains = "/logs/"}); }
  ModelManifest m = t.new_model("unsynced");
  Status s = t.repo->commit(m, t.store.source());
  INFO(s.to_string());
  CHECK(s.code() == StatusCode::kIo);
  CHECK(t.faulty.injected() == 1);
  t.require_nothing_visible("unsynced");
  t.repo.reset();
  auto reopened = open_repo(t.tmp.repo());
  CHECK(reopened->list() == std::vector<std::string>{"base"});
}
