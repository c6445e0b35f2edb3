// Fabric (tiers/peer/fabric.hpp): two endpoints in one process on 127.0.0.1 and 127.0.0.2 over
// tcp;ofi_rxm (and shm): control messages, bodies into registered and unregistered memory, tags,
// cancel, a vanished peer, and the errors open and send_control give.
#ifdef CAIRN_HAVE_LIBFABRIC

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tiers/peer/fabric.hpp"

namespace cairn {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

constexpr auto kWait = 10s;  // how long any one thing may take before the test fails

Bytes random_bytes(size_t n, uint64_t seed) {
  Bytes b(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<uint8_t>(rng());
  return b;
}

// Collects what arrives and lets the test wait for a condition on it.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Bytes> messages;

  Fabric::ControlHandler handler() {
    return [this](std::span<const uint8_t> m) {
      std::lock_guard l(mu);
      messages.emplace_back(m.begin(), m.end());
      cv.notify_all();
    };
  }
  bool wait_count(size_t n, std::chrono::milliseconds t = kWait) {
    std::unique_lock l(mu);
    return cv.wait_for(l, t, [&] { return messages.size() >= n; });
  }
  std::vector<Bytes> take() {
    std::lock_guard l(mu);
    return messages;
  }
};

// One operation's completion(s): how many times done ran, and with what.
struct Done {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Status status;
  size_t bytes = 0;

  Fabric::Completion fn() {
    return [this](const Status& st, size_t n) {
      std::lock_guard l(mu);
      ++calls;
      status = st;
      bytes = n;
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds t = kWait) {
    std::unique_lock l(mu);
    return cv.wait_for(l, t, [&] { return calls > 0; });
  }
  int count() {
    std::lock_guard l(mu);
    return calls;
  }
};

std::unique_ptr<Fabric> open_fabric(const FabricOptions& o) {
  auto f = Fabric::open(o);
  INFO(f.status().to_string());
  REQUIRE(f.ok());
  return std::move(f).value();
}

std::unique_ptr<Fabric> open_fabric(const std::string& address) {
  FabricOptions o;
  o.address = address;
  return open_fabric(o);
}

FabricOptions tcp_options(bool descriptors_always = false) {
  FabricOptions o;
  o.provider = "tcp;ofi_rxm";
  o.descriptors_always = descriptors_always;
  return o;
}

// Two fabrics that know each other; inboxes set before anything is sent.
struct Pair {
  Inbox inbox_a, inbox_b;
  std::unique_ptr<Fabric> a, b;
  uint64_t a_to_b = 0, b_to_a = 0;

