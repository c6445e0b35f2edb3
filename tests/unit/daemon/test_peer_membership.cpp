// Peer membership: the rendezvous directory, the group secret, member files and their liveness
// (dead pids, stale heartbeats, garbage files), and the race of many first members.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "daemon/peers/membership.hpp"
#include "unit/child_wait.hpp"
#include "unit/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Membership> join_ok(const std::string& rendezvous, const std::string& job,
                                    const std::string& address = "addr", std::chrono::milliseconds timeout = 10s) {
  auto m = Membership::join(rendezvous, job, address, timeout);
  INFO(m.status().to_string());
  REQUIRE(m.ok());
  return std::move(m).value();
}

std::vector<std::string> ids(const std::vector<MemberInfo>& v) {
  std::vector<std::string> out;
  for (const auto& m : v) out.push_back(m.id);
  return out;
}

bool contains(const std::vector<MemberInfo>& v, const std::string& id) {
  for (const auto& m : v) {
    if (m.id == id) return true;
  }
  return false;
}

void write_file(const std::string& path, const std::string& text, mode_t mode = 0600) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, mode);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  REQUIRE(::fchmod(fd, mode) == 0);
  ::close(fd);
}

void set_mtime_ago(const std::string& path, std::chrono::seconds ago) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= ago.count();
  times[1] = times[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

std::string member_json(const std::string& id, const std::string& host, int64_t pid) {
  return R"({"id":")" + id + R"(","host":")" + host + R"(","pid":)" + std::to_string(pid) +
         R"(,"address":"6869","started":1700000000})";
}

std::string hostname() {
  char buf[256] = {};
  REQUIRE(::gethostname(buf, sizeof buf - 1) == 0);
  return buf;
}

mode_t mode_of(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("peer membership: two members of a job see each other and share the secret", "[peers]") {
  testing::TempDir tmp("cairn-members");
  const std::string rv = tmp.path + "/rv/nested";  // created like mkdir -p
  auto a = join_ok(rv, "job1", std::string("addr\0a", 6));
  auto b = join_ok(rv, "job1", "addr-b");

  CHECK(a->directory() == rv + "/job1");
  CHECK(a->self().id.size() == 17);
  CHECK(a->self().id[0] == 'm');
  CHECK(a->self().id != b->self().id);
  CHECK(a->self().pid == ::getpid());
  CHECK(a->self().host == hostname());
  REQUIRE(a->secret().size() == 32);
  CHECK(a->secret() == b->secret());
  CHECK(mode_of(rv + "/job1/secret") == 0600);
  CHECK(mode_of(rv + "/job1") == 0700);
  CHECK(mode_of(rv + "/job1/members") == 0700);

  auto sa = a->scan();
  auto sb = b->scan();
  REQUIRE(sa.size() == 2);
  CHECK(sa == sb);
  CHECK(sa[0].id < sa[1].id);
  // The other member's entry comes from its file: the address survives the hex round trip.
  const MemberInfo& a_seen_by_b = sb[0].id == a->self().id ? sb[0] : sb[1];
  CHECK(a_seen_by_b == a->self());
  CHECK(a_seen_by_b.address == std::string("addr\0a", 6));

  // A third member of another job sees only itself, and has its own secret.
  auto c = join_ok(rv, "job2");
  CHECK(ids(c->scan()) == std::vector<std::string>{c->self().id});
  CHECK(c->secret() != a->secret());
  CHECK(a->scan().size() == 2);

  // leave() takes a member out of the others' scans and removes its file.
  const std::string b_file = rv + "/job1/members/" + b->self().id + ".json";
  CHECK(fs::exists(b_file));
  b->leave();
  CHECK_FALSE(fs::exists(b_file));
  CHECK(ids(a->scan()) == std::vector<std::string>{a->self().id});
  b->leave();  // twice is harmless
  CHECK(b->heartbeat().ok());
  CHECK_FALSE(fs::exists(b_file));  // a member that left stays gone

  // The destructor leaves too.
  const std::string a_file = rv + "/job1/members/" + a->self().id + ".json";
  CHECK(fs::exists(a_file));
  a.reset();
  CHECK_FALSE(fs::exists(a_file));
}

TEST_CASE("peer membership: a member file with a dead pid on this host is dropped and removed", "[peers]") {
  testing::TempDir tmp("cairn-members");
  auto a = join_ok(tmp.path, "job");
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);

  const std::string members = a->directory() + "/members/";
  write_file(members + "m00000000000000aa.json", member_json("m00000000000000aa", hostname(), child));
  // The same file with a live pid (ours) is kept: the check is the pid, not the file.
  write_file(members + "m00000000000000bb.json", member_json("m00000000000000bb", hostname(), ::getpid()));
  auto s = a->scan();
  CHECK_FALSE(contains(s, "m00000000000000aa"));
  CHECK(contains(s, "m00000000000000bb"));
  CHECK(s.size() == 2);
  CHECK_FALSE(fs::exists(members + "m00000000000000aa.json"));
  CHECK(fs::exists(members + "m00000000000000bb.json"));
}

TEST_CASE("peer membership: a stale heartbeat from another host is dropped and removed", "[peers]") {
  testing::TempDir tmp("cairn-members");
  auto a = join_ok(tmp.path, "job", "addr", 1s);
  const std::string members = a->directory() + "/members/";
  const std::string stale = members + "m00000000000000cc.json";
  const std::string fresh = members + "m00000000000000dd.json";
  // pid 1 is alive here, but on another host the pid means nothing: only the heartbeat counts.
  write_file(stale, member_json("m00000000000000cc", "elsewhere", 1));
  write_file(fresh, member_json("m00000000000000dd", "elsewhere", 999999999));
  set_mtime_ago(stale, 1h);
  auto s = a->scan();
  // Sorted by id: "m00..." comes before any random id but m000000000000000[0-d].
  std::vector<std::string> expected{a->self().id, "m00000000000000dd"};
  std::sort(expected.begin(), expected.end());
  CHECK(ids(s) == expected);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));
  REQUIRE(s.size() == 2);
  const MemberInfo& other = s[0].id == a->self().id ? s[1] : s[0];
  CHECK(other.id == "m00000000000000dd");
  CHECK(other.host == "elsewhere");
  CHECK(other.pid == 999999999);
  CHECK(other.address == "hi");
  CHECK(other.started == 1700000000);

  // A heartbeat far in the future (a clock running ahead by more than the timeout) is not fresh.
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec += 3600;
  times[1] = times[0];
  REQUIRE(::utimensat(AT_FDCWD, fresh.c_str(), times, 0) == 0);
  CHECK(ids(a->scan()) == std::vector<std::string>{a->self().id});
  CHECK_FALSE(fs::exists(fresh));
}

