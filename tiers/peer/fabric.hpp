// The transport between the daemons of a job: one libfabric FI_EP_RDM endpoint per daemon.
//
// Two kinds of traffic, both tagged messages (docs/peers.md):
//   - control messages: small (at most kMaxControlBytes), sent with tag kControlTag; the receiver
//     keeps a ring of posted buffers and hands each arriving message to the control handler;
//   - chunk bodies: the receiver posts a receive for one body with a tag of its choosing
//     (kBodyTagBit | sequence) straight into its destination (arena space, registered once with
//     register_region, so no staging copy), then asks the holder, which sends the body from its own
//     arena with that tag.
// Whatever the provider's mr_mode asks for (FI_MR_LOCAL descriptors, FI_MR_VIRT_ADDR, provider
// keys, FI_MR_ENDPOINT binding) is handled here; memory outside a registered region is registered
// for the one operation (or bounced) when the provider needs descriptors. Data progress may be
// manual: a progress thread drives the completion queue and runs the callbacks.
//
// Thread-safety: every method may be called from any thread. Callbacks run on the progress thread;
// they must not block (no waiting on another fabric operation inside one), but may post new ones.
// Posting never blocks: what the provider cannot take yet (FI_EAGAIN) waits in a queue that the
// progress thread retries, in order per peer, for at most FabricOptions::busy_timeout_ms.
// Ordering: the endpoint asks for FI_ORDER_SAS where the provider has it (tcp;ofi_rxm and shm do),
// so the messages one thread sends to one peer are matched in the order sent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

struct FabricOptions {
  std::string provider = "tcp;ofi_rxm";  // fi_getinfo's prov_name
  // The address or interface to bind: "127.0.0.2", "10.1.2.3", "ib0"; "" = the provider's default.
  std::string address;
  // Pass memory descriptors on every operation (registering what lies outside register_region's
  // regions for that one operation) even when the provider's mr_mode has no FI_MR_LOCAL: exercises
  // that path on providers like tcp;ofi_rxm that do not need it (tests).
  bool descriptors_always = false;
  // How long an operation may wait for the provider to take it (FI_EAGAIN: a peer that cannot be
  // reached, where tcp;ofi_rxm keeps trying to connect, or a full send queue) before it completes
  // with kUnavailable.
  uint32_t busy_timeout_ms = 5000;
};

class Fabric {
 public:
  static constexpr uint64_t kControlTag = 1;
  static constexpr uint64_t kBodyTagBit = 1ull << 62;
  static constexpr size_t kMaxControlBytes = 64 << 10;

  // Called with (status, bytes transferred) when an operation completes or fails (a peer gone, a
  // cancelled receive, the Fabric closed: kUnavailable with a message saying which). Runs exactly
  // once per operation whose post returned OK (never when the post itself returned an error).
  using Completion = std::function<void(const Status&, size_t)>;
  // Called for every control message that arrives.
  using ControlHandler = std::function<void(std::span<const uint8_t>)>;

  // Opens the fabric, domain, endpoint, address vector and completion queue for options.provider
  // bound to options.address, posts the control receive buffers and starts the progress thread.
  // kInvalidArgument naming the provider when libfabric has no such provider or it lacks
  // FI_TAGGED, or the address is not usable (not this host's, no such interface).
  static Result<std::unique_ptr<Fabric>> open(const FabricOptions& options);
  // Cancels what is outstanding (completions report an error), stops the progress thread, closes.
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  // The endpoint's address (fi_getname), opaque bytes to publish for the others.
  const std::string& address() const;
  // The same, readable (fi_av_straddr), for logs and `cairn peers`.
  std::string address_text() const;
  // The provider actually chosen ("tcp;ofi_rxm").
  std::string provider() const;

  // The handler for control messages. REQUIRES: before the first message may arrive (set it
  // right after open); it is called on the progress thread.
  void set_control_handler(ControlHandler handler);

  // Makes an address from address() of another Fabric reachable: returns a handle for sends.
  Result<uint64_t> add_peer(const std::string& address);
  // Forgets a peer (its operations in flight complete with errors, as far as the provider reports
  // them; at the latest when the Fabric closes).
  void remove_peer(uint64_t peer);

  // Registers [base, base + length) once (the DRAM arena): sends from and receives into it need
  // no registration per operation.
  Status register_region(void* base, size_t length);

  // Sends a control message (copied; at most kMaxControlBytes). done (optional) runs on completion.
  Status send_control(uint64_t peer, std::span<const uint8_t> message, Completion done = {});
  // Posts a receive of at most length bytes with this tag (which must have kBodyTagBit set) into
  // dst, from any peer. done reports the bytes received. The caller keeps dst alive until done runs.
  // kInvalidArgument when a receive with this tag is already posted.
  Status post_body_receive(uint64_t tag, void* dst, size_t length, Completion done);
  // Cancels a posted body receive that has not completed (its done runs with an error, once). A
  // tag with no receive posted (or one completed already) is ignored.
  void cancel_body_receive(uint64_t tag);
  // Sends length bytes from src with this tag. The caller keeps src alive until done runs.
  Status send_body(uint64_t peer, uint64_t tag, const void* src, size_t length, Completion done);

  // Counters: messages and bytes sent and received, per kind; errors (failed operations; not
  // cancelled ones).
  nlohmann::json stats() const;

 private:
  struct Impl;
  explicit Fabric(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