  explicit Pair(FabricOptions o = tcp_options(), const std::string& addr_a = "127.0.0.1",
                const std::string& addr_b = "127.0.0.2") {
    o.address = addr_a;
    a = open_fabric(o);
    o.address = addr_b;
    b = open_fabric(o);
    a->set_control_handler(inbox_a.handler());
    b->set_control_handler(inbox_b.handler());
    auto pb = a->add_peer(b->address());
    REQUIRE(pb.ok());
    a_to_b = *pb;
    auto pa = b->add_peer(a->address());
    REQUIRE(pa.ok());
    b_to_a = *pa;
  }
};

Bytes message_for(int i) {
  std::string s = "message " + std::to_string(i) + std::string(static_cast<size_t>(i % 97), 'x');
  return Bytes(s.begin(), s.end());
}

std::multiset<Bytes> as_set(const std::vector<Bytes>& v) { return {v.begin(), v.end()}; }

TEST_CASE("fabric: opens bound to the address and names it", "[fabric]") {
  auto f = open_fabric("127.0.0.2");
  CHECK(f->provider() == "tcp;ofi_rxm");
  CHECK_FALSE(f->address().empty());
  INFO(f->address_text());
  CHECK(f->address_text().find("127.0.0.2") != std::string::npos);
  CHECK(f->address_text().find(":0") == std::string::npos);  // a real port, not the wildcard

  auto by_iface = open_fabric("lo");  // an interface name: its address
  INFO(by_iface->address_text());
  CHECK(by_iface->address_text().find("127.0.0.1") != std::string::npos);

  nlohmann::json s = f->stats();
  for (const char* k :
       {"control_sent", "control_received", "body_sent", "body_received", "bytes_sent", "bytes_received", "errors"}) {
    INFO(k);
    CHECK(s.at(k).get<uint64_t>() == 0);
  }
}

TEST_CASE("fabric: control messages both ways, exact bytes", "[fabric]") {
  Pair p;
  constexpr int kCount = 200;
  std::vector<Bytes> sent_ab, sent_ba;
  std::atomic<int> done_ok{0};
  for (int i = 0; i < kCount; ++i) {
    sent_ab.push_back(message_for(i));
    sent_ba.push_back(message_for(1000 + i));
  }
  sent_ab.push_back(random_bytes(Fabric::kMaxControlBytes, 7));  // the largest there may be
  auto count_ok = [&](const Status& st, size_t) {
    if (st.ok()) ++done_ok;
  };
  for (const Bytes& m : sent_ab) REQUIRE(p.a->send_control(p.a_to_b, m, count_ok).ok());
  for (const Bytes& m : sent_ba) REQUIRE(p.b->send_control(p.b_to_a, m, count_ok).ok());
  REQUIRE(p.inbox_b.wait_count(sent_ab.size()));
  REQUIRE(p.inbox_a.wait_count(sent_ba.size()));
  // FI_ORDER_SAS (tcp;ofi_rxm has it): one sender's messages arrive in the order sent.
  CHECK(p.inbox_b.take() == sent_ab);
  CHECK(p.inbox_a.take() == sent_ba);
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (done_ok.load() < 2 * kCount + 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  CHECK(done_ok.load() == 2 * kCount + 1);

  nlohmann::json sa = p.a->stats(), sb = p.b->stats();
  CHECK(sa["control_sent"] == kCount + 1);
  CHECK(sa["control_received"] == kCount);
  CHECK(sb["control_received"] == kCount + 1);
  CHECK(sb["bytes_received"].get<uint64_t>() > Fabric::kMaxControlBytes);
  CHECK(sa["errors"] == 0);
  CHECK(sb["errors"] == 0);
}

TEST_CASE("fabric: concurrent control senders", "[fabric]") {
  Pair p;
  constexpr int kPerThread = 300;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        if (!p.a->send_control(p.a_to_b, message_for(t * 10000 + i)).ok()) ++failures;
    });
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  REQUIRE(p.inbox_b.wait_count(2 * kPerThread));
  std::multiset<Bytes> want;
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < kPerThread; ++i) want.insert(message_for(t * 10000 + i));
  CHECK(as_set(p.inbox_b.take()) == want);
}

TEST_CASE("fabric: a handler may reply from the progress thread", "[fabric]") {
  Pair p;
  // b echoes every message back; a counts the echoes.
  p.b->set_control_handler([&](std::span<const uint8_t> m) {
    Status st = p.b->send_control(p.b_to_a, m);
    CHECK(st.ok());
  });
  constexpr int kCount = 100;
  for (int i = 0; i < kCount; ++i) REQUIRE(p.a->send_control(p.a_to_b, message_for(i)).ok());
  REQUIRE(p.inbox_a.wait_count(kCount));
  CHECK(p.inbox_a.take().size() == kCount);
}

TEST_CASE("fabric: oversize control message is rejected", "[fabric]") {
  Pair p;
  Bytes big(Fabric::kMaxControlBytes + 1, 1);
  Status st = p.a->send_control(p.a_to_b, big);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find(std::to_string(Fabric::kMaxControlBytes)) != std::string::npos);
  // Nothing was sent: the next message is the first to arrive.
  REQUIRE(p.a->send_control(p.a_to_b, message_for(1)).ok());
  REQUIRE(p.inbox_b.wait_count(1));
  std::this_thread::sleep_for(50ms);
  auto got = p.inbox_b.take();
  REQUIRE(got.size() == 1);
  CHECK(got[0] == message_for(1));
}

// A body of n bytes from a to b; registered: whether each side's memory lies in a region.
void send_one_body(Pair& p, size_t n, bool register_src, bool register_dst, uint64_t seed) {
  Bytes src = random_bytes(n, seed);
  Bytes dst(n + 4096, 0xee);  // room to spare: exactly n bytes must land, the rest untouched
  if (register_src) REQUIRE(p.a->register_region(src.data(), src.size()).ok());
  if (register_dst) REQUIRE(p.b->register_region(dst.data(), dst.size()).ok());
  uint64_t tag = Fabric::kBodyTagBit | seed;
  Done recv, send;
  REQUIRE(p.b->post_body_receive(tag, dst.data(), dst.size(), recv.fn()).ok());
  REQUIRE(p.a->send_body(p.a_to_b, tag, src.data(), src.size(), send.fn()).ok());
  REQUIRE(recv.wait());
  REQUIRE(send.wait());
  INFO(recv.status.to_string() + " / " + send.status.to_string());
  REQUIRE(recv.status.ok());
  REQUIRE(send.status.ok());
  CHECK(recv.bytes == n);
  CHECK(send.bytes == n);
  CHECK((n == 0 || std::memcmp(dst.data(), src.data(), n) == 0));  // an empty vector's data() may be null
  CHECK(std::all_of(dst.begin() + static_cast<ptrdiff_t>(n), dst.end(), [](uint8_t c) { return c == 0xee; }));
  std::this_thread::sleep_for(10ms);
  CHECK(recv.count() == 1);
  CHECK(send.count() == 1);
}

