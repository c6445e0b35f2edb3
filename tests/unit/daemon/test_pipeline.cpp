// Pipelined commits (docs/protocol.md, "Pipelined commits"): the client sends commits at durability
// memory without waiting for their replies, and each reply resolves its commit's ticket. Runs a real
// engine and server in-process and talks to them through the client library over the socket; the
// "daemon dies" cases use a fake daemon that answers some requests and then closes the connection.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "api/cpp/connection.hpp"
#include "core/wire.hpp"
#include "daemon/server.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using nlohmann::json;
using namespace engine_test;

struct Daemon {
  TempDir dir;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> server;
  std::string socket;
  Daemon() {
    engine = make_engine(dir.repo());
    socket = dir.path + "/run/cairnd.sock";
    auto s = Server::start(*engine, socket);
    INFO((s.ok() ? std::string() : s.status().to_string()));
    REQUIRE(s.ok());
    server = std::move(s).value();
  }
  std::unique_ptr<Connection> connect() const {
    auto c = Connection::connect(socket);
    INFO((c.ok() ? std::string() : c.status().to_string()));
    REQUIRE(c.ok());
    return std::move(c).value();
  }
};

// A base model with a few inline tensors, committed the blocking way.
void commit_base(Connection& c, const std::string& id) {
  ConnectionWriter w(c, id, "");
  for (int t = 0; t < 4; ++t) {
    auto bytes = pattern(1000 + t, static_cast<uint64_t>(t));
    REQUIRE(w.add_tensor("t" + std::to_string(t), bytes.data(), DType::kU8, {static_cast<int64_t>(bytes.size())}).ok());
  }
  REQUIRE(w.commit(Durability::kGlobal, true).ok());
}

Result<Ticket> metadata_commit(Connection& c, const std::string& id, const std::string& parent, int step) {
  ConnectionWriter w(c, id, parent);
  CAIRN_RETURN_IF_ERROR(w.inherit_all());
  CAIRN_RETURN_IF_ERROR(w.set_metadata(json{{"step", step}}));
  return w.commit_async(Durability::kMemory);
}

TEST_CASE("pipelined commits: many in flight, in order, then waited") {
  Daemon d;
  auto c = d.connect();
  commit_base(*c, "base");
  const uint64_t requests_before = c->requests();
  std::vector<Ticket> tickets;
  size_t max_in_flight = 0;
  const int n = 1000;
  for (int i = 0; i < n; ++i) {
    // Each child names the one committed just before it: ordering makes the parent exist.
    auto t = metadata_commit(*c, "m" + std::to_string(i), i ? "m" + std::to_string(i - 1) : "base", i);
    REQUIRE(t.ok());
    tickets.push_back(*t);
    max_in_flight = std::max(max_in_flight, c->in_flight());
    REQUIRE(c->in_flight() <= Connection::kMaxInFlight);
  }
  // Nothing waited for the replies: the first commit's reply is still to be collected after it was sent.
  CHECK(max_in_flight > 1);
  CHECK(c->requests() - requests_before == static_cast<uint64_t>(n));
  for (int i = 0; i < n; ++i) {
    INFO("ticket " << i << ": " << tickets[static_cast<size_t>(i)]->status.to_string());
    REQUIRE(c->wait(tickets[static_cast<size_t>(i)], -1).ok());
    REQUIRE(tickets[static_cast<size_t>(i)]->resolved);
  }
  CHECK(c->in_flight() == 0);
  CHECK(c->flush_pipeline().ok());
  // Another connection sees the whole chain, with its metadata and the inherited tensors.
  auto other = d.connect();
  auto r = ConnectionReader::open(*other, "m999");
  REQUIRE(r.ok());
  CHECK((*r)->parent() == "m998");
  CHECK((*r)->metadata()["step"] == 999);
  CHECK((*r)->tensors().size() == 4);
  std::vector<uint8_t> out(1002);
  REQUIRE((*r)->read("t2", out.data(), out.size()).ok());
  CHECK(out == pattern(1002, 2));
}

