#include "daemon/usage_counters.hpp"

namespace cairn {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}  // namespace

void UsageCounters::request_served(std::chrono::nanoseconds took) {
  requests_.fetch_add(1, kRelaxed);
  request_wait_ns_.fetch_add(took.count() > 0 ? static_cast<uint64_t>(took.count()) : 0, kRelaxed);
}

void UsageCounters::model_committed(uint64_t stored, uint64_t deduplicated, uint64_t inherited) {
  models_committed_.fetch_add(1, kRelaxed);
  stored_bytes_.fetch_add(stored, kRelaxed);
  deduplicated_bytes_.fetch_add(deduplicated, kRelaxed);
  inherited_bytes_.fetch_add(inherited, kRelaxed);
}

void UsageCounters::model_opened() { models_opened_.fetch_add(1, kRelaxed); }

void UsageCounters::chunk_leased(std::string_view source, uint64_t bytes) {
  Source s = source == "dram"         ? kDram
             : source == "nvme"       ? kNvme
             : source == "peer"       ? kPeer
             : source == "repository" ? kRepository
                                      : kOther;
  leased_bytes_[s].fetch_add(bytes, kRelaxed);
}

nlohmann::json UsageCounters::to_json() const {
  return {{"requests", requests_.load(kRelaxed)},
          {"request_wait_ns", request_wait_ns_.load(kRelaxed)},
          {"models_committed", models_committed_.load(kRelaxed)},
          {"models_opened", models_opened_.load(kRelaxed)},
          {"committed_bytes",
           {{"stored", stored_bytes_.load(kRelaxed)},
            {"deduplicated", deduplicated_bytes_.load(kRelaxed)},
            {"inherited", inherited_bytes_.load(kRelaxed)}}},
          {"leased_bytes",
           {{"dram", leased_bytes_[kDram].load(kRelaxed)},
            {"nvme", leased_bytes_[kNvme].load(kRelaxed)},
            {"peer", leased_bytes_[kPeer].load(kRelaxed)},
            {"repository", leased_bytes_[kRepository].load(kRelaxed)},
            {"other", leased_bytes_[kOther].load(kRelaxed)}}}};
}

}  // namespace cairn
