// The chunk sources below DRAM that every daemon has (tiers/tier.hpp has the interface): the NVMe
// burst buffer and the repository. Each measures its own read bandwidth for the cost model.
#pragma once

#include <string>

#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier.hpp"

namespace cairn {
class DramTier;
}  // namespace cairn

namespace cairn {

// The burst buffer's copies (NvmeTier::read verifies each against its hash and drops a bad one).
class NvmeSource final : public ChunkSource {
 public:
  explicit NvmeSource(NvmeTier& nvme) : nvme_(nvme) {}
  const std::string& name() const override { return name_; }
  bool has(const ChunkRef& ref) const override;
  Status read(const ChunkRef& ref, void* dst) override;
  double cost(uint64_t bytes) const override { return bw_.seconds_for(bytes); }
  double bandwidth() const { return bw_.bytes_per_second(); }

 private:
  NvmeTier& nvme_;
  const std::string name_ = "nvme";
  MeasuredBandwidth bw_{2e9};
};

// The repository's copies: one pread per chunk, verified. will_read tells the kernel about the
// pack ranges a request is about to read, so the reads find their bytes in flight (measured: cold
// reads 0.4x -> ~1x a plain sequential read of the pack file, docs/benchmarks.md).
class RepositorySource final : public ChunkSource {
 public:
  // dram (optional): where a delta's base may be resident already (a parent loaded before its
  // fine-tunes): read from there rather than from the repository again.
  explicit RepositorySource(Repository& repo, DramTier* dram = nullptr) : repo_(repo), dram_(dram) {}
  const std::string& name() const override { return name_; }
  // A ref that names its pack, or a chunk the repository's index knows.
  bool has(const ChunkRef& ref) const override;
  Status read(const ChunkRef& ref, void* dst) override;
  double cost(uint64_t bytes) const override { return bw_.seconds_for(bytes); }
  void will_read(std::span<const ChunkRef* const> refs) override;
  double bandwidth() const { return bw_.bytes_per_second(); }

 private:
  Repository& repo_;
  DramTier* dram_ = nullptr;
  const std::string name_ = "repository";
  MeasuredBandwidth bw_{5e8};
};

}  // namespace cairn