TEST_CASE("pipelined commits: an error lands on its own ticket, later commits succeed") {
  Daemon d;
  auto c = d.connect();
  commit_base(*c, "base");
  std::vector<Ticket> tickets;
  for (int i = 0; i < 20; ++i) {
    std::string id = "p" + std::to_string(i), parent = i ? "p" + std::to_string(i - 1) : "base";
    if (i == 7) id = "base";                // taken: kExists
    if (i == 8) parent = "p6";              // p7 was never made: skip it
    if (i == 12) parent = "no-such-model";  // kNotFound
    if (i == 13) parent = "p11";
    auto t = metadata_commit(*c, id, parent, i);
    REQUIRE(t.ok());
    tickets.push_back(*t);
  }
  // A request that needs its reply collects the replies before it; their errors are not its own.
  auto ping = c->call(json{{"op", "ping"}});
  CHECK(ping.ok());
  CHECK(c->in_flight() == 0);
  for (int i = 0; i < 20; ++i) {
    Status st = c->wait(tickets[static_cast<size_t>(i)], -1);
    INFO("ticket " << i << ": " << st.to_string());
    if (i == 7) {
      CHECK(st.code() == StatusCode::kExists);
      CHECK(st.message().find("'base'") != std::string::npos);
      CHECK(c->wait(tickets[7], 0).code() == StatusCode::kExists);  // waiting again: the same outcome
    } else if (i == 12) {
      CHECK(st.code() == StatusCode::kNotFound);
      CHECK(st.message().find("no-such-model") != std::string::npos);
    } else {
      CHECK(st.ok());
    }
  }
  auto other = d.connect();
  CHECK(ConnectionReader::open(*other, "p19").ok());
  CHECK(ConnectionReader::open(*other, "p12").status().code() == StatusCode::kNotFound);
  auto base = ConnectionReader::open(*other, "base");
  REQUIRE(base.ok());
  CHECK((*base)->tensors().size() == 4);  // the failed duplicate changed nothing
}

TEST_CASE("pipelined commits: the error of a dropped ticket is reported by flush_pipeline") {
  Daemon d;
  auto c = d.connect();
  commit_base(*c, "base");
  {
    auto t = metadata_commit(*c, "base", "base", 0);  // a duplicate id; the ticket is dropped unwaited
    REQUIRE(t.ok());
  }
  auto kept = metadata_commit(*c, "k1", "base", 1);
  REQUIRE(kept.ok());
  Status st = c->flush_pipeline();
  CHECK(st.code() == StatusCode::kExists);
  CHECK(c->flush_pipeline().ok());  // reported once
  CHECK((*kept)->resolved);
  CHECK(c->wait(*kept, 0).ok());
}

TEST_CASE("pipelined commits: big inline commits do not deadlock the socket") {
  Daemon d;
  auto c = d.connect();
  // 300 commits of 60 KiB each: far more than the socket buffers hold in either direction.
  std::vector<Ticket> tickets;
  auto bytes = pattern(60 * 1024, 7);
  for (int i = 0; i < 300; ++i) {
    bytes[0] = static_cast<uint8_t>(i);
    bytes[1] = static_cast<uint8_t>(i >> 8);
    ConnectionWriter w(*c, "big" + std::to_string(i), "");
    REQUIRE(w.add_tensor("w", bytes.data(), DType::kU8, {static_cast<int64_t>(bytes.size())}).ok());
    auto t = w.commit_async(Durability::kMemory);
    REQUIRE(t.ok());
    tickets.push_back(*t);
  }
  REQUIRE(c->flush_pipeline().ok());
  for (auto& t : tickets) CHECK(c->wait(t, 0).ok());
  auto r = ConnectionReader::open(*c, "big299");
  REQUIRE(r.ok());
  std::vector<uint8_t> out(bytes.size());
  REQUIRE((*r)->read("w", out.data(), out.size()).ok());
  CHECK(out[0] == static_cast<uint8_t>(299));
  CHECK(out[1] == static_cast<uint8_t>(299 >> 8));
}

