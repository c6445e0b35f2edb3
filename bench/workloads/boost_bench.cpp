// Where Boost could replace cairn's own code, each side measured in the same run
// (docs/decisions/0009-boost-where-it-serves.md):
//
//   lru      the DRAM and burst-buffer tiers' LRU order: LruPolicy (policy/eviction.hpp: a
//            Boost.Intrusive list threaded through the hash index's nodes, one allocation per key)
//            against a std::list of keys beside a hash index of list iterators (two allocations per
//            key). Per operation: a touch of a resident key, or a miss that evicts the oldest key
//            and tracks a new one.
//   socket   one request and its reply on a Unix stream socket, one client waiting for each reply:
//            the daemon's way (a thread per connection in blocking read/write) against a
//            Boost.Asio server (one io_context thread, async_read/async_write).
//
// Both run `rounds` times, alternating, and the medians are printed with the ratio of Boost to the
// hand-written side.
//
// Usage: cairn_bench_boost [--quick] [--json FILE]
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"
#include "policy/eviction.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- lru ----

// The LRU order as a std::list of keys beside a hash index of list iterators: two allocations per
// key. LruPolicy (policy/eviction.hpp) keeps the order in a Boost.Intrusive list threaded through
// the index's nodes.
class ListLru {
 public:
  void track(const cairn::ChunkHash& key, uint64_t) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.push_front(key);
    index_.emplace(key, order_.begin());
  }
  void touch(const cairn::ChunkHash& key) {
    auto it = index_.find(key);
    if (it != index_.end()) order_.splice(order_.begin(), order_, it->second);
  }
  void remove(const cairn::ChunkHash& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    order_.erase(it->second);
    index_.erase(it);
  }
  std::optional<cairn::ChunkHash> oldest() const {
    if (order_.empty()) return std::nullopt;
    return order_.back();
  }

 private:
  std::list<cairn::ChunkHash> order_;
  std::unordered_map<cairn::ChunkHash, std::list<cairn::ChunkHash>::iterator, cairn::ChunkHashHasher> index_;
};

std::vector<cairn::ChunkHash> keys(size_t n, uint64_t seed) {
  std::vector<cairn::ChunkHash> out(n);
  std::mt19937_64 rng(seed);
  for (auto& k : out) {
    k.hi = rng();
    k.lo = rng();
  }
  return out;
}

// Operations: 90% touches of a resident key, 10% misses (evict the oldest, track a new key).
struct LruOps {
  std::vector<cairn::ChunkHash> resident, fresh;
  std::vector<uint32_t> pick;  // index into resident for touches; UINT32_MAX for a miss
};

LruOps make_ops(size_t resident, size_t ops) {
  LruOps o;
  o.resident = keys(resident, 1);
  o.fresh = keys(ops / 10 + 1, 2);
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any(0, static_cast<uint32_t>(resident - 1));
  std::uniform_int_distribution<int> pct(0, 99);
  o.pick.resize(ops);
  for (auto& p : o.pick) p = pct(rng) < 10 ? UINT32_MAX : any(rng);
  return o;
}

template <class Lru, class Oldest>
double run_lru(Lru& lru, const LruOps& o, Oldest oldest) {
  for (const auto& k : o.resident) lru.track(k, 0);
  size_t next_fresh = 0;
  auto t0 = Clock::now();
  for (uint32_t p : o.pick) {
    if (p != UINT32_MAX) {
      lru.touch(o.resident[p]);
    } else {
      if (auto v = oldest(lru)) lru.remove(*v);
      lru.track(o.fresh[next_fresh++], 0);
    }
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(o.pick.size());
}

// ---- socket ----

constexpr size_t kMsg = 256;  // a small request or reply (a metadata request's JSON is about this size)

int listen_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  ::unlink(path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 8) != 0) {
    std::perror("cairn_bench_boost: listen");
    std::exit(1);
  }
  return fd;
}

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("cairn_bench_boost: connect");
    std::exit(1);
  }
  return fd;
}

