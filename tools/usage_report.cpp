// The text `cairn stats` and `cairn du` print (usage_report.hpp).
#include "tools/usage_report.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "tools/progress_line.hpp"

namespace cairn::tool {

using nlohmann::json;

void print_stats(const json& r) {
  std::printf("%-5s %-8s %12s %12s %10s %10s %12s %12s\n", "tier", "enabled", "capacity", "used", "hits", "misses",
              "bytes in", "bytes out");
  for (const char* name : {"hbm", "dram", "nvme", "pfs"}) {
    const json& t = r["tiers"][name];
    uint64_t cap = t["capacity_bytes"].get<uint64_t>();
    std::printf("%-5s %-8s %12s %12s %10llu %10llu %12s %12s\n", name, t["enabled"].get<bool>() ? "yes" : "no",
                cap ? human_bytes(cap).c_str() : "-", human_bytes(t["used_bytes"].get<uint64_t>()).c_str(),
                static_cast<unsigned long long>(t["hits"].get<uint64_t>()),
                static_cast<unsigned long long>(t["misses"].get<uint64_t>()),
                human_bytes(t["bytes_in"].get<uint64_t>()).c_str(),
                human_bytes(t["bytes_out"].get<uint64_t>()).c_str());
  }
  if (std::string pages = r["tiers"]["dram"].value("pages", std::string()); !pages.empty())
    std::printf("dram: %s\n", pages.c_str());
  if (const json& hbm = r["tiers"]["hbm"]; !hbm.value("enabled", false)) {
    std::printf("hbm: %s\n", hbm.value("why", std::string("no HBM tier")).c_str());
  } else {
    for (const json& d : hbm.value("devices", json::array()))
      std::printf("hbm device %d (%s): %s of %s used, %s held by device leases, %llu evictions\n", d.value("device", 0),
                  hbm.value("backend", std::string()).c_str(), human_bytes(d.value("used_bytes", uint64_t{0})).c_str(),
                  human_bytes(d.value("capacity_bytes", uint64_t{0})).c_str(),
                  human_bytes(d.value("pinned_bytes", uint64_t{0})).c_str(),
                  static_cast<unsigned long long>(d.value("evictions", uint64_t{0})));
  }
  const json& repo = r["repository"];
  uint64_t logical = repo["logical_bytes"].get<uint64_t>(), physical = repo["physical_bytes"].get<uint64_t>();
  uint64_t stored = repo.value("stored_bytes", physical);
  std::printf("repository %s: %llu models, logical %s, deduplicated %s, stored %s",
              repo["path"].get<std::string>().c_str(), static_cast<unsigned long long>(repo["models"].get<uint64_t>()),
              human_bytes(logical).c_str(), human_bytes(physical).c_str(), human_bytes(stored).c_str());
  if (physical > 0 && stored > 0)
    std::printf(" (%.2fx deduplication, %.2fx coding)", static_cast<double>(logical) / static_cast<double>(physical),
                static_cast<double>(physical) / static_cast<double>(stored));
  if (const json& k = repo.value("codings", json::object()); k.is_object() && !k.empty()) {
    std::printf("\nchunks stored:");
    const char* sep = " ";
    for (const char* name : {"raw", "planes", "delta"}) {
      const json& c = k.value(name, json::object());
      std::printf("%s%s %llu (%s in %s)", sep, name, static_cast<unsigned long long>(c.value("chunks", uint64_t{0})),
                  human_bytes(c.value("bytes", uint64_t{0})).c_str(),
                  human_bytes(c.value("stored", uint64_t{0})).c_str());
      sep = ", ";
    }
  }
  const json& f = r["flush"];
  std::printf(
      "\nnot yet in the repository: %llu models (%llu safe on the burst buffer); dirty %s in DRAM, %s on NVMe\n",
      static_cast<unsigned long long>(f["pending_models"].get<uint64_t>()),
      static_cast<unsigned long long>(f["local_not_global"].get<uint64_t>()),
      human_bytes(f["dirty_dram_bytes"].get<uint64_t>()).c_str(),
      human_bytes(f["dirty_nvme_bytes"].get<uint64_t>()).c_str());
  if (const json& c = r["compute"]; c.is_object()) {  // the near-data worker (docs/near.md)
    if (!c.value("enabled", false)) {
      std::printf("compute: off (compute.enabled: false)\n");
    } else if (c.value("running", false)) {
      std::printf("compute: worker pid %lld on %s%s%s, %llu started\n", static_cast<long long>(c.value("pid", 0)),
                  c.value("socket", std::string()).c_str(), c.value("listen", std::string()).empty() ? "" : " and ",
                  c.value("listen", std::string()).c_str(), static_cast<unsigned long long>(c.value("starts", 0)));
    } else {
      const std::string why = c.value("last_error", std::string());
      std::printf("compute: enabled, no worker running (the next request starts one)%s%s\n",
                  why.empty() ? "" : "; last: ", why.c_str());
    }
  }
}

void print_du(const json& rows) {
  std::printf("%-32s %10s %10s %10s %14s  %s\n", "ID", "LOGICAL", "STORED", "OWN", "WITH ANCESTORS",
              "CHUNKS (raw/planes/delta)");
  for (const json& row : rows) {
    const std::string id = row["id"].get<std::string>();
    const std::string logical = human_bytes(row["logical_bytes"].get<uint64_t>());
    if (!row.contains("storage")) {
      std::printf("%-32s %10s %10s  not in the repository yet\n", id.c_str(), logical.c_str(), "-");
      continue;
    }
    const json& s = row["storage"];
    const json& k = s["codings"];
    std::printf("%-32s %10s %10s %10s %14s  %llu/%llu/%llu\n", id.c_str(), logical.c_str(),
                human_bytes(s["stored_bytes"].get<uint64_t>()).c_str(),
                human_bytes(s["own_stored_bytes"].get<uint64_t>()).c_str(),
                human_bytes(s["lineage_stored_bytes"].get<uint64_t>()).c_str(),
                static_cast<unsigned long long>(k.value("raw", uint64_t{0})),
                static_cast<unsigned long long>(k.value("planes", uint64_t{0})),
                static_cast<unsigned long long>(k.value("delta", uint64_t{0})));
  }
}

}  // namespace cairn::tool