TEST_CASE("peer membership: heartbeat touches the file and rewrites it when removed", "[peers]") {
  testing::TempDir tmp("cairn-members");
  auto a = join_ok(tmp.path, "job", "addr", 1s);
  auto b = join_ok(tmp.path, "job", "addr", 1s);
  const std::string a_file = a->directory() + "/members/" + a->self().id + ".json";

  // An old heartbeat makes a look dead to b (and b removes its file) ...
  set_mtime_ago(a_file, 1h);
  CHECK(ids(b->scan()) == std::vector<std::string>{b->self().id});
  CHECK_FALSE(fs::exists(a_file));
  // ... while a still sees itself, and its next heartbeat brings the file back.
  CHECK(contains(a->scan(), a->self().id));
  REQUIRE(a->heartbeat().ok());
  REQUIRE(fs::exists(a_file));
  CHECK(b->scan().size() == 2);

  // A heartbeat refreshes the mtime.
  set_mtime_ago(a_file, 1h);
  REQUIRE(a->heartbeat().ok());
  CHECK(b->scan().size() == 2);
  CHECK(fs::exists(a_file));
}

TEST_CASE("peer membership: the secret must be the user's own 0600 file of 32 bytes", "[peers]") {
  testing::TempDir tmp("cairn-members");
  const std::string dir = tmp.path + "/job";
  const std::string secret = dir + "/secret";
  { auto a = join_ok(tmp.path, "job"); }

  SECTION("mode 0644 is refused, naming the mode") {
    REQUIRE(::chmod(secret.c_str(), 0644) == 0);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("0644") && Catch::Contains("0600") && Catch::Contains(secret));
  }
  SECTION("a secret of the wrong length is refused") {
    write_file(secret, std::string(16, 'x'), 0600);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("16 bytes") && Catch::Contains("32"));
  }
  SECTION("a symbolic link is refused") {
    write_file(tmp.path + "/elsewhere", std::string(32, 'x'), 0600);
    REQUIRE(::unlink(secret.c_str()) == 0);
    REQUIRE(::symlink((tmp.path + "/elsewhere").c_str(), secret.c_str()) == 0);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("symbolic link"));
  }
  SECTION("a directory in its place is refused") {
    REQUIRE(::unlink(secret.c_str()) == 0);
    REQUIRE(::mkdir(secret.c_str(), 0700) == 0);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("regular file"));
  }
  SECTION("an existing good secret is read, not replaced") {
    const std::string bytes(32, 'k');
    write_file(secret, bytes, 0600);
    auto m = join_ok(tmp.path, "job");
    CHECK(m->secret() == bytes);
  }
}

TEST_CASE("peer membership: another user's directory or secret is refused", "[peers]") {
  if (::getuid() != 0) {
    WARN("not root: cannot give files to another user, so this case checks nothing");
    return;
  }
  testing::TempDir tmp("cairn-members");
  { auto a = join_ok(tmp.path, "job"); }
  const std::string dir = tmp.path + "/job";
  SECTION("the job directory") {
    REQUIRE(::chown(dir.c_str(), 12345, 12345) == 0);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("belongs to uid 12345") && Catch::Contains(dir) &&
                                         Catch::Contains("another user's job cannot be joined"));
  }
  SECTION("the secret") {
    REQUIRE(::chown((dir + "/secret").c_str(), 12345, 12345) == 0);
    auto m = Membership::join(tmp.path, "job", "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermission);
    CHECK_THAT(m.status().message(), Catch::Contains("uid 12345") && Catch::Contains("secret"));
  }
}