TEST_CASE("fabric: 16 MiB bodies into registered and unregistered memory", "[fabric]") {
  // descriptors_always: take the FI_MR_LOCAL path (descriptors, per-op registration) on tcp too.
  bool descriptors = GENERATE(false, true);
  INFO("descriptors_always " << descriptors);
  Pair p(tcp_options(descriptors));
  constexpr size_t k16M = 16u << 20;
  send_one_body(p, k16M, /*src*/ false, /*dst*/ true, 1);
  send_one_body(p, k16M, /*src*/ true, /*dst*/ false, 2);
  send_one_body(p, k16M, false, false, 3);
  send_one_body(p, 0, false, false, 4);
  send_one_body(p, 100, true, true, 5);  // small: eager, not rendezvous
  nlohmann::json sa = p.a->stats(), sb = p.b->stats();
  CHECK(sa["body_sent"] == 5);
  CHECK(sb["body_received"] == 5);
  CHECK(sb["bytes_received"] == 3 * k16M + 100);
  CHECK(sa["errors"] == 0);
  CHECK(sb["errors"] == 0);
}

TEST_CASE("fabric: a 64 MiB body", "[fabric]") {
  Pair p;
  send_one_body(p, 64u << 20, true, true, 64);
}

TEST_CASE("fabric: bodies with different tags in flight, posted in a shuffled order", "[fabric]") {
  bool descriptors = GENERATE(false, true);
  INFO("descriptors_always " << descriptors);
  Pair p(tcp_options(descriptors));
  constexpr int kBodies = 12;
  std::vector<Bytes> src, dst;
  std::vector<size_t> sizes;
  Bytes arena(8u << 20);  // b's registered region: the even bodies land in it
  REQUIRE(p.b->register_region(arena.data(), arena.size()).ok());
  size_t arena_used = 0;
  std::vector<uint8_t*> where;
  for (int i = 0; i < kBodies; ++i) {
    size_t n = (size_t{1} << (8 + i)) + static_cast<size_t>(i) * 13;  // 256 B .. 512 KiB, odd lengths
    sizes.push_back(n);
    src.push_back(random_bytes(n, 100 + static_cast<uint64_t>(i)));
    dst.emplace_back(n);
    if (i % 2 == 0) {
      where.push_back(arena.data() + arena_used);
      arena_used += (n + 63) & ~size_t{63};
    } else {
      where.push_back(dst.back().data());
    }
  }
  REQUIRE(arena_used <= arena.size());
  std::vector<int> order(kBodies);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(42);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::unique_ptr<Done>> recv(kBodies), send(kBodies);
  for (int i : order) {
    recv[static_cast<size_t>(i)] = std::make_unique<Done>();
    REQUIRE(p.b->post_body_receive(Fabric::kBodyTagBit | (500 + static_cast<uint64_t>(i)),
                                   where[static_cast<size_t>(i)], sizes[static_cast<size_t>(i)],
                                   recv[static_cast<size_t>(i)]->fn())
                .ok());
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) {
    auto k = static_cast<size_t>(i);
    send[k] = std::make_unique<Done>();
    REQUIRE(p.a->send_body(p.a_to_b, Fabric::kBodyTagBit | (500 + k), src[k].data(), sizes[k], send[k]->fn()).ok());
  }
  for (size_t k = 0; k < kBodies; ++k) {
    INFO("body " << k);
    REQUIRE(recv[k]->wait());
    REQUIRE(send[k]->wait());
    CHECK(recv[k]->status.ok());
    CHECK(recv[k]->bytes == sizes[k]);
    CHECK(std::memcmp(where[k], src[k].data(), sizes[k]) == 0);
  }
}

