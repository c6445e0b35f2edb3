// Which peer group a config names (peer_service.hpp): built with or without libfabric.
#include <cstdlib>

#include "daemon/peers/peer_service.hpp"

namespace cairn {

PeerGroup resolve_peer_group(const Config& config) {
  PeerGroup g;
  std::string job = config.peers.job;
  if (job.empty()) {
    if (const char* s = std::getenv("SLURM_JOB_ID"); s && *s)
      job = s;
    else if (const char* p = std::getenv("PBS_JOBID"); p && *p)
      job = p;
  }
  if (job == "none") job.clear();
  g.job = job;
  g.rendezvous = config.peers.rendezvous.empty() ? config.repository + "/.peers" : config.peers.rendezvous;
  return g;
}

}  // namespace cairn