TEST_CASE("pipelined commits: above memory the commit answers before returning") {
  Daemon d;
  auto c = d.connect();
  commit_base(*c, "base");
  ConnectionWriter w(*c, "base", "");  // taken: reported by the call itself, as before
  CHECK(w.commit_async(Durability::kGlobal).status().code() == StatusCode::kExists);
  ConnectionWriter g(*c, "g1", "base");
  REQUIRE(g.inherit_all().ok());
  auto t = g.commit_async(Durability::kGlobal);
  REQUIRE(t.ok());
  CHECK((*t)->resolved);
  CHECK((*t)->daemon_ticket != 0);
  CHECK(c->wait(*t, 60000).ok());
  CHECK((*t)->daemon_ticket == 0);
}

TEST_CASE("commit with ticket false keeps no ticket in the daemon") {
  TempDir dir;
  auto e = make_engine(dir.repo());
  Session s;
  commit_inline(*e, s, "base", "", {{"a", pattern(100, 1)}});
  json r = ok(*e, s,
              json{{"op", "commit"},
                   {"id", "c1"},
                   {"parent", "base"},
                   {"tensors", json::array()},
                   {"inherit_all", true},
                   {"durability", "memory"},
                   {"wait", false},
                   {"ticket", false}});
  CHECK_FALSE(r.contains("ticket"));
  CHECK(r["reached"] == "memory");
  CHECK(s.tickets.empty());
  r = ok(*e, s,
         json{{"op", "commit"},
              {"id", "c2"},
              {"parent", "base"},
              {"tensors", json::array()},
              {"inherit_all", true},
              {"durability", "memory"},
              {"wait", false}});
  CHECK(r.contains("ticket"));
  fails(*e, s, json{{"op", "commit"}, {"id", "c3"}, {"tensors", json::array()}, {"ticket", 1}},
        StatusCode::kInvalidArgument, "'ticket'");
}

// A fake daemon: answers hello (with an arena descriptor), reads `read` requests, answers the first
// `answer` of them, then closes the connection as a dying daemon would.
struct FakeDaemon {
  TempDir dir;
  std::string socket;
  int listen_fd = -1;
  std::thread thread;
  std::atomic<int> requests_read{0};
  FakeDaemon(int read, int answer) {
    socket = dir.path + "/fake.sock";
    listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
    REQUIRE(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_fd, 4) == 0);
    thread = std::thread([this, read, answer] {
      int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) return;
      auto hello = wire::recv_frame(fd);
      int arena = ::memfd_create("fake-arena", MFD_CLOEXEC);
      if (hello.ok() && arena >= 0 && ::ftruncate(arena, 1 << 20) == 0)
        (void)wire::send_frame(fd, wire::Kind::kResponse,
                               json{{"status", 0}, {"arena_size", 1 << 20}, {"chunk_size", 65536}}, {}, arena);
      if (arena >= 0) ::close(arena);
      for (int i = 0; i < read; ++i) {
        auto f = wire::recv_frame(fd);
        if (!f.ok()) break;
        ++requests_read;
        if (i < answer) (void)wire::send_frame(fd, wire::Kind::kResponse, json{{"status", 0}, {"id", f->body["id"]}});
      }
      ::close(fd);
    });
  }
  ~FakeDaemon() {
    ::shutdown(listen_fd, SHUT_RDWR);
    if (thread.joinable()) thread.join();
    ::close(listen_fd);
  }
};

