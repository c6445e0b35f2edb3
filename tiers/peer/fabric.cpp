// Fabric: the transport between the daemons of a job over one libfabric FI_EP_RDM endpoint
// (tiers/peer/fabric.hpp says what it offers).
//
// open() picks the provider by name, binds the endpoint to the configured address (FI_SOURCE: an IP
// address, or an interface name resolved to its address here), opens an FI_AV_TABLE address vector
// and one tagged completion queue, posts a ring of control receive buffers and starts the progress
// thread. Every operation carries an Op whose first bytes are the fi_context2 libfabric hands back
// in its completion; the progress thread reads the queue (fi_cq_sread when the provider gives it a
// wait fd, else fi_cq_read with a backoff sleep), runs the op's callback and frees it.
// A post the provider refuses for now (FI_EAGAIN: rxm still connecting, a full queue) is queued and
// retried by the progress thread, oldest first per peer, until FabricOptions::busy_timeout_ms; so no
// caller (a callback on the progress thread included) ever blocks in a post.
//
// Memory: when the provider's mr_mode has FI_MR_LOCAL (or options.descriptors_always), every
// operation passes a descriptor: the region's, for buffers inside a register_region region; the
// Fabric's own, for control buffers (registered once); otherwise the buffer is registered for that
// one operation and deregistered when it completes. FI_MR_ENDPOINT regions are bound to the
// endpoint and enabled; keys are the provider's (FI_MR_PROV_KEY) or a counter. No RMA is done
// here, so FI_MR_VIRT_ADDR changes nothing.
//
// Locking: mu guards the table of ops in flight (so that cancel never races the op's free) and the
// body receives by tag; queue_mu the ops waiting to be posted (taken before mu). The provider is
// opened FI_THREAD_SAFE, so posts need no lock of ours. No lock is held while a callback runs.
#include "tiers/peer/fabric.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/log.hpp"

namespace cairn {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFiVersion = FI_VERSION(1, 17);
constexpr size_t kControlRing = 64;       // control receives kept posted
constexpr size_t kControlSlotsKept = 64;  // registered control send buffers kept for reuse
constexpr int kWaitTimeoutMs = 100;       // fi_cq_sread's timeout: how soon stop is noticed
constexpr auto kMaxPollSleep = std::chrono::microseconds(1000);
constexpr auto kCloseWait = std::chrono::seconds(2);  // the destructor's wait for ops in flight
constexpr size_t kCqBatch = 32;

std::string fi_error_text(ssize_t ret) {
  int e = static_cast<int>(ret < 0 ? -ret : ret);
  return std::string(fi_strerror(e)) + " (" + std::to_string(e) + ")";
}

// "eth0" -> its IPv4 address (else its IPv6 one); an IP address or anything else unchanged (a host
// name: fi_getinfo resolves it, or says it cannot).
std::string resolve_node(const std::string& address) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, address.c_str(), &a4) == 1 || inet_pton(AF_INET6, address.c_str(), &a6) == 1) return address;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return address;
  std::string v4, v6;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_name || address != i->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      v4 = buf;
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf, sizeof buf);
      v6 = buf;
    }
  }
  freeifaddrs(ifs);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return address;
}

enum class OpKind : uint8_t { kControlRecv, kControlSend, kBodyRecv, kBodySend };

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kControlRecv:
      return "control receive";
    case OpKind::kControlSend:
      return "control send";
    case OpKind::kBodyRecv:
      return "body receive";
    case OpKind::kBodySend:
      return "body send";
  }
  return "operation";
}

struct Op;

// What libfabric gets as the operation's context: standard layout, so the pointer it hands back is
// the pointer to this struct (the fi_context2 is provider scratch space for FI_CONTEXT2 providers).
struct OpContext {
  fi_context2 ctx;
  Op* op;
};

// A registered control send buffer (kMaxControlBytes), reused while the pool has room.
struct ControlSlot {
  std::unique_ptr<uint8_t[]> buf;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
};

struct Op {
  OpContext c{};
  OpKind kind = OpKind::kBodySend;
  uint64_t tag = 0;
  uint64_t peer = FI_ADDR_UNSPEC;  // sends: the destination
  void* data = nullptr;            // what is sent / received into
  size_t length = 0;
  void* desc = nullptr;
  Fabric::Completion done;
  fid_mr* temp_mr = nullptr;          // registered for this op only
  std::vector<uint8_t> owned;         // control send without descriptors: the copy
  std::unique_ptr<ControlSlot> slot;  // control send with descriptors
  bool cancel_requested = false;      // body receive: cancel_body_receive was called (under mu)
  Clock::time_point give_up;          // queued after FI_EAGAIN: when it fails

  Op() { c.op = this; }
};

