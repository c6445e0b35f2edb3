// libFuzzer target for the job lifecycle's site config (/etc/cairn/site.yaml, tools/job_site.cpp):
// any bytes must give a SiteConfig or a kInvalidArgument Status naming the file, never a crash or an
// escaping exception; a parsed `daemon:` section must itself parse as YAML again.
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/job_site.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = cairn::tool::parse_site_config(text, "fuzz");
  if (!r.ok()) {
    if (r.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    if (r.status().message().find("site config fuzz") == std::string::npos) std::abort();
    return 0;
  }
  if (r->drain_timeout_s < 0 || r->start_timeout_s < 0 || r->stop_timeout_s < 0) std::abort();
  if (r->job_dir.empty() || r->job_dir[0] != '/') std::abort();
  if (!r->daemon_yaml.empty()) {
    try {
      YAML::Node n = YAML::Load(r->daemon_yaml);
      if (!n.IsMap()) std::abort();
    } catch (const YAML::Exception&) {
      std::abort();
    }
  }
  return 0;
}
