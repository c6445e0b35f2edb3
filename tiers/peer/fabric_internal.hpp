// Fabric's internals, shared by the files that implement it. Not for use outside tiers/peer/.
//
//   fabric_internal.hpp   the internal types (OpKind, Op, OpContext, ControlSlot, Event, Region) and Fabric::Impl
//   fabric.cpp            open() (hints, endpoint setup), memory registration, the public methods of Fabric
//   fabric_progress.cpp   the completion side: posting, queueing and retrying ops, reading the completion
//                         queue, completing ops, the progress thread, control send buffers, close
//
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
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tiers/peer/fabric.hpp"

namespace cairn {

namespace fabric_internal {

using Clock = std::chrono::steady_clock;

inline std::string fi_error_text(ssize_t ret) {
  int e = static_cast<int>(ret < 0 ? -ret : ret);
  return std::string(fi_strerror(e)) + " (" + std::to_string(e) + ")";
}

enum class OpKind : uint8_t { kControlRecv, kControlSend, kBodyRecv, kBodySend };

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

}  // namespace fabric_internal

using fabric_internal::Clock;
using fabric_internal::ControlSlot;
using fabric_internal::Event;
using fabric_internal::fi_error_text;
using fabric_internal::Op;
using fabric_internal::OpContext;
using fabric_internal::OpKind;
using fabric_internal::Region;

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

  ~Impl();

  std::string where() const;

  // ---- memory registration (fabric.cpp) ----

  Status reg_mr(const void* base, size_t length, uint64_t access, fid_mr** mr, void** desc);
  static void close_mr(fid_mr*& mr);
  // Sets op->desc for [op->data, + op->length): a region's, or one registered for this op only.
  Status describe(Op* op, uint64_t access);

  // ---- posting (fabric_progress.cpp) ----

  bool on_progress_thread() const;
  // Wakes the progress thread if it waits, so that it drives the provider's progress now.
  void wake();
  ssize_t try_post(Op* op);
  // Hands op to the provider, or queues it (FI_EAGAIN) for the progress thread to retry. OK: done
  // will run. Otherwise the op is untracked and the caller's to free.
  Status submit(Op* op);
  void enqueue(Op* op);                       // REQUIRES: queue_mu
  void dequeue(std::list<Op*>::iterator it);  // REQUIRES: queue_mu
  // The progress thread: posts what the provider would not take before, oldest first per peer;
  // fails what waited past its time, was cancelled, or met the fabric closing.
  void retry_queued();
  void untrack(Op* op);

  // ---- completions (fabric_progress.cpp) ----

  // Reads what the queue holds (waiting up to wait_ms when the queue has a wait object) and
  // handles it. Returns whether anything was read.
  bool read_cq(int wait_ms);
  static void run(const Fabric::Completion& done, const Status& st, size_t len, const char* what);
  void complete(const Event& ev);
  void progress_loop();

  // ---- control send buffers (fabric_progress.cpp) ----

  Result<std::unique_ptr<ControlSlot>> take_slot();
  void give_slot(std::unique_ptr<ControlSlot> s);

  // ---- close (fabric_progress.cpp) ----

  void shutdown();
  void close_fid(fid* f, const char* what);
  void close_regions();
};

}  // namespace cairn