TEST_CASE("pipelined commits: a daemon dying mid-pipeline fails the unanswered tickets, no hang") {
  FakeDaemon fake(10, 4);
  auto c = Connection::connect(fake.socket);
  REQUIRE(c.ok());
  std::vector<Ticket> tickets;
  for (int i = 0; i < 10; ++i) {
    auto t = metadata_commit(**c, "m" + std::to_string(i), "base", i);
    REQUIRE(t.ok());
    tickets.push_back(*t);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    Status st = (*c)->wait(tickets[static_cast<size_t>(i)], 30000);
    INFO("ticket " << i << ": " << st.to_string());
    if (i < 4) {
      CHECK(st.ok());
    } else {
      CHECK(st.code() == StatusCode::kUnavailable);
      CHECK(st.message().find("lost the connection") != std::string::npos);
    }
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK((*c)->flush_pipeline().code() == StatusCode::kUnavailable);
  // Later calls fail at once too.
  CHECK((*c)->call(json{{"op", "ping"}}).status().code() == StatusCode::kUnavailable);
  auto t = metadata_commit(**c, "late", "base", 0);
  CHECK(t.status().code() == StatusCode::kUnavailable);
}

TEST_CASE("pipelined commits: a reply that does not come in time is a timeout, then can be waited again") {
  FakeDaemon fake(3, 0);  // reads, never answers, closes after the third request
  auto c = Connection::connect(fake.socket);
  REQUIRE(c.ok());
  auto t1 = metadata_commit(**c, "a", "base", 0);
  REQUIRE(t1.ok());
  Status st = (*c)->wait(*t1, 50);
  CHECK(st.code() == StatusCode::kTimeout);
  CHECK_FALSE((*t1)->resolved);
  auto t2 = metadata_commit(**c, "b", "base", 1);
  auto t3 = metadata_commit(**c, "c", "base", 2);
  REQUIRE(t2.ok());
  REQUIRE(t3.ok());
  CHECK((*c)->wait(*t1, 30000).code() == StatusCode::kUnavailable);
  CHECK((*c)->wait(*t3, 0).code() == StatusCode::kUnavailable);
}

// A model of `tensors` tensors of `each` bytes, committed at global (so DRAM may drop its chunks).
std::vector<std::vector<uint8_t>> commit_big(Connection& c, const std::string& id, int tensors, size_t each,
                                             uint64_t seed) {
  std::vector<std::vector<uint8_t>> bytes;
  ConnectionWriter w(c, id, "");
  for (int t = 0; t < tensors; ++t) {
    bytes.push_back(pattern(each, seed + static_cast<uint64_t>(t)));
    REQUIRE(w.add_tensor("t" + std::to_string(t), bytes.back().data(), DType::kU8, {static_cast<int64_t>(each)}).ok());
  }
  REQUIRE(w.commit(Durability::kGlobal, true).ok());
  return bytes;
}

uint64_t pinned_bytes(Connection& c) {
  auto st = c.call(json{{"op", "stats"}});
  REQUIRE(st.ok());
  return (*st)["tiers"]["dram"].value("pinned_bytes", uint64_t{0});
}

TEST_CASE("pipelined reads: a large read_many leases its groups of tensors at once and reads every byte") {
  Daemon d;
  auto c = d.connect();
  // 48 MiB in 12 tensors: groups of 32 MiB and 16 MiB, two lease requests sent before any reply.
  auto bytes = commit_big(*c, "big", 12, 4u << 20, 7);
  auto r = ConnectionReader::open(*c, "big");
  REQUIRE(r.ok());
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> out(12, std::vector<uint8_t>(4u << 20));
  std::vector<std::span<uint8_t>> dsts;
  for (int t = 0; t < 12; ++t) names.push_back("t" + std::to_string(t)), dsts.emplace_back(out[static_cast<size_t>(t)]);
  const uint64_t before = c->requests();
  REQUIRE((*r)->read_many(names, dsts).ok());
  CHECK(c->requests() - before == 2);
  for (size_t t = 0; t < 12; ++t) CHECK(out[t] == bytes[t]);
  // The leases go back with the next request.
  CHECK(pinned_bytes(*c) == 0);
  // A small read is one request.
  const uint64_t before_small = c->requests();
  REQUIRE((*r)->read_many({"t0", "t1"}, {dsts[0], dsts[1]}).ok());
  CHECK(c->requests() - before_small == 1);
}

TEST_CASE("pipelined reads: a group that cannot be leased fails the read and leaves nothing pinned") {
  Daemon d;
  auto c = d.connect();
  // Two 40 MiB models in a 64 MiB arena: while B is mapped (pinned), A's groups cannot all be
  // loaded back into DRAM.
  auto a = commit_big(*c, "a", 10, 4u << 20, 100);
  auto b = commit_big(*c, "b", 10, 4u << 20, 200);
  std::vector<std::string> names;
  for (int t = 0; t < 10; ++t) names.push_back("t" + std::to_string(t));
  auto rb = ConnectionReader::open(*c, "b");
  REQUIRE(rb.ok());
  auto views = (*rb)->map_many(names);
  REQUIRE(views.ok());
  const uint64_t held = pinned_bytes(*c);
  CHECK(held >= (40ull << 20));

  auto ra = ConnectionReader::open(*c, "a");
  REQUIRE(ra.ok());
  std::vector<std::vector<uint8_t>> out(10, std::vector<uint8_t>(4u << 20));
  std::vector<std::span<uint8_t>> dsts;
  for (auto& o : out) dsts.emplace_back(o);
  Status st = (*ra)->read_many(names, dsts);
  CHECK(st.code() == StatusCode::kNoSpace);
  INFO(st.to_string());
  // A's groups that were leased are released; B's lease is untouched.
  CHECK(pinned_bytes(*c) == held);
  for (size_t t = 0; t < 10; ++t) CHECK(std::memcmp(views->at(t).data(), b[t].data(), b[t].size()) == 0);
  (*rb)->close();
  CHECK(pinned_bytes(*c) == 0);
  // With B gone from DRAM's pins, A reads back whole.
  REQUIRE((*ra)->read_many(names, dsts).ok());
  for (size_t t = 0; t < 10; ++t) CHECK(out[t] == a[t]);
}

TEST_CASE("sealed tensors: hashed while the next is written, stored under the same chunks as a plain add") {
  Daemon d;
  auto c = d.connect();
  // 3 tensors of 200 KiB (chunks of 64 KiB: 4 chunks each, the last one short).
  std::vector<std::vector<uint8_t>> bytes;
  for (int t = 0; t < 3; ++t) bytes.push_back(pattern(200u << 10, 300 + static_cast<uint64_t>(t)));
  {
    ConnectionWriter w(*c, "sealed", "");
    for (int t = 0; t < 3; ++t) {
      const std::string name = "t" + std::to_string(t);
      auto p = w.add_tensor_space(name, DType::kU8, {static_cast<int64_t>(bytes[static_cast<size_t>(t)].size())});
      REQUIRE(p.ok());
      std::memcpy(*p, bytes[static_cast<size_t>(t)].data(), bytes[static_cast<size_t>(t)].size());
      if (t < 2) REQUIRE(w.seal_tensor(name).ok());  // t2 is left to the daemon to hash
    }
    CHECK(w.seal_tensor("t0").code() == StatusCode::kInvalidArgument);  // twice
    CHECK(w.seal_tensor("nope").code() == StatusCode::kInvalidArgument);
    REQUIRE(w.commit(Durability::kGlobal, true).ok());
  }
  auto chunks = [&] {
    auto st = c->call(json{{"op", "stats"}});
    REQUIRE(st.ok());
    return (*st)["repository"].value("chunks", uint64_t{0});
  };
  const uint64_t after_sealed = chunks();
  // The same bytes through add_tensor (hashed by the client's copy): no new chunk, so the sealed
  // hashes are the bytes' true hashes.
  {
    ConnectionWriter w(*c, "plain", "");
    for (int t = 0; t < 3; ++t)
      REQUIRE(w.add_tensor("t" + std::to_string(t), bytes[static_cast<size_t>(t)].data(), DType::kU8,
                           {static_cast<int64_t>(bytes[static_cast<size_t>(t)].size())})
                  .ok());
    CHECK(w.seal_tensor("t0").code() == StatusCode::kInvalidArgument);  // not arena space
    REQUIRE(w.commit(Durability::kGlobal, true).ok());
  }
  CHECK(chunks() == after_sealed);
  auto r = ConnectionReader::open(*c, "sealed");
  REQUIRE(r.ok());
  for (int t = 0; t < 3; ++t) {
    std::vector<uint8_t> out(bytes[static_cast<size_t>(t)].size());
    REQUIRE((*r)->read("t" + std::to_string(t), out.data(), out.size()).ok());
    CHECK(out == bytes[static_cast<size_t>(t)]);
  }
  // A writer aborted with a seal in flight frees its spaces once the hash is done.
  {
    ConnectionWriter w(*c, "aborted", "");
    auto p = w.add_tensor_space("t", DType::kU8, {8 << 20});
    REQUIRE(p.ok());
    std::memset(*p, 7, 8u << 20);
    REQUIRE(w.seal_tensor("t").ok());
    w.abort();
    CHECK(w.seal_tensor("t").code() == StatusCode::kInvalidArgument);
  }
  CHECK(pinned_bytes(*c) == 0);
}

}  // namespace
}  // namespace cairn
