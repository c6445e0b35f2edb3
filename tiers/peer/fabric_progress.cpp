// Fabric's completion side: posting, queueing and retrying ops, reading the completion queue, completing
// ops, the progress thread, the control send buffers, close (tiers/peer/fabric_internal.hpp says how the
// implementation works and is split).
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "tiers/peer/fabric_internal.hpp"

namespace cairn {

namespace {

constexpr size_t kControlSlotsKept = 64;  // registered control send buffers kept for reuse
constexpr int kWaitTimeoutMs = 100;       // fi_cq_sread's timeout: how soon stop is noticed
constexpr auto kMaxPollSleep = std::chrono::microseconds(1000);
constexpr auto kCloseWait = std::chrono::seconds(2);  // the destructor's wait for ops in flight
constexpr size_t kCqBatch = 32;

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

}  // namespace

// ---- posting ----

bool Fabric::Impl::on_progress_thread() const { return std::this_thread::get_id() == progress_id.load(); }

void Fabric::Impl::wake() {
  if (!sleeping.load() || on_progress_thread()) return;
  if (cq_waitable) {
    fi_cq_signal(cq);
  } else {
    std::lock_guard l(poll_mu);
    kicked = true;
    poll_cv.notify_one();
  }
}

ssize_t Fabric::Impl::try_post(Op* op) {
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

Status Fabric::Impl::submit(Op* op) {
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
      return Status::OK();
    }
  }
  ssize_t ret = try_post(op);
  if (ret == 0) {
    wake();
    return Status::OK();
  }
  if (ret == -FI_EAGAIN) {
    std::lock_guard l(queue_mu);
    enqueue(op);
    wake();
    return Status::OK();
  }
  untrack(op);
  ++errors;
  return unavailable(where() + ": posting a " + op_name(op->kind) + ": " + fi_error_text(ret));
}

void Fabric::Impl::enqueue(Op* op) {
  op->give_up = fabric_internal::Clock::now() + std::chrono::milliseconds(options.busy_timeout_ms);
  queued.push_back(op);
  ++queued_per_peer[op->peer];
  ++queued_count;
}

void Fabric::Impl::dequeue(std::list<Op*>::iterator it) {
  auto pp = queued_per_peer.find((*it)->peer);
  if (pp != queued_per_peer.end() && --pp->second == 0) queued_per_peer.erase(pp);
  queued.erase(it);
  --queued_count;
}

void Fabric::Impl::retry_queued() {
  std::vector<Event> failed;
  {
    std::lock_guard l(queue_mu);
    std::unordered_set<uint64_t> busy;  // peers whose oldest queued op still gets FI_EAGAIN
    auto now = fabric_internal::Clock::now();
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

void Fabric::Impl::untrack(Op* op) {
  std::lock_guard l(mu);
  in_flight.erase(op);
  if (op->kind == OpKind::kBodyRecv) {
    auto it = body_recvs.find(op->tag);
    if (it != body_recvs.end() && it->second == op) body_recvs.erase(it);
  }
  if (in_flight.empty()) drained.notify_all();
}

// ---- completions ----

bool Fabric::Impl::read_cq(int wait_ms) {
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

void Fabric::Impl::run(const Fabric::Completion& done, const Status& st, size_t len, const char* what) {
  if (!done) return;
  try {
    done(st, len);
  } catch (const std::exception& e) {
    CAIRN_LOG_ERROR("fabric: a {} callback threw: {}", what, e.what());
  } catch (...) {
    CAIRN_LOG_ERROR("fabric: a {} callback threw", what);
  }
}

void Fabric::Impl::complete(const Event& ev) {
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
      if (st.ok()) {
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
      if (!p.ok() && !closing.load()) CAIRN_LOG_ERROR("{}: reposting a control receive: {}", where(), p.to_string());
      return;
    }
    case OpKind::kControlSend:
      if (st.ok()) {
        ++control_sent;
        bytes_sent += op->length;
      }
      run(op->done, st, st.ok() ? op->length : 0, "control send");
      if (op->slot) give_slot(std::move(op->slot));
      break;
    case OpKind::kBodyRecv:
      if (st.ok()) {
        ++body_received;
        bytes_received += ev.len;
      }
      run(op->done, st, st.ok() ? ev.len : 0, "body receive");
      break;
    case OpKind::kBodySend:
      if (st.ok()) {
        ++body_sent;
        bytes_sent += op->length;
      }
      run(op->done, st, st.ok() ? op->length : 0, "body send");
      break;
  }
  delete op;
}

void Fabric::Impl::progress_loop() {
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

Result<std::unique_ptr<ControlSlot>> Fabric::Impl::take_slot() {
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

void Fabric::Impl::give_slot(std::unique_ptr<ControlSlot> s) {
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

Fabric::Impl::~Impl() { shutdown(); }

void Fabric::Impl::shutdown() {
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
      drained.wait_until(l, fabric_internal::Clock::now() + kCloseWait, [&] { return in_flight.empty(); });
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

void Fabric::Impl::close_fid(fid* f, const char* what) {
  if (!f) return;
  int ret = fi_close(f);
  if (ret) CAIRN_LOG_WARN("{}: closing {}: {}", where(), what, fi_error_text(ret));
}

void Fabric::Impl::close_regions() {
  std::unique_lock l(regions_mu);
  for (auto& [base, r] : regions) close_mr(r.mr);
  for (fid_mr*& mr : retired_mrs) close_mr(mr);
}

}  // namespace cairn