bool full_io(int fd, char* p, size_t n, bool out) {
  while (n) {
    ssize_t r = out ? ::write(fd, p, n) : ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Round trips a second from one client that waits for each reply.
double client_rate(const std::string& path, size_t n) {
  int fd = connect_unix(path);
  std::array<char, kMsg> buf{};
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    buf[0] = static_cast<char>(i);
    if (!full_io(fd, buf.data(), kMsg, true) || !full_io(fd, buf.data(), kMsg, false)) {
      std::fprintf(stderr, "cairn_bench_boost: the server hung up\n");
      std::exit(1);
    }
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  return static_cast<double>(n) / s;
}

// The daemon's way: accept, then a thread per connection in blocking reads and writes.
double threaded_server(const std::string& path, size_t n) {
  int lfd = listen_unix(path);
  std::thread server([lfd] {
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    std::thread conn([c] {
      std::array<char, kMsg> buf{};
      while (full_io(c, buf.data(), kMsg, false) && full_io(c, buf.data(), kMsg, true)) {
      }
      ::close(c);
    });
    conn.join();
  });
  double rate = client_rate(path, n);
  server.join();
  ::close(lfd);
  ::unlink(path.c_str());
  return rate;
}

// Boost.Asio: one io_context thread serves the connection with async reads and writes.
class AsioSession : public std::enable_shared_from_this<AsioSession> {
 public:
  explicit AsioSession(boost::asio::local::stream_protocol::socket s) : socket_(std::move(s)) {}
  void start() { read(); }

 private:
  void read() {
    auto self = shared_from_this();
    boost::asio::async_read(socket_, boost::asio::buffer(buf_), [self](boost::system::error_code ec, size_t) {
      if (!ec) self->write();
    });
  }
  void write() {
    auto self = shared_from_this();
    boost::asio::async_write(socket_, boost::asio::buffer(buf_), [self](boost::system::error_code ec, size_t) {
      if (!ec) self->read();
    });
  }
  boost::asio::local::stream_protocol::socket socket_;
  std::array<char, kMsg> buf_{};
};

double asio_server(const std::string& path, size_t n) {
  ::unlink(path.c_str());
  boost::asio::io_context io;
  boost::asio::local::stream_protocol::acceptor acceptor(io, boost::asio::local::stream_protocol::endpoint(path));
  acceptor.async_accept([](boost::system::error_code ec, boost::asio::local::stream_protocol::socket s) {
    if (!ec) std::make_shared<AsioSession>(std::move(s))->start();
  });
  std::thread server([&io] { io.run(); });
  double rate = client_rate(path, n);
  server.join();  // the session ends when the client hangs up, and run() returns with no work left
  ::unlink(path.c_str());
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cairn_bench_boost [--quick] [--json FILE]\n");
      return 2;
    }
  }
  const int rounds = quick ? 3 : 7;
  const size_t resident = quick ? 100'000 : 1'000'000, ops = quick ? 500'000 : 3'000'000;
  const size_t trips = quick ? 5'000 : 40'000;

  LruOps o = make_ops(resident, ops);
  std::vector<double> own_lru, boost_lru, own_sock, asio_sock;
  const std::string path = "/tmp/cairn-bench-boost-" + std::to_string(::getpid()) + ".sock";
  for (int r = 0; r < rounds; ++r) {
    {
      ListLru lru;
      own_lru.push_back(run_lru(lru, o, [](ListLru& l) { return l.oldest(); }));
    }
    {
      cairn::LruPolicy lru;
      boost_lru.push_back(
          run_lru(lru, o, [](cairn::LruPolicy& l) { return l.pick_victim([](const auto&) { return true; }); }));
    }
    own_sock.push_back(threaded_server(path, trips));
    asio_sock.push_back(asio_server(path, trips));
  }
  const double ol = median(own_lru), bl = median(boost_lru), os = median(own_sock), as = median(asio_sock);
  std::printf("Boost against cairn's own code (%d rounds, medians):\n", rounds);
  std::printf("  LRU, %zu resident keys, 90%% touches / 10%% evict+track:\n", resident);
  std::printf("    std::list + index                %8.1f ns/op\n", ol);
  std::printf("    Boost.Intrusive (LruPolicy)      %8.1f ns/op   (%.2fx the time)\n", bl, bl / ol);
  std::printf("  Unix socket, %zu-byte request and reply, one waiting client:\n", kMsg);
  std::printf("    thread per connection (cairnd)   %8.0f /s\n", os);
  std::printf("    Boost.Asio (one io_context)      %8.0f /s   (%.2fx the rate)\n", as, as / os);
  if (!json_out.empty()) {
    nlohmann::json j = {{"rounds", rounds},
                        {"lru", {{"resident", resident}, {"own_ns_per_op", ol}, {"boost_ns_per_op", bl}}},
                        {"socket", {{"message_bytes", kMsg}, {"own_per_s", os}, {"asio_per_s", as}}}};
    std::ofstream(json_out) << j.dump(2) << "\n";
  }
  return 0;
}