// One completion, read from the queue (or made up at close).
struct Event {
  Op* op = nullptr;
  int err = 0;  // 0, or a positive FI_E* code
  std::string text;
  size_t len = 0;
};

struct Region {
  uintptr_t base = 0;
  size_t length = 0;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
};

}  // namespace

struct Fabric::Impl {
  FabricOptions options;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  bool cq_waitable = false;  // opened with a wait object: the progress thread uses fi_cq_sread
  bool need_desc = false;    // FI_MR_LOCAL (or options.descriptors_always)
  bool mr_endpoint = false;  // FI_MR_ENDPOINT: regions are bound to the endpoint
  bool prov_key = false;     // FI_MR_PROV_KEY: the provider picks keys
  std::atomic<uint64_t> next_key{1};
  std::string name;  // fi_getname
  std::string prov_name;

  // Regions registered once, by base address.
  mutable std::shared_mutex regions_mu;
  std::map<uintptr_t, Region> regions;
  std::vector<fid_mr*> retired_mrs;  // replaced by a larger registration of the same base

  // The control receive ring: kControlRing buffers of kMaxControlBytes, one registration.
  std::unique_ptr<uint8_t[]> ring_mem;
  fid_mr* ring_mr = nullptr;
  void* ring_desc = nullptr;
  std::vector<std::unique_ptr<Op>> ring;

  std::mutex slots_mu;
  std::vector<std::unique_ptr<ControlSlot>> free_slots;

  std::mutex handler_mu;
  std::shared_ptr<const ControlHandler> handler;

  // Ops in flight (posted or queued; ring receives included) and the body receives by tag.
  std::mutex mu;
  std::condition_variable drained;
  std::unordered_set<Op*> in_flight;
  std::unordered_map<uint64_t, Op*> body_recvs;

  // Ops the provider did not take yet (FI_EAGAIN), oldest first; lock order: queue_mu, then mu.
  std::mutex queue_mu;
  std::list<Op*> queued;
  std::unordered_map<uint64_t, size_t> queued_per_peer;  // receives count under FI_ADDR_UNSPEC
  std::atomic<size_t> queued_count{0};

  std::thread progress;
  std::atomic<std::thread::id> progress_id{};
  std::atomic<bool> stop{false};
  std::atomic<bool> closing{false};
  std::atomic<bool> sleeping{false};  // the progress thread is (about to be) waiting
  std::mutex poll_mu;                 // polling mode: the progress thread's sleep, cut short by wake
  std::condition_variable poll_cv;
  bool kicked = false;

