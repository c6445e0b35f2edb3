// The peer service: makes the daemons of one batch job a cooperative cache (docs/peers.md).
//
// It owns the group's parts and runs the protocol between them:
//   Membership (membership.hpp)     who is in the group: the rendezvous directory, the secret
//   Fabric (tiers/peer/fabric.hpp)  the libfabric endpoint; the DRAM arena registered once
//   ChunkDirectory (directory.hpp)  for the chunks this member is home for: who holds them
//   peer_wire.hpp                   the messages, each MAC'd with the group's secret
// and gives the tier manager one more chunk source (source()), asked after the NVMe tier and before
// the repository: a read that misses locally asks the chunk's home, which answers "fetch it from
// holder H" (the least-loaded), "read the repository yourself" (the first to ask: each chunk is read
// from the repository once per job), or queues the asker until the loader holds it. The body comes
// as one tagged message straight into the reader's arena space and is checked against its hash.
//
// Every member proves it holds the secret (an HMAC challenge) before it is served anything; frames
// that fail their MAC are dropped and logged. A member that stops answering costs a reader at most
// peers.timeout; the membership scan (every timeout/4) then drops it everywhere.
//
// Threads: the fabric's progress thread runs the message handlers (never blocking); one service
// thread (from start()) sends the batched holder announcements, runs the membership scan and
// delivers the group's events (PeerEvents, peer_events.hpp); readers block in fetch() on their own
// threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/config.hpp"
#include "core/status.hpp"
#include "daemon/peers/part_transport.hpp"
#include "daemon/peers/peer_events.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/pfs/manifest.hpp"
#include "tiers/tier.hpp"

namespace cairn {

struct ChunkRef;

// The group id and rendezvous directory a config names: peers.job, else $SLURM_JOB_ID, else
// $PBS_JOBID; "" (no group) when none or "none". rendezvous "" = <repository>/.peers.
struct PeerGroup {
  std::string job;
  std::string rendezvous;
};
PeerGroup resolve_peer_group(const Config& config);

class PeerService {
 public:
  struct Options {
    std::string job;
    std::string rendezvous;
    std::string provider = "tcp;ofi_rxm";
    std::string address;
    uint64_t expect = 0;
    std::chrono::milliseconds timeout{10000};
  };
  // Opens the fabric, registers the arena, joins the group and greets the members there. What
  // they send is queued until start(); another member's stage request is refused until then.
  static Result<std::unique_ptr<PeerService>> open(const Options& options, DramTier& dram);
  // Delivers what the group says to `events` from now on (the service thread) and, with
  // expect > 0, waits up to the timeout for that many verified members. REQUIRES: called once;
  // events outlives this service.
  void start(PeerEvents& events);
  // Says goodbye, leaves the rendezvous directory, stops the threads, closes the fabric.
  ~PeerService();
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // The chunk source the tier manager is made with (it refers to this service: destroy it first).
  std::unique_ptr<ChunkSource> source();

  // Reads ref's bytes into dst (arena space) from a member that holds the chunk, checked against
  // its hash. kNotFound when the group says this member reads it from the repository itself (or
  // nobody else is there); kUnavailable / kTimeout / kCorruption when a holder failed.
  Status fetch(const ChunkRef& ref, void* dst);
  // Whether another verified member is there now (a fetch can only help then).
  bool has_members() const;
  // Tells every verified member about a model committed here (the job's catalog). A manifest whose
  // message would exceed one control message (about 64 KiB: thousands of tensors) is not announced;
  // the others see that model when it reaches the repository.
  void announce_model(const ModelManifest& model);

  // This member's id in the group.
  const std::string& self() const;
  // The verified members now, this one not included.
  std::vector<std::string> verified_members() const;
  // The member that assembles the multi-part model `id`: the highest rendezvous weight of the id's
  // hash among the verified members and this one (every member computes the same while they see
  // the same members).
  std::string model_home(const std::string& id) const;
  // Sends a multi-part model message (is_part_message) to a verified member. kUnavailable when it
  // is not one (any more); kInvalidArgument when the frame would exceed one control message.
  Status send_part_message(const std::string& member, PeerMsg type, nlohmann::json body);

  // `cairn prefetch ID --all`: asks every verified member to bring the model into its DRAM (each
  // through the group, so the chunks spread as a pipelined tree) and waits for their answers, at
  // most until deadline; a member that leaves meanwhile fails. One entry per member:
  // {member, ok, bytes, seconds, error}. on_answer (when set) is called with how many members were
  // asked and how many have answered: once when they have been asked, then after each answer.
  nlohmann::json stage_all(const std::string& model, std::chrono::steady_clock::time_point deadline,
                           const std::function<void(size_t asked, size_t answered)>& on_answer = {});
  // Refuses further stage requests and waits for those running (their PeerEvents::stage calls
  // return); the engine calls it before it takes down what staging uses.
  void stop_staging();

  // `cairn peers`: the group, each member with its state and bytes exchanged, the directory.
  nlohmann::json status() const;

  struct Impl;

 private:
  explicit PeerService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The multi-part models' transport (group_parts.hpp) over a peer service.
class PeerPartTransport final : public PartTransport {
 public:
  explicit PeerPartTransport(PeerService& peers) : peers_(peers) {}
  bool active() const override { return peers_.has_members(); }
  std::string self() const override { return peers_.self(); }
  std::string home(const std::string& model) const override { return peers_.model_home(model); }
  Status send(const std::string& member, PeerMsg type, nlohmann::json body) override {
    return peers_.send_part_message(member, type, std::move(body));
  }
  std::vector<std::string> members() const override { return peers_.verified_members(); }

 private:
  PeerService& peers_;
};

}  // namespace cairn