TEST_CASE("fabric: body tags are checked", "[fabric]") {
  Pair p;
  Bytes buf(64);
  Done d;
  CHECK(p.b->post_body_receive(7, buf.data(), buf.size(), d.fn()).code() == StatusCode::kInvalidArgument);
  CHECK(p.a->send_body(p.a_to_b, 7, buf.data(), buf.size(), d.fn()).code() == StatusCode::kInvalidArgument);
  uint64_t tag = Fabric::kBodyTagBit | 9;
  REQUIRE(p.b->post_body_receive(tag, buf.data(), buf.size(), d.fn()).ok());
  Done d2;
  CHECK(p.b->post_body_receive(tag, buf.data(), buf.size(), d2.fn()).code() == StatusCode::kInvalidArgument);
  p.b->cancel_body_receive(tag);
  REQUIRE(d.wait());
  CHECK(d2.count() == 0);
}

TEST_CASE("fabric: cancel of a posted receive calls done once, with an error", "[fabric]") {
  Pair p;
  Bytes buf(1 << 20);
  uint64_t tag = Fabric::kBodyTagBit | 77;
  Done d;
  REQUIRE(p.b->post_body_receive(tag, buf.data(), buf.size(), d.fn()).ok());
  std::this_thread::sleep_for(20ms);
  CHECK(d.count() == 0);
  p.b->cancel_body_receive(tag);
  REQUIRE(d.wait());
  CHECK_FALSE(d.status.ok());
  CHECK(d.status.message().find("cancel") != std::string::npos);
  p.b->cancel_body_receive(tag);  // nothing posted any more: nothing happens
  p.b->cancel_body_receive(Fabric::kBodyTagBit | 12345);
  std::this_thread::sleep_for(100ms);
  CHECK(d.count() == 1);

  // The tag is free again, and a body sent with it now lands in the new receive.
  Bytes src = random_bytes(buf.size(), 77);
  Done again, sent;
  REQUIRE(p.b->post_body_receive(tag, buf.data(), buf.size(), again.fn()).ok());
  REQUIRE(p.a->send_body(p.a_to_b, tag, src.data(), src.size(), sent.fn()).ok());
  REQUIRE(again.wait());
  CHECK(again.status.ok());
  CHECK(buf == src);
  CHECK(again.count() == 1);
}

// What the peer service's drain of late bodies rests on (peer_messages.cpp, drain_late_body): over
// rxm a body past the eager size completes its send only once the receiver matches it, so a body
// whose receive was cancelled holds the sender's memory; a later small receive with its tag takes
// it (truncated, an error on the receiving side) and the send completes.
TEST_CASE("fabric: a body nobody receives completes once a small receive takes it", "[fabric]") {
  Pair p;
  for (size_t n : {size_t(1) << 20, size_t(4) << 20}) {  // chunk bodies: rendezvous sends
    INFO("body of " << n << " bytes");
    Bytes src = random_bytes(n, n);
    const uint64_t tag = Fabric::kBodyTagBit | (5000 + n);
    Done sent;
    REQUIRE(p.a->send_body(p.a_to_b, tag, src.data(), src.size(), sent.fn()).ok());
    std::this_thread::sleep_for(300ms);
    CHECK(sent.count() == 0);  // still pending: no receive is posted
    Bytes scratch(16);
    Done drained;
    REQUIRE(p.b->post_body_receive(tag, scratch.data(), scratch.size(), drained.fn()).ok());
    REQUIRE(drained.wait());
    CHECK_FALSE(drained.status.ok());
    CHECK(drained.status.message().find("Truncation") != std::string::npos);
    REQUIRE(sent.wait());
    CHECK(sent.status.ok());
  }
}

TEST_CASE("fabric: closing with a receive posted completes it with an error, promptly", "[fabric]") {
  auto f = open_fabric("127.0.0.3");
  Bytes buf(4096);
  Done d;
  REQUIRE(f->post_body_receive(Fabric::kBodyTagBit | 1, buf.data(), buf.size(), d.fn()).ok());
  auto t0 = std::chrono::steady_clock::now();
  f.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK(d.count() == 1);
  CHECK_FALSE(d.status.ok());
}