TEST_CASE("peer membership: bad job ids are rejected", "[peers]") {
  testing::TempDir tmp("cairn-members");
  for (const std::string& job : {std::string(""), std::string("a/b"), std::string(".."), std::string("."),
                                 std::string("/abs"), std::string("a\0b", 3), std::string(201, 'j')}) {
    INFO("job '" << job << "'");
    auto m = Membership::join(tmp.path, job, "addr", 10s);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(m.status().message(), Catch::Contains("peers.job"));
  }
  // Nothing was created for them.
  CHECK(fs::is_empty(tmp.path));
  // The longest allowed id, and ids with dots inside, are fine.
  join_ok(tmp.path, std::string(200, 'j'));
  join_ok(tmp.path, "..job.1");
  auto bad_timeout = Membership::join(tmp.path, "job", "addr", 0ms);
  CHECK(bad_timeout.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("peer membership: garbage in members/ is skipped, and removed once old", "[peers]") {
  testing::TempDir tmp("cairn-members");
  auto a = join_ok(tmp.path, "job", "addr", 1s);
  const std::string members = a->directory() + "/members/";
  write_file(members + "mjunk.json", "this is not json");
  write_file(members + "m00000000000000ee.json", R"({"id":"m00000000000000ee","host":"elsewhere"})");
  // Valid JSON whose id does not match its file name.
  write_file(members + "m00000000000000ff.json", member_json("m0000000000000011", "elsewhere", 5));
  write_file(members + "README", "not a member file at all");
  write_file(members + ".m00000000000000ab.tmp", "half written");

  CHECK(ids(a->scan()) == std::vector<std::string>{a->self().id});
  CHECK(fs::exists(members + "mjunk.json"));  // young: perhaps someone's write in progress
  CHECK(fs::exists(members + "m00000000000000ee.json"));
  CHECK(fs::exists(members + ".m00000000000000ab.tmp"));

  for (const char* name :
       {"mjunk.json", "m00000000000000ee.json", "m00000000000000ff.json", ".m00000000000000ab.tmp"}) {
    set_mtime_ago(members + name, 1h);
  }
  set_mtime_ago(members + "README", 1h);
  CHECK(ids(a->scan()) == std::vector<std::string>{a->self().id});
  CHECK_FALSE(fs::exists(members + "mjunk.json"));
  CHECK_FALSE(fs::exists(members + "m00000000000000ee.json"));
  CHECK_FALSE(fs::exists(members + "m00000000000000ff.json"));
  CHECK_FALSE(fs::exists(members + ".m00000000000000ab.tmp"));
  CHECK(fs::exists(members + "README"));  // not ours to remove
  CHECK(fs::exists(members + a->self().id + ".json"));
}

TEST_CASE("peer membership: concurrent first joins agree on one secret", "[peers]") {
  testing::TempDir tmp("cairn-members");
  const std::string rv = tmp.path + "/rv";
  SECTION("threads") {
    constexpr int kThreads = 8;
    std::vector<std::unique_ptr<Membership>> ms(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        auto m = Membership::join(rv, "race", "addr" + std::to_string(i), 10s);
        if (m.ok()) {
          ms[i] = std::move(m).value();
        } else {
          errors[i] = m.status().to_string();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) {
      INFO(errors[i]);
      REQUIRE(ms[i] != nullptr);
      CHECK(ms[i]->secret() == ms[0]->secret());
    }
    CHECK(ms[0]->scan().size() == kThreads);
    // No temporary secret is left behind.
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(rv + "/race")) names.insert(e.path().filename().string());
    CHECK(names == std::set<std::string>{"members", "secret"});
  }
  SECTION("processes") {
    constexpr int kProcs = 8;
    std::vector<pid_t> pids;
    for (int i = 0; i < kProcs; ++i) {
      pid_t p = ::fork();
      REQUIRE(p >= 0);
      if (p == 0) {
        auto m = Membership::join(rv, "race", "addr", 10s);
        if (!m.ok()) ::_exit(2);
        std::ofstream(tmp.path + "/secret." + std::to_string(i)) << (*m)->secret();
        ::_exit(0);
      }
      pids.push_back(p);
    }
    for (pid_t p : pids) {
      const int status = testing::wait_child(p);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    std::ifstream in(rv + "/race/secret", std::ios::binary);
    std::string expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(expected.size() == 32);
    for (int i = 0; i < kProcs; ++i) {
      std::ifstream f(tmp.path + "/secret." + std::to_string(i), std::ios::binary);
      std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      CHECK(got == expected);
    }
    // The children exited without leaving (_exit): their files stay, their pids are dead.
    auto m = join_ok(rv, "race");
    CHECK(ids(m->scan()) == std::vector<std::string>{m->self().id});
    size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(rv + "/race/members")) ++files;
    CHECK(files == 1);
  }
}