  std::atomic<uint64_t> control_sent{0}, control_received{0}, body_sent{0}, body_received{0};
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0}, errors{0};

  ~Impl() { shutdown(); }

  std::string where() const {
    return "fabric " + prov_name + (options.address.empty() ? "" : " on " + options.address);
  }

  // ---- memory registration ----

  Status reg_mr(const void* base, size_t length, uint64_t access, fid_mr** mr, void** desc) {
    uint64_t key = prov_key ? 0 : next_key.fetch_add(1);
    int ret = fi_mr_reg(domain, base, length, access, 0, key, 0, mr, nullptr);
    if (ret) return unavailable(where() + ": fi_mr_reg of " + std::to_string(length) + " bytes: " + fi_error_text(ret));
    if (mr_endpoint) {
      ret = fi_mr_bind(*mr, &ep->fid, 0);
      if (!ret) ret = fi_mr_enable(*mr);
      if (ret) {
        fi_close(&(*mr)->fid);
        *mr = nullptr;
        return unavailable(where() + ": binding a memory region to the endpoint: " + fi_error_text(ret));
      }
    }
    *desc = fi_mr_desc(*mr);
    return Status::ok();
  }

  static void close_mr(fid_mr*& mr) {
    if (!mr) return;
    int ret = fi_close(&mr->fid);
    if (ret) CAIRN_LOG_WARN("fabric: closing a memory region: {}", fi_error_text(ret));
    mr = nullptr;
  }

  // Sets op->desc for [op->data, + op->length): a region's, or one registered for this op only.
  Status describe(Op* op, uint64_t access) {
    op->desc = nullptr;
    if (!need_desc || op->length == 0) return Status::ok();
    auto a = reinterpret_cast<uintptr_t>(op->data);
    {
      std::shared_lock l(regions_mu);
      auto it = regions.upper_bound(a);
      if (it != regions.begin()) {
        --it;
        const Region& r = it->second;
        if (a >= r.base && a + op->length <= r.base + r.length) {
          op->desc = r.desc;
          return Status::ok();
        }
      }
    }
    return reg_mr(op->data, op->length, access, &op->temp_mr, &op->desc);
  }

  // ---- posting ----

  bool on_progress_thread() const { return std::this_thread::get_id() == progress_id.load(); }

  // Wakes the progress thread if it waits, so that it drives the provider's progress now.
  void wake() {
    if (!sleeping.load() || on_progress_thread()) return;
    if (cq_waitable) {
      fi_cq_signal(cq);
    } else {
      std::lock_guard l(poll_mu);
      kicked = true;
      poll_cv.notify_one();
    }
  }

  ssize_t try_post(Op* op) {
    switch (op->kind) {
      case OpKind::kControlRecv:
      case OpKind::kBodyRecv:
        return fi_trecv(ep, op->data, op->length, op->desc, FI_ADDR_UNSPEC, op->tag, 0, &op->c);
      case OpKind::kControlSend:
      case OpKind::kBodySend:
        return fi_tsend(ep, op->data, op->length, op->desc, op->peer, op->tag, &op->c);
    }
    return -FI_EINVAL;
  }

  // Hands op to the provider, or queues it (FI_EAGAIN) for the progress thread to retry. OK: done
  // will run. Otherwise the op is untracked and the caller's to free.
  Status submit(Op* op) {
    {
      std::lock_guard l(mu);
      if (closing.load()) return unavailable(where() + ": the fabric is closing");
      if (op->kind == OpKind::kBodyRecv) {
        if (!body_recvs.emplace(op->tag, op).second)
          return invalid_argument(where() + ": a body receive with tag " +
                                  std::to_string(op->tag & ~Fabric::kBodyTagBit) + " is already posted");
      }
      in_flight.insert(op);
    }
    // Behind what is queued for the same peer (keeps each peer's order).
    if (queued_count.load() > 0) {
      std::lock_guard l(queue_mu);
      if (queued_per_peer.count(op->peer)) {
        enqueue(op);
        wake();
        return Status::ok();
      }
    }
    ssize_t ret = try_post(op);
    if (ret == 0) {
      wake();
      return Status::ok();
    }
    if (ret == -FI_EAGAIN) {
      std::lock_guard l(queue_mu);
      enqueue(op);
      wake();
      return Status::ok();
    }
    untrack(op);
    ++errors;
    return unavailable(where() + ": posting a " + op_name(op->kind) + ": " + fi_error_text(ret));
  }

  void enqueue(Op* op) {  // REQUIRES: queue_mu
    op->give_up = Clock::now() + std::chrono::milliseconds(options.busy_timeout_ms);
    queued.push_back(op);
    ++queued_per_peer[op->peer];
    ++queued_count;
  }

  void dequeue(std::list<Op*>::iterator it) {  // REQUIRES: queue_mu
    auto pp = queued_per_peer.find((*it)->peer);
    if (pp != queued_per_peer.end() && --pp->second == 0) queued_per_peer.erase(pp);
    queued.erase(it);
    --queued_count;
  }

  // The progress thread: posts what the provider would not take before, oldest first per peer;
  // fails what waited past its time, was cancelled, or met the fabric closing.
  void retry_queued() {
    std::vector<Event> failed;
    {
      std::lock_guard l(queue_mu);
      std::unordered_set<uint64_t> busy;  // peers whose oldest queued op still gets FI_EAGAIN
      auto now = Clock::now();
      for (auto it = queued.begin(); it != queued.end();) {
        Op* op = *it;
        bool cancelled;
        {
          std::lock_guard ml(mu);
          cancelled = op->cancel_requested;
        }
        Event ev;
        ev.op = op;
        if (closing.load()) {
          ev.err = FI_ECANCELED;
        } else if (cancelled) {
          ev.err = FI_ECANCELED;
        } else if (busy.count(op->peer)) {
          ++it;
          continue;
        } else {
          ssize_t ret = try_post(op);
          if (ret == 0) {
            auto next = std::next(it);
            dequeue(it);
            it = next;
            continue;
          }
          if (ret == -FI_EAGAIN && now < op->give_up) {
            busy.insert(op->peer);
            ++it;
            continue;
          }
          ev.err = static_cast<int>(-ret);
          ev.text = ret == -FI_EAGAIN ? "the provider did not take it for " + std::to_string(options.busy_timeout_ms) +
                                            " ms (peer unreachable?)"
                                      : fi_error_text(ret);
        }
        auto next = std::next(it);
        dequeue(it);
        it = next;
        failed.push_back(std::move(ev));
      }
    }
    for (const Event& ev : failed) complete(ev);  // without queue_mu: callbacks may post
  }

  void untrack(Op* op) {
    std::lock_guard l(mu);
    in_flight.erase(op);
    if (op->kind == OpKind::kBodyRecv) {
      auto it = body_recvs.find(op->tag);
      if (it != body_recvs.end() && it->second == op) body_recvs.erase(it);
    }
    if (in_flight.empty()) drained.notify_all();
  }

  // ---- completions ----

  // Reads what the queue holds (waiting up to wait_ms when the queue has a wait object) and
  // handles it. Returns whether anything was read.
  bool read_cq(int wait_ms) {
    fi_cq_tagged_entry entries[kCqBatch];
    ssize_t n = wait_ms > 0 && cq_waitable ? fi_cq_sread(cq, entries, kCqBatch, nullptr, wait_ms)
                                           : fi_cq_read(cq, entries, kCqBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        Event ev;
        ev.op = static_cast<OpContext*>(entries[i].op_context)->op;
        ev.len = entries[i].len;
        complete(ev);
      }
      return true;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) <= 0) return false;
      Event ev;
      ev.err = err.err ? err.err : FI_EOTHER;
      ev.len = err.len;
      ev.text = fi_strerror(ev.err);
      if (err.prov_errno) {
        char buf[256] = {};
        const char* p = fi_cq_strerror(cq, err.prov_errno, err.err_data, buf, sizeof buf);
        if (p && *p && ev.text != p) ev.text += std::string(" (") + p + ")";
      }
      if (err.err == FI_ETRUNC) ev.text += ": the message had " + std::to_string(err.olen) + " more bytes";
      if (!err.op_context) {
        ++errors;
        CAIRN_LOG_WARN("{}: an error without an operation: {}", where(), ev.text);
        return true;
      }
      ev.op = static_cast<OpContext*>(err.op_context)->op;
      complete(ev);
      return true;
    }
    if (n != -FI_EAGAIN && n < 0 && !stop.load()) {
      CAIRN_LOG_WARN("{}: reading the completion queue: {}", where(), fi_error_text(n));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  static void run(const Fabric::Completion& done, const Status& st, size_t len, const char* what) {
    if (!done) return;
    try {
      done(st, len);
    } catch (const std::exception& e) {
      CAIRN_LOG_ERROR("fabric: a {} callback threw: {}", what, e.what());
    } catch (...) {
      CAIRN_LOG_ERROR("fabric: a {} callback threw", what);
    }
  }

  void complete(const Event& ev) {
    Op* op = ev.op;
    untrack(op);
    close_mr(op->temp_mr);
    Status st;
    if (ev.err) {
      bool body = op->kind == OpKind::kBodyRecv || op->kind == OpKind::kBodySend;
      std::string what = where() + ": " + op_name(op->kind) +
                         (body ? " (tag " + std::to_string(op->tag & ~Fabric::kBodyTagBit) + ")" : std::string());
      if (ev.err == FI_ECANCELED)
        st = unavailable(what + (closing.load() ? " cancelled: the fabric is closing" : " cancelled"));
      else
        st = unavailable(what + " failed: " + ev.text);
      if (ev.err != FI_ECANCELED) ++errors;
    }
    switch (op->kind) {
      case OpKind::kControlRecv: {
        if (st.is_ok()) {
          ++control_received;
          bytes_received += ev.len;
          std::shared_ptr<const ControlHandler> h;
          {
            std::lock_guard l(handler_mu);
            h = handler;
          }
          if (h && *h) {
            try {
              (*h)(std::span<const uint8_t>(static_cast<const uint8_t*>(op->data), ev.len));
            } catch (const std::exception& e) {
              CAIRN_LOG_ERROR("{}: the control handler threw: {}", where(), e.what());
            } catch (...) {
              CAIRN_LOG_ERROR("{}: the control handler threw", where());
            }
          } else {
            CAIRN_LOG_WARN("{}: a control message of {} bytes arrived before a handler was set; dropped", where(),
                           ev.len);
          }
        } else if (ev.err != FI_ECANCELED) {
          CAIRN_LOG_WARN("{}", st.to_string());
        }
        if (ev.err == FI_ECANCELED || closing.load()) return;  // the ring stays down
        Status p = submit(op);
        if (!p.is_ok() && !closing.load())
          CAIRN_LOG_ERROR("{}: reposting a control receive: {}", where(), p.to_string());
        return;
      }
      case OpKind::kControlSend:
        if (st.is_ok()) {
          ++control_sent;
          bytes_sent += op->length;
        }
        run(op->done, st, st.is_ok() ? op->length : 0, "control send");
        if (op->slot) give_slot(std::move(op->slot));
        break;
      case OpKind::kBodyRecv:
        if (st.is_ok()) {
          ++body_received;
          bytes_received += ev.len;
        }
        run(op->done, st, st.is_ok() ? ev.len : 0, "body receive");
        break;
      case OpKind::kBodySend:
        if (st.is_ok()) {
          ++body_sent;
          bytes_sent += op->length;
        }
        run(op->done, st, st.is_ok() ? op->length : 0, "body send");
        break;
    }
    delete op;
  }

  void progress_loop() {
    progress_id.store(std::this_thread::get_id());
    auto pause = std::chrono::microseconds(0);
    while (!stop.load()) {
      if (queued_count.load() > 0) retry_queued();
      bool waiting_ops = queued_count.load() > 0;  // retry them soon, not after a long wait
      if (cq_waitable) {
        // Posters signal only while sleeping is set; a post made before this store is seen by
        // sread's first (non-blocking) read, which also drives the provider's progress.
        sleeping.store(true);
        read_cq(waiting_ops ? 1 : kWaitTimeoutMs);
        sleeping.store(false);
        continue;
      }
      if (read_cq(0)) {
        pause = std::chrono::microseconds(0);
        continue;
      }
      // Idle: sleep longer and longer (up to kMaxPollSleep), cut short by wake().
      pause = std::clamp<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(5), kMaxPollSleep);
      sleeping.store(true);
      {
        std::unique_lock l(poll_mu);
        poll_cv.wait_for(l, pause, [&] { return kicked || stop.load(); });
        kicked = false;
      }
      sleeping.store(false);
    }
  }

  // ---- control send buffers ----

  Result<std::unique_ptr<ControlSlot>> take_slot() {
    {
      std::lock_guard l(slots_mu);
      if (!free_slots.empty()) {
        auto s = std::move(free_slots.back());
        free_slots.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<ControlSlot>();
    s->buf.reset(new uint8_t[Fabric::kMaxControlBytes]);
    CAIRN_RETURN_IF_ERROR(reg_mr(s->buf.get(), Fabric::kMaxControlBytes, FI_SEND, &s->mr, &s->desc));
    return s;
  }

  void give_slot(std::unique_ptr<ControlSlot> s) {
    {
      std::lock_guard l(slots_mu);
      if (free_slots.size() < kControlSlotsKept) {
        free_slots.push_back(std::move(s));
        return;
      }
    }
    close_mr(s->mr);
  }

  // ---- close ----

  void shutdown() {
    closing.store(true);
    if (progress.joinable()) {
      if (on_progress_thread()) {
        // Destroyed from one of its own callbacks: it cannot wait for itself.
        CAIRN_LOG_ERROR("{}: destroyed from its own callback; the progress thread is left running", where());
        progress.detach();
        return;
      }
      // Cancel what is posted; the progress thread reports the cancelled completions and fails
      // what is queued. Sends may still finish; wait for them a little (bounded).
      {
        std::unique_lock l(mu);
        for (Op* op : in_flight) fi_cancel(&ep->fid, &op->c);
      }
      wake();
      {
        std::unique_lock l(mu);
        drained.wait_until(l, Clock::now() + kCloseWait, [&] { return in_flight.empty(); });
      }
      stop.store(true);
      sleeping.store(true);
      wake();
      progress.join();
    }
    // Closing the endpoint ends every operation still posted: the provider no longer touches
    // their buffers, so their callbacks can run now (with an error) and the ops be freed.
    if (ep) {
      int ret = fi_close(&ep->fid);
      if (ret == -FI_EBUSY) {
        close_regions();  // some providers refuse while memory regions are bound to the endpoint
        ret = fi_close(&ep->fid);
      }
      if (ret) CAIRN_LOG_WARN("{}: closing the endpoint: {}", where(), fi_error_text(ret));
      ep = nullptr;
    }
    std::vector<Op*> left;
    {
      std::lock_guard l(mu);
      left.assign(in_flight.begin(), in_flight.end());
      in_flight.clear();
      body_recvs.clear();
    }
    {
      std::lock_guard l(queue_mu);
      queued.clear();
      queued_per_peer.clear();
      queued_count.store(0);
    }
    for (Op* op : left) {
      close_mr(op->temp_mr);
      if (op->kind == OpKind::kControlRecv) continue;  // owned by ring
      run(op->done, unavailable(where() + ": closed before the " + op_name(op->kind) + " completed"), 0,
          op_name(op->kind));
      if (op->slot) close_mr(op->slot->mr);
      delete op;
    }
    close_fid(av ? &av->fid : nullptr, "the address vector");
    av = nullptr;
    close_fid(cq ? &cq->fid : nullptr, "the completion queue");
    cq = nullptr;
    close_regions();
    close_mr(ring_mr);
    {
      std::lock_guard l(slots_mu);
      for (auto& s : free_slots) close_mr(s->mr);
      free_slots.clear();
    }
    close_fid(domain ? &domain->fid : nullptr, "the domain");
    domain = nullptr;
    close_fid(fabric ? &fabric->fid : nullptr, "the fabric");
    fabric = nullptr;
    if (info) fi_freeinfo(info);
    info = nullptr;
  }

  void close_fid(fid* f, const char* what) {
    if (!f) return;
    int ret = fi_close(f);
    if (ret) CAIRN_LOG_WARN("{}: closing {}: {}", where(), what, fi_error_text(ret));
  }

  void close_regions() {
    std::unique_lock l(regions_mu);
    for (auto& [base, r] : regions) close_mr(r.mr);
    for (fid_mr*& mr : retired_mrs) close_mr(mr);
  }
};

// ---- open ----

namespace {

fi_info* make_hints(const FabricOptions& options, bool ordered) {
  fi_info* hints = fi_allocinfo();
  if (!hints) return nullptr;
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (ordered) {
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  }
  if (!options.provider.empty()) hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  return hints;
}

}  // namespace

Result<std::unique_ptr<Fabric>> Fabric::open(const FabricOptions& options) {
  auto im = std::make_unique<Impl>();
  im->options = options;
  im->prov_name = options.provider;
  const std::string what = "peers.provider '" + options.provider + "'";
  const std::string on_address =
      options.address.empty() ? std::string() : " on peers.address '" + options.address + "'";

  std::string node = options.address.empty() ? std::string() : resolve_node(options.address);
  int ret = -FI_ENODATA;
  for (bool ordered : {true, false}) {  // FI_ORDER_SAS where the provider has it
    fi_info* hints = make_hints(options, ordered);
    if (!hints) return internal_error("fabric: fi_allocinfo failed");
    ret = fi_getinfo(kFiVersion, node.empty() ? nullptr : node.c_str(), nullptr, node.empty() ? 0 : FI_SOURCE, hints,
                     &im->info);
    fi_freeinfo(hints);
    if (ret != -FI_ENODATA) break;
  }
  if (ret) {
    // Tell "no such provider" from "the provider cannot do this here".
    fi_info* any = nullptr;
    fi_info* phints = fi_allocinfo();
    if (phints && !options.provider.empty()) phints->fabric_attr->prov_name = strdup(options.provider.c_str());
    int pret = phints ? fi_getinfo(kFiVersion, nullptr, nullptr, 0, phints, &any) : -FI_ENOMEM;
    if (any) fi_freeinfo(any);
    if (phints) fi_freeinfo(phints);
    if (pret == -FI_ENODATA) return invalid_argument(what + ": libfabric has no such provider (fi_info -l lists them)");
    if (ret == -FI_ENODATA)
      return invalid_argument(what + " offers no tagged reliable-datagram endpoint (FI_EP_RDM, FI_TAGGED, " +
                              "FI_THREAD_SAFE)" + on_address + ": " + fi_error_text(ret));
    return unavailable(what + on_address + ": fi_getinfo: " + fi_error_text(ret));
  }
  fi_info* info = im->info;
  im->prov_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : options.provider;
  uint64_t mr_mode = static_cast<uint64_t>(info->domain_attr->mr_mode);
  im->need_desc = (mr_mode & FI_MR_LOCAL) || options.descriptors_always;
  im->mr_endpoint = mr_mode & FI_MR_ENDPOINT;
  im->prov_key = mr_mode & FI_MR_PROV_KEY;

  auto fail = [&](const char* step, int r) -> Status {
    return unavailable(im->where() + ": " + step + ": " + fi_error_text(r));
  };
  // Where the endpoint listens is opened with the endpoint (rxm) or when it is enabled.
  auto fail_bind = [&](const char* step, int r) -> Status {
    if (options.address.empty()) return fail(step, r);
    return invalid_argument(what + " cannot listen" + on_address + " (" + node + "): " + step + ": " +
                            fi_error_text(r));
  };
  if ((ret = fi_fabric(info->fabric_attr, &im->fabric, nullptr))) return fail("fi_fabric", ret);
  if ((ret = fi_domain(im->fabric, info, &im->domain, nullptr))) return fail("fi_domain", ret);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((ret = fi_av_open(im->domain, &av_attr, &im->av, nullptr))) return fail("fi_av_open", ret);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  // An fd the progress thread can sleep on (rxm: its sockets). Not FI_WAIT_UNSPEC: shm answers
  // that with a sched_yield loop that burns a core (and, in 1.17, misses messages).
  cq_attr.wait_obj = FI_WAIT_FD;
  ret = fi_cq_open(im->domain, &cq_attr, &im->cq, nullptr);
  im->cq_waitable = ret == 0 && cq_attr.wait_obj != FI_WAIT_NONE;
  if (ret) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((ret = fi_cq_open(im->domain, &cq_attr, &im->cq, nullptr))) return fail("fi_cq_open", ret);
  }

  if ((ret = fi_endpoint(im->domain, info, &im->ep, nullptr))) return fail_bind("fi_endpoint", ret);
  if ((ret = fi_ep_bind(im->ep, &im->av->fid, 0))) return fail("binding the address vector", ret);
  if ((ret = fi_ep_bind(im->ep, &im->cq->fid, FI_TRANSMIT | FI_RECV))) return fail("binding the completion queue", ret);
  if ((ret = fi_enable(im->ep))) return fail_bind("fi_enable", ret);

  size_t len = 0;
  char probe[1];
  ret = fi_getname(&im->ep->fid, probe, &len);
  if (ret != -FI_ETOOSMALL && ret != 0) return fail("fi_getname", ret);
  im->name.assign(len, '\0');
  if ((ret = fi_getname(&im->ep->fid, im->name.data(), &len))) return fail("fi_getname", ret);
  im->name.resize(len);

  // The control receive ring.
  im->ring_mem.reset(new uint8_t[kControlRing * kMaxControlBytes]);
  if (im->need_desc)
    CAIRN_RETURN_IF_ERROR(
        im->reg_mr(im->ring_mem.get(), kControlRing * kMaxControlBytes, FI_RECV, &im->ring_mr, &im->ring_desc));
  Impl* raw = im.get();
  raw->progress = std::thread([raw] { raw->progress_loop(); });
  for (size_t i = 0; i < kControlRing; ++i) {
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kControlRecv;
    op->tag = kControlTag;
    op->data = raw->ring_mem.get() + i * kMaxControlBytes;
    op->length = kMaxControlBytes;
    op->desc = raw->ring_desc;
    Status st = raw->submit(op.get());
    raw->ring.push_back(std::move(op));
    if (!st.is_ok()) return st;
  }
  std::unique_ptr<Fabric> f(new Fabric(std::move(im)));
  CAIRN_LOG_DEBUG("{}: open at {} (mr_mode {:#x}, {} data progress, {})", raw->where(), f->address_text(), mr_mode,
                  info->domain_attr->data_progress == FI_PROGRESS_MANUAL ? "manual" : "auto",
                  raw->cq_waitable ? "fi_cq_sread" : "polling");
  return f;
}