TEST_CASE("fabric: a send to a peer whose fabric was destroyed fails, bounded", "[fabric]") {
  bool connected_before = GENERATE(true, false);
  INFO("connected before " << connected_before);
  FabricOptions o = tcp_options();
  o.busy_timeout_ms = 500;
  Pair p(o);
  if (connected_before) {
    REQUIRE(p.a->send_control(p.a_to_b, message_for(1)).ok());
    REQUIRE(p.inbox_b.wait_count(1));
  }
  p.b.reset();
  auto t0 = std::chrono::steady_clock::now();
  // A body (rendezvous): tcp;ofi_rxm 1.17 may never fail one whose peer vanished after its
  // request went out; it must end, once, when a closes at the latest.
  Bytes body(256 << 10, 3);
  Done body_done;
  Status bst = p.a->send_body(p.a_to_b, Fabric::kBodyTagBit | 5, body.data(), body.size(), body_done.fn());
  // Control messages: the post fails, or the completion reports the error (a few tries, since one
  // may go into a socket's buffer before the connection is seen closed).
  bool failed = false;
  for (int i = 0; i < 5 && !failed; ++i) {
    Done d;
    Status st = p.a->send_control(p.a_to_b, message_for(2), d.fn());
    if (!st.ok()) {
      INFO(st.to_string());
      CHECK(st.code() == StatusCode::kUnavailable);
      failed = true;
      break;
    }
    REQUIRE(d.wait(5s));  // within the busy timeout and some slack
    if (!d.status.ok()) {
      INFO(d.status.to_string());
      CHECK(d.status.code() == StatusCode::kUnavailable);
      CHECK(d.count() == 1);
      failed = true;
    }
  }
  CHECK(failed);
  CHECK(std::chrono::steady_clock::now() - t0 < kWait);
  CHECK(p.a->stats()["errors"].get<uint64_t>() > 0);
  // a closes promptly even so, and the body's done has run once.
  auto t1 = std::chrono::steady_clock::now();
  p.a.reset();
  CHECK(std::chrono::steady_clock::now() - t1 < 3s);
  if (bst.ok()) {
    CHECK(body_done.count() == 1);
    CHECK_FALSE(body_done.status.ok());
  }
}

TEST_CASE("fabric: closing completes queued sends to an unreachable peer", "[fabric]") {
  FabricOptions o = tcp_options();
  o.busy_timeout_ms = 60000;  // the close, not the timeout, must end them
  Pair p(o);
  p.b.reset();
  std::vector<std::unique_ptr<Done>> dones;
  for (int i = 0; i < 10; ++i) {
    dones.push_back(std::make_unique<Done>());
    REQUIRE(p.a->send_control(p.a_to_b, message_for(i), dones.back()->fn()).ok());
  }
  auto t0 = std::chrono::steady_clock::now();
  p.a.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  for (auto& d : dones) {
    CHECK(d->count() == 1);
    CHECK_FALSE(d->status.ok());
  }
}

TEST_CASE("fabric: remove_peer and add it again", "[fabric]") {
  Pair p;
  REQUIRE(p.a->send_control(p.a_to_b, message_for(1)).ok());
  REQUIRE(p.inbox_b.wait_count(1));
  p.a->remove_peer(p.a_to_b);
  auto again = p.a->add_peer(p.b->address());
  REQUIRE(again.ok());
  REQUIRE(p.a->send_control(*again, message_for(2)).ok());
  REQUIRE(p.inbox_b.wait_count(2));
  CHECK(p.a->add_peer("").status().code() == StatusCode::kInvalidArgument);
  CHECK(p.a->add_peer("abc").status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("fabric: open with an unknown provider names it", "[fabric]") {
  FabricOptions o;
  o.provider = "nonesuch";
  o.address = "127.0.0.1";
  auto f = Fabric::open(o);
  REQUIRE_FALSE(f.ok());
  INFO(f.status().to_string());
  CHECK(f.status().code() == StatusCode::kInvalidArgument);
  CHECK(f.status().message().find("'nonesuch'") != std::string::npos);
  CHECK(f.status().message().find("no such provider") != std::string::npos);
}

TEST_CASE("fabric: open on an address that is not this host's fails", "[fabric]") {
  FabricOptions o;
  o.address = "203.0.113.7";  // TEST-NET-3: never a local address
  auto f = Fabric::open(o);
  REQUIRE_FALSE(f.ok());
  INFO(f.status().to_string());
  CHECK(f.status().code() == StatusCode::kInvalidArgument);
  CHECK(f.status().message().find("203.0.113.7") != std::string::npos);
}

TEST_CASE("fabric: shm between two endpoints of one process", "[fabric]") {
  FabricOptions o;
  o.provider = "shm";
  Pair p(o, "", "");
  CHECK(p.a->provider() == "shm");
  CHECK(p.a->address() != p.b->address());
  REQUIRE(p.a->send_control(p.a_to_b, message_for(3)).ok());
  REQUIRE(p.inbox_b.wait_count(1));
  CHECK(p.inbox_b.take()[0] == message_for(3));
  send_one_body(p, 16u << 20, false, true, 9);
}

}  // namespace
}  // namespace cairn

#endif  // CAIRN_HAVE_LIBFABRIC
