// The site config of the job lifecycle (see job_site.hpp and docs/slurm.md).
#include "tools/job_site.hpp"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace cairn::tool {
namespace {

Status bad(const std::string& source, const std::string& key, const std::string& what) {
  return invalid_argument("site config " + source + ": " + key + ": " + what);
}

Result<std::string> scalar(const YAML::Node& n, const std::string& source, const std::string& key) {
  if (!n.IsScalar()) return bad(source, key, "must be a single value");
  return n.Scalar();
}

Result<double> duration(const YAML::Node& n, const std::string& source, const std::string& key) {
  auto s = scalar(n, source, key);
  if (!s.ok()) return s.status();
  double v = parse_duration_seconds(*s);
  if (v < 0) return bad(source, key, "'" + *s + "' is not a duration (e.g. 30s, 500ms, 2m, 1h)");
  return v;
}

}  // namespace

double parse_duration_seconds(const std::string& text) {
  if (text.empty() || text.size() > 32) return -1;
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return -1;
  std::string number = text.substr(0, i), unit = text.substr(i);
  if (std::count(number.begin(), number.end(), '.') > 1 || number == ".") return -1;
  double v = std::strtod(number.c_str(), nullptr);
  if (!std::isfinite(v)) return -1;
  if (unit.empty() || unit == "s") return v;
  if (unit == "ms") return v / 1000;
  if (unit == "m") return v * 60;
  if (unit == "h") return v * 3600;
  return -1;
}

std::string default_site_path(const std::string& prefix) {
  if (!prefix.empty()) {
    std::string p = prefix + "/etc/cairn/site.yaml";
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) return p;
  }
  return "/etc/cairn/site.yaml";
}

Result<SiteConfig> parse_site_config(const std::string& text, const std::string& source) {
  SiteConfig c;
  c.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return invalid_argument("site config " + source + ": not valid YAML: " + e.what());
  }
  if (!root || root.IsNull()) return c;  // an empty file: the defaults
  if (!root.IsMap()) return invalid_argument("site config " + source + ": must be a mapping of keys");
  try {
    for (const auto& kv : root) {
      if (!kv.first.IsScalar()) return invalid_argument("site config " + source + ": a key is not a string");
      const std::string key = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (key == "enable") {
        auto s = scalar(v, source, key);
        if (!s.ok()) return s.status();
        if (*s == "opt-in")
          c.enable = SiteConfig::Enable::kOptIn;
        else if (*s == "always")
          c.enable = SiteConfig::Enable::kAlways;
        else if (*s == "never")
          c.enable = SiteConfig::Enable::kNever;
        else
          return bad(source, key, "'" + *s + "' is not one of opt-in, always, never");
      } else if (key == "repository" || key == "job_dir") {
        auto s = scalar(v, source, key);
        if (!s.ok()) return s.status();
        if (key == "job_dir") {
          if (s->empty() || (*s)[0] != '/') return bad(source, key, "must be an absolute path");
          c.job_dir = *s;
        } else {
          c.repository = *s;
        }
      } else if (key == "daemon") {
        if (v.IsNull()) continue;
        if (!v.IsMap()) return bad(source, key, "must be a mapping of cairnd config keys (docs/config.md)");
        YAML::Emitter out;
        out << v;
        if (!out.good()) return bad(source, key, "cannot be written back as YAML (" + out.GetLastError() + ")");
        // cairnd reads this text as its config: it must read back as the same kind of mapping (a
        // key of bytes that are not UTF-8 is emitted as text that does not; the fuzzer found one).
        try {
          if (!YAML::Load(out.c_str()).IsMap())
            return bad(source, key, "does not read back as a mapping once written out (a key that is not UTF-8?)");
        } catch (const YAML::Exception& e) {
          return bad(source, key, std::string("does not read back once written out: ") + e.what());
        }
        c.daemon_yaml = out.c_str();
      } else if (key == "drain_timeout" || key == "start_timeout" || key == "stop_timeout") {
        auto d = duration(v, source, key);
        if (!d.ok()) return d.status();
        (key == "drain_timeout"   ? c.drain_timeout_s
         : key == "start_timeout" ? c.start_timeout_s
                                  : c.stop_timeout_s) = *d;
      } else if (key == "on_failure") {
        auto s = scalar(v, source, key);
        if (!s.ok()) return s.status();
        if (*s == "continue")
          c.on_failure = SiteConfig::OnFailure::kContinue;
        else if (*s == "drain")
          c.on_failure = SiteConfig::OnFailure::kDrain;
        else
          return bad(source, key, "'" + *s + "' is not one of continue, drain");
      } else if (key == "keep_job_dir") {
        auto s = scalar(v, source, key);
        if (!s.ok()) return s.status();
        if (*s == "true" || *s == "yes")
          c.keep_job_dir = true;
        else if (*s == "false" || *s == "no")
          c.keep_job_dir = false;
        else
          return bad(source, key, "'" + *s + "' is not true or false");
      } else if (key == "node") {
        if (v.IsNull()) continue;
        if (!v.IsMap()) return bad(source, key, "must be a mapping of node settings (known: shmem_thp)");
        for (const auto& setting : v) {
          if (!setting.first.IsScalar()) return bad(source, key, "a key is not a string");
          const std::string name = key + "." + setting.first.Scalar();
          if (setting.first.Scalar() != "shmem_thp")
            return invalid_argument("site config " + source + ": unknown key '" + name + "' (known: node.shmem_thp)");
          auto s = scalar(setting.second, source, name);
          if (!s.ok()) return s.status();
          if (*s != "always" && *s != "within_size" && *s != "advise" && *s != "never")
            return bad(source, name, "'" + *s + "' is not one of always, within_size, advise, never");
          c.node_shmem_thp = *s;
        }
      } else {
        return invalid_argument("site config " + source + ": unknown key '" + key +
                                "' (known: enable, repository, job_dir, daemon, drain_timeout, start_timeout, "
                                "stop_timeout, on_failure, keep_job_dir, node)");
      }
    }
  } catch (const YAML::Exception& e) {
    return invalid_argument("site config " + source + ": " + e.what());
  }
  return c;
}

Result<SiteConfig> load_site_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) {
      SiteConfig c;
      c.source = path + " (absent: defaults)";
      return c;
    }
    return errno_status("site config '" + path + "'", errno);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_site_config(ss.str(), path);
}

}  // namespace cairn::tool