Fabric::Fabric(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Fabric::~Fabric() = default;

const std::string& Fabric::address() const { return impl_->name; }

std::string Fabric::address_text() const {
  char buf[256] = {};
  size_t len = sizeof buf;
  const char* s = fi_av_straddr(impl_->av, impl_->name.data(), buf, &len);
  return s ? std::string(s) : std::string();
}

std::string Fabric::provider() const { return impl_->prov_name; }

void Fabric::set_control_handler(ControlHandler handler) {
  auto h = std::make_shared<const ControlHandler>(std::move(handler));
  std::lock_guard l(impl_->handler_mu);
  impl_->handler = std::move(h);
}

Result<uint64_t> Fabric::add_peer(const std::string& address) {
  Impl& im = *impl_;
  if (address.empty()) return invalid_argument(im.where() + ": add_peer: the address is empty");
  if (im.info->src_addrlen && im.info->addr_format != FI_ADDR_STR && address.size() != im.info->src_addrlen)
    return invalid_argument(im.where() + ": add_peer: an address of " + std::to_string(address.size()) +
                            " bytes, not " + std::to_string(im.info->src_addrlen) + " (from another provider?)");
  fi_addr_t fa = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(im.av, address.data(), 1, &fa, 0, nullptr);
  if (ret != 1 || fa == FI_ADDR_NOTAVAIL)
    return invalid_argument(im.where() + ": add_peer: fi_av_insert: " +
                            (ret < 0 ? fi_error_text(ret) : std::string("the address was not accepted")));
  return static_cast<uint64_t>(fa);
}

void Fabric::remove_peer(uint64_t peer) {
  fi_addr_t fa = peer;
  int ret = fi_av_remove(impl_->av, &fa, 1, 0);
  if (ret) CAIRN_LOG_WARN("{}: remove_peer {}: {}", impl_->where(), peer, fi_error_text(ret));
}

Status Fabric::register_region(void* base, size_t length) {
  Impl& im = *impl_;
  if (!base || length == 0) return invalid_argument(im.where() + ": register_region: an empty region");
  Region r;
  r.base = reinterpret_cast<uintptr_t>(base);
  r.length = length;
  if (im.need_desc) CAIRN_RETURN_IF_ERROR(im.reg_mr(base, length, FI_SEND | FI_RECV, &r.mr, &r.desc));
  std::unique_lock l(im.regions_mu);
  auto [it, inserted] = im.regions.emplace(r.base, r);
  if (!inserted) {
    // Registered again: the larger registration wins; a replaced one stays open until close, for
    // the operations in flight that use its descriptor.
    if (it->second.length >= length) {
      l.unlock();
      Impl::close_mr(r.mr);
      return Status::ok();
    }
    if (it->second.mr) im.retired_mrs.push_back(it->second.mr);
    it->second = r;
  }
  return Status::ok();
}

Status Fabric::send_control(uint64_t peer, std::span<const uint8_t> message, Completion done) {
  Impl& im = *impl_;
  if (message.size() > kMaxControlBytes)
    return invalid_argument(im.where() + ": a control message of " + std::to_string(message.size()) +
                            " bytes (at most " + std::to_string(kMaxControlBytes) + ")");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kControlSend;
  op->tag = kControlTag;
  op->peer = peer;
  op->length = message.size();
  op->done = std::move(done);
  if (im.need_desc) {
    auto slot = im.take_slot();
    if (!slot.is_ok()) return slot.status();
    op->slot = std::move(slot).value();
    if (!message.empty()) std::memcpy(op->slot->buf.get(), message.data(), message.size());
    op->data = op->slot->buf.get();
    op->desc = op->slot->desc;
  } else {
    op->owned.assign(message.begin(), message.end());
    op->data = op->owned.data();
  }
  Status st = im.submit(op.get());
  if (!st.is_ok()) {
    if (op->slot) im.give_slot(std::move(op->slot));
    return st;
  }
  op.release();  // the progress thread frees it
  return Status::ok();
}

Status Fabric::post_body_receive(uint64_t tag, void* dst, size_t length, Completion done) {
  Impl& im = *impl_;
  if (!(tag & kBodyTagBit))
    return invalid_argument(im.where() + ": body tag " + std::to_string(tag) + " lacks kBodyTagBit");
  if (!dst && length) return invalid_argument(im.where() + ": a body receive into no memory");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kBodyRecv;
  op->tag = tag;
  op->data = dst;
  op->length = length;
  op->done = std::move(done);
  CAIRN_RETURN_IF_ERROR(im.describe(op.get(), FI_RECV));
  Status st = im.submit(op.get());
  if (!st.is_ok()) {
    Impl::close_mr(op->temp_mr);
    return st;
  }
  Op* raw = op.release();
  // A cancel (or close) that came while posting found nothing to cancel yet.
  std::lock_guard l(im.mu);
  if (im.in_flight.count(raw) && (raw->cancel_requested || im.closing.load())) fi_cancel(&im.ep->fid, &raw->c);
  return Status::ok();
}

void Fabric::cancel_body_receive(uint64_t tag) {
  Impl& im = *impl_;
  {
    std::lock_guard l(im.mu);
    auto it = im.body_recvs.find(tag);
    if (it == im.body_recvs.end()) return;
    it->second->cancel_requested = true;  // a queued one is failed by the progress thread
    int ret = fi_cancel(&im.ep->fid, &it->second->c);
    if (ret && ret != -FI_ENOENT)
      CAIRN_LOG_DEBUG("{}: fi_cancel of body receive {}: {}", im.where(), tag, fi_error_text(ret));
  }
  im.wake();
}

Status Fabric::send_body(uint64_t peer, uint64_t tag, const void* src, size_t length, Completion done) {
  Impl& im = *impl_;
  if (!(tag & kBodyTagBit))
    return invalid_argument(im.where() + ": body tag " + std::to_string(tag) + " lacks kBodyTagBit");
  if (!src && length) return invalid_argument(im.where() + ": a body send from no memory");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kBodySend;
  op->tag = tag;
  op->peer = peer;
  op->data = const_cast<void*>(src);  // fi_tsend takes const; the field serves receives too
  op->length = length;
  op->done = std::move(done);
  CAIRN_RETURN_IF_ERROR(im.describe(op.get(), FI_SEND));
  Status st = im.submit(op.get());
  if (!st.is_ok()) {
    Impl::close_mr(op->temp_mr);
    return st;
  }
  op.release();
  return Status::ok();
}

nlohmann::json Fabric::stats() const {
  const Impl& im = *impl_;
  return {{"provider", im.prov_name},
          {"progress", im.cq_waitable ? "fi_cq_sread" : "polling"},
          {"mr_local", im.need_desc},
          {"control_sent", im.control_sent.load()},
          {"control_received", im.control_received.load()},
          {"body_sent", im.body_sent.load()},
          {"body_received", im.body_received.load()},
          {"bytes_sent", im.bytes_sent.load()},
          {"bytes_received", im.bytes_received.load()},
          {"errors", im.errors.load()}};
}

}  // namespace cairn
