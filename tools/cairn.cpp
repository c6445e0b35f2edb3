// cairn: the command-line tool. Talks to the node's cairnd through the public C++ client (cairn/client.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cairn/client.hpp"
#include "core/safetensors.hpp"
#include "core/version.hpp"
#include "core/wire.hpp"
#include "tiers/pfs/repository.hpp"
#include "tools/daemon_progress.hpp"
#include "tools/fault.hpp"
#include "tools/job.hpp"
#include "tools/keras_h5.hpp"
#include "tools/lineage_picture.hpp"
#include "tools/progress_line.hpp"
#include "tools/public_client.hpp"
#include "tools/python_io.hpp"
#include "tools/usage_report.hpp"

namespace {

using cairn::tool::human_bytes;

using cairn::Result;
using cairn::Status;
using nlohmann::json;

// Prints the error ("cairn: <message>") and returns the exit status 1.
int fail(const Status& s) {
  std::fprintf(stderr, "cairn: %s\n", s.to_string().c_str());
  return 1;
}

Result<cairn::v1::Client> connect() { return cairn::tool::connect(); }

Result<cairn::Durability> parse_durability(const std::string& s) {
  if (auto d = cairn::durability_from_name(s)) return *d;
  return cairn::invalid_argument("--durability '" + s + "' is not one of memory, local, global");
}

Result<json> read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return cairn::errno_status(std::string(what) + " '" + path + "'", errno);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return cairn::invalid_argument(std::string(what) + " '" + path + "' is not valid JSON");
  return j;
}

// --quiet and --progress of the long commands (tools/progress_line.hpp).
struct ProgressFlags {
  bool quiet = false;
  bool force = false;
  cairn::tool::ProgressMode mode() const { return cairn::tool::choose_progress_mode(quiet, force, ::isatty(2) == 1); }
};

void add_progress_flags(CLI::App* cmd, ProgressFlags& flags) {
  cmd->add_flag("-q,--quiet", flags.quiet, "no progress line");
  cmd->add_flag("--progress", flags.force,
                "show progress even when stderr is not a terminal (plain lines, a few a second)");
}

// A long daemon request with its progress shown while it runs: the request's result.
Result<json> call_with_progress(cairn::v1::Client& client, json request, cairn::tool::ProgressLine& line) {
  cairn::tool::DaemonProgress watch(line);
  watch.add_token(request);
  watch.start();
  auto r = cairn::tool::request(client, request);
  watch.stop();
  return r;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- put ----

int cmd_put(const std::string& id, const std::string& file, const std::string& parent, const std::string& arch_path,
            const std::string& meta_text, const std::string& durability_text, const ProgressFlags& pf,
            const char* verb = "put") {
  auto durability = parse_durability(durability_text);
  if (!durability.ok()) return fail(durability.status());
  if (ends_with(file, ".h5") || ends_with(file, ".hdf5") || ends_with(file, ".pt") || ends_with(file, ".bin"))
    return fail(cairn::invalid_argument("'" + file + "': `cairn put` stores safetensors files; use `cairn import " +
                                        id + " " + file + "` for Keras HDF5 and torch files"));
  json meta = nullptr;
  if (!meta_text.empty()) {
    meta = json::parse(meta_text, nullptr, false);
    if (meta.is_discarded() || !meta.is_object()) return fail(cairn::invalid_argument("--meta must be a JSON object"));
  }
  json arch;
  if (!arch_path.empty()) {
    auto a = read_json_file(arch_path, "architecture graph");
    if (!a.ok()) return fail(a.status());
    arch = *a;
  }
  // The file is checked before connecting, so that a bad file is named even without a daemon.
  auto header = cairn::safetensors::read_header(file);
  if (!header.ok()) return fail(header.status());
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  cairn::tool::ProgressLine line(std::string(verb) + " " + id, pf.mode(), stderr);
  uint64_t bytes = 0;
  cairn_file_options opts = CAIRN_FILE_OPTIONS_INIT;
  opts.parent = parent.empty() ? nullptr : parent.c_str();
  opts.durability = static_cast<cairn_durability>(*durability);
  const std::string meta_json = meta.is_object() ? meta.dump() : "";
  const std::string arch_json = arch.is_null() ? "" : arch.dump();
  opts.metadata_json = meta_json.empty() ? nullptr : meta_json.c_str();
  opts.architecture_json = arch_json.empty() ? nullptr : arch_json.c_str();
  Status st = cairn::tool::to_status(
      client->model_put_file(id, file, opts, [&](const char* phase, uint64_t done, uint64_t total) {
        if (std::string_view(phase) != "committing") bytes = done;
        line.update(cairn::ProgressSnapshot{phase, cairn::ProgressUnit::kBytes, done, total});
      }));
  if (!st.ok()) return fail(st);
  line.finish(std::string(verb) + " " + id + ": " + cairn::tool::human_bytes(bytes) + " from " + file + " committed (" +
              durability_text + ")");
  return 0;
}

// ---- get ----

int cmd_get(const std::string& id, const std::string& out, const std::vector<std::string>& only,
            const ProgressFlags& pf, const char* verb = "get") {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  cairn::tool::ProgressLine line(std::string(verb) + " " + id, pf.mode(), stderr);
  std::vector<const char*> names;
  for (const std::string& n : only) names.push_back(n.c_str());
  cairn_file_options opts = CAIRN_FILE_OPTIONS_INIT;
  opts.count = names.size();
  opts.names = names.empty() ? nullptr : names.data();
  Status st = cairn::tool::to_status(
      client->model_get_file(id, out, opts, [&](const char* phase, uint64_t done, uint64_t total) {
        line.update(cairn::ProgressSnapshot{phase, cairn::ProgressUnit::kBytes, done, total});
      }));
  if (!st.ok()) return fail(st);
  line.finish();
  return 0;
}

// ---- import / export: the format from the file's extension (docs/import-export.md) ----

enum class FileFormat { kSafetensors, kKerasH5, kTorch, kUnknown };

FileFormat format_of(const std::string& file, std::string* ext) {
  auto slash = file.rfind('/');
  auto dot = file.rfind('.');
  std::string e = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : file.substr(dot);
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  *ext = e;
  if (e == ".safetensors") return FileFormat::kSafetensors;
  if (e == ".h5" || e == ".hdf5") return FileFormat::kKerasH5;
  if (e == ".pt" || e == ".pth" || e == ".bin") return FileFormat::kTorch;
  return FileFormat::kUnknown;
}

Status unknown_format(const std::string& file, const std::string& ext, const char* verb) {
  return cairn::invalid_argument(
      "'" + file + "': " + (ext.empty() ? std::string("no file extension") : "unknown extension '" + ext + "'") +
      "; cairn " + verb + " takes .safetensors, .h5/.hdf5 (Keras) or .pt/.pth/.bin (PyTorch)");
}

int cmd_import(const std::string& id, const std::string& file, const std::string& parent, const std::string& meta_text,
               const std::string& durability_text, const ProgressFlags& pf) {
  std::string ext;
  FileFormat fmt = format_of(file, &ext);
  if (fmt == FileFormat::kUnknown) return fail(unknown_format(file, ext, "import"));
  if (fmt == FileFormat::kSafetensors) return cmd_put(id, file, parent, "", meta_text, durability_text, pf, "import");
  auto durability = parse_durability(durability_text);
  if (!durability.ok()) return fail(durability.status());
  json meta = json::object();
  if (!meta_text.empty()) {
    meta = json::parse(meta_text, nullptr, false);
    if (meta.is_discarded() || !meta.is_object()) return fail(cairn::invalid_argument("--meta must be a JSON object"));
  }
  if (fmt == FileFormat::kTorch) {
    std::vector<std::string> args{"import", id, file, "--durability", durability_text};
    if (!parent.empty()) args.insert(args.end(), {"--parent", parent});
    if (!meta_text.empty()) args.insert(args.end(), {"--meta", meta_text});
    if (pf.mode() != cairn::tool::ProgressMode::kOff) args.push_back("--progress");
    auto rc = cairn::tool::run_python_io(args);
    return rc.ok() ? *rc : fail(rc.status());
  }
  if (Status h = cairn::tool::require_hdf5(file); !h.ok()) return fail(h);
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  Status st = cairn::tool::import_keras_h5(*client, id, file, parent, meta, *durability);
  return st.ok() ? 0 : fail(st);
}

int cmd_export(const std::string& id, const std::string& file, const ProgressFlags& pf) {
  std::string ext;
  FileFormat fmt = format_of(file, &ext);
  if (fmt == FileFormat::kUnknown) return fail(unknown_format(file, ext, "export"));
  if (fmt == FileFormat::kSafetensors) return cmd_get(id, file, {}, pf, "export");
  if (fmt == FileFormat::kTorch) {
    std::vector<std::string> args{"export", id, file};
    if (pf.mode() != cairn::tool::ProgressMode::kOff) args.push_back("--progress");
    auto rc = cairn::tool::run_python_io(args);
    return rc.ok() ? *rc : fail(rc.status());
  }
  if (Status h = cairn::tool::require_hdf5(file); !h.ok()) return fail(h);
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  Status st = cairn::tool::export_keras_h5(*client, id, file);
  return st.ok() ? 0 : fail(st);
}

// ---- catalog commands ----

int cmd_ls(bool as_json, bool all) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  auto r = cairn::tool::request(*client, json{{"op", "list"}, {"all", all}});
  if (!r.ok()) return fail(r.status());
  const json& models = (*r)["models"];
  if (as_json) {
    std::cout << models.dump(2) << "\n";
    return 0;
  }
  for (const auto& m : models) {
    std::string parent = m["parent"].is_string() ? m["parent"].get<std::string>() : "-";
    const char* state = m.value("collected", false) ? "  collected" : (m.value("retired", false) ? "  retired" : "");
    std::printf("%-32s parent=%-24s tensors=%-5llu %10s  %s%s\n", m["id"].get<std::string>().c_str(), parent.c_str(),
                static_cast<unsigned long long>(m["tensors"].get<uint64_t>()),
                human_bytes(m["bytes"].get<uint64_t>()).c_str(), m["durability"].get<std::string>().c_str(), state);
  }
  return 0;
}

// Sends a request (a hint and a query through their own calls) and prints the answer (print).
int cmd_simple(const json& request, bool print) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  const std::string op = request.value("op", "");
  auto r = op == "hint"    ? cairn::tool::hint(*client, request["hint"])
           : op == "query" ? cairn::tool::query(*client, request["query"])
                           : cairn::tool::request(*client, request);
  if (!r.ok()) return fail(r.status());
  if (print) std::cout << r->dump(2) << "\n";
  return 0;
}

// `cairn du [ID...]`: what each model costs in the repository on its own (the chunks none of its
// ancestors has) and with its ancestors, after deduplication and coding. No ID: every live model.
int cmd_du(std::vector<std::string> ids, bool as_json) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  if (ids.empty()) {
    auto r = cairn::tool::request(*client, json{{"op", "list"}});
    if (!r.ok()) return fail(r.status());
    for (const json& m : (*r)["models"]) ids.push_back(m["id"].get<std::string>());
  }
  json rows = json::array();
  for (const std::string& id : ids) {
    auto r = cairn::tool::request(*client, json{{"op", "show"}, {"id", id}});
    if (!r.ok()) return fail(r.status());
    json row{{"id", id}, {"logical_bytes", (*r)["logical_bytes"]}};
    if (r->contains("storage")) row["storage"] = (*r)["storage"];
    rows.push_back(std::move(row));
  }
  if (as_json) {
    std::cout << json{{"models", rows}}.dump(2) << "\n";
    return 0;
  }
  cairn::tool::print_du(rows);
  return 0;
}

// s with Graphviz's escapes ('"' and '\\'), newlines as spaces, for inside a quoted ID.
std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

// Quotes s as a Graphviz ID.
std::string dot_id(const std::string& s) { return "\"" + dot_escape(s) + "\""; }

// The lineage tree that holds id, as a Graphviz digraph: one node per model, labelled with its id
// and (on a second line) its score when it has one, retired models dashed, id highlighted.
cairn::Result<std::string> lineage_dot(const std::string& id) {
  auto client = connect();
  if (!client.ok()) return client.status();
  auto t = cairn::tool::query(*client, json{{"op", "tree"}, {"model", id}});
  if (!t.ok()) return t.status();
  std::string out = "digraph lineage {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  for (const auto& n : (*t)["tree"]) {
    std::string nid = n["id"].get<std::string>();
    std::string label = "\"" + dot_escape(nid);
    if (n["score"].is_number()) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "\\nscore %.4g", n["score"].get<double>());  // \n: Graphviz's line break
      label += buf;
    }
    std::string attrs = "label=" + label + "\"";
    if (n["retired"].get<bool>()) attrs += ", style=dashed, fontcolor=gray40";
    if (nid == id) attrs += ", style=\"filled,bold\", fillcolor=lightyellow";
    out += "  " + dot_id(nid) + " [" + attrs + "];\n";
    if (n["parent"].is_string()) out += "  " + dot_id(n["parent"].get<std::string>()) + " -> " + dot_id(nid) + ";\n";
  }
  out += "}\n";
  return out;
}

// `cairn lineage ID --dot` prints the tree as Graphviz (`| dot -Tpng > run.png`); with a picture
// file (--svg FILE or --png FILE) it is drawn there with Graphviz's library.
int cmd_lineage_picture(const std::string& id, const std::string& format, const std::string& file) {
  auto dot = lineage_dot(id);
  if (!dot.ok()) return fail(dot.status());
  if (format.empty()) {
    std::fputs(dot->c_str(), stdout);
    return 0;
  }
  Status st = cairn::tool::render_dot(*dot, format, file);
  if (!st.ok()) return fail(st);
  return 0;
}

int cmd_match(const std::string& path, const std::string& where_text) {
  auto graph = read_json_file(path, "graph file");
  if (!graph.ok()) return fail(graph.status());
  json q{{"op", "best_ancestor"}, {"graph", *graph}};
  if (!where_text.empty()) {
    json w = json::parse(where_text, nullptr, false);
    if (w.is_discarded() || !w.is_object()) return fail(cairn::invalid_argument("--where is not a JSON object"));
    q["where"] = w;
  }
  return cmd_simple(json{{"op", "query"}, {"query", q}}, true);
}

int cmd_gc(const ProgressFlags& pf) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  cairn::tool::ProgressLine line("gc", pf.mode(), stderr);
  auto r = call_with_progress(*client, json{{"op", "gc"}}, line);
  if (!r.ok()) return fail(r.status());
  line.finish("gc: done in " + cairn::tool::human_duration(line.elapsed()));
  std::printf(
      "gc: removed %zu retired models, collected %zu (kept for their descendants' lineage); released %s, "
      "deleted %llu packs, punched %s out of packs still in use",
      (*r)["removed"].size(), (*r)["collected"].size(), human_bytes((*r)["bytes_released"].get<uint64_t>()).c_str(),
      static_cast<unsigned long long>((*r)["packs_deleted"].get<uint64_t>()),
      human_bytes((*r)["bytes_punched"].get<uint64_t>()).c_str());
  if (uint64_t u = (*r)["bytes_unreclaimable"].get<uint64_t>())
    std::printf("; %s stay allocated (the filesystem cannot punch holes)", human_bytes(u).c_str());
  std::printf("\n");
  return 0;
}

int cmd_fsck(bool quick, bool as_json, const ProgressFlags& pf) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  cairn::tool::ProgressLine line("fsck", pf.mode(), stderr);
  auto r = call_with_progress(*client, json{{"op", "fsck"}, {"verify", !quick}}, line);
  if (!r.ok()) return fail(r.status());
  line.finish("fsck: " + std::to_string((*r)["chunks"].get<uint64_t>()) + " chunk references, " +
              cairn::tool::human_bytes((*r)["bytes_verified"].get<uint64_t>()) + " verified in " +
              cairn::tool::human_duration(line.elapsed()));
  r->erase("status");
  if (as_json) {
    std::cout << r->dump(2) << "\n";
  } else {
    std::printf("fsck: %llu models, %llu chunk references, %s verified\n",
                static_cast<unsigned long long>((*r)["models"].get<uint64_t>()),
                static_cast<unsigned long long>((*r)["chunks"].get<uint64_t>()),
                human_bytes((*r)["bytes_verified"].get<uint64_t>()).c_str());
    for (const auto& p : (*r)["dangling"])
      std::printf("dangling: model %s tensor %s: %s\n", p["model"].get<std::string>().c_str(),
                  p["tensor"].get<std::string>().c_str(), p["detail"].get<std::string>().c_str());
    for (const auto& p : (*r)["orphaned"])
      std::printf("orphaned: pack %s [%llu, +%llu): %s\n", p["pack"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(p["offset"].get<uint64_t>()),
                  static_cast<unsigned long long>(p["length"].get<uint64_t>()), p["detail"].get<std::string>().c_str());
    if (!(*r)["orphaned"].empty())
      std::printf("%s orphaned (run `cairn gc` to reclaim)\n",
                  human_bytes((*r)["orphaned_bytes"].get<uint64_t>()).c_str());
  }
  return (*r)["ok"].get<bool>() ? 0 : 2;
}

int cmd_lineage(const std::string& id, bool as_json) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  auto a = cairn::tool::query(*client, json{{"op", "ancestors"}, {"model", id}});
  if (!a.ok()) return fail(a.status());
  auto d = cairn::tool::query(*client, json{{"op", "descendants"}, {"model", id}});
  if (!d.ok()) return fail(d.status());
  if (as_json) {
    std::cout << json{{"model", id}, {"ancestors", (*a)["ancestors"]}, {"descendants", (*d)["descendants"]}}.dump(2)
              << "\n";
    return 0;
  }
  std::printf("model:       %s\nancestors:  ", id.c_str());
  for (const auto& x : (*a)["ancestors"]) std::printf(" %s", x.get<std::string>().c_str());
  std::printf("\ndescendants:");
  for (const auto& x : (*d)["descendants"]) std::printf(" %s", x.get<std::string>().c_str());
  std::printf("\n");
  return 0;
}

int cmd_stats(bool as_json) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  auto r = cairn::tool::request(*client, json{{"op", "stats"}});
  if (!r.ok()) return fail(r.status());
  r->erase("status");
  if (as_json) {
    std::cout << r->dump(2) << "\n";
    return 0;
  }
  cairn::tool::print_stats(*r);
  return 0;
}

int cmd_flush(double timeout_s, const ProgressFlags& pf) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  json req{{"op", "flush"}};
  if (timeout_s >= 0) req["timeout_ms"] = static_cast<int64_t>(timeout_s * 1000);
  cairn::tool::ProgressLine line("flush", pf.mode(), stderr);
  auto r = call_with_progress(*client, req, line);
  if (!r.ok()) return fail(r.status());
  line.finish("flush: " + std::to_string((*r)["flushed_models"].get<uint64_t>()) + " models in " +
              cairn::tool::human_duration(line.elapsed()));
  std::printf("flush: %llu models written to the repository in %.2f s; nothing dirty left\n",
              static_cast<unsigned long long>((*r)["flushed_models"].get<uint64_t>()), (*r)["seconds"].get<double>());
  return 0;
}

int cmd_sync(const ProgressFlags& pf) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  cairn::tool::ProgressLine line("sync", pf.mode(), stderr);
  auto r = call_with_progress(*client, json{{"op", "sync"}}, line);
  if (!r.ok()) return fail(r.status());
  line.finish("sync: " + std::to_string((*r)["added"].get<uint64_t>()) + " models added in " +
              cairn::tool::human_duration(line.elapsed()));
  std::printf("sync: %llu models from other daemons, %llu removed, %llu retired; %llu models in the repository\n",
              static_cast<unsigned long long>((*r)["added"].get<uint64_t>()),
              static_cast<unsigned long long>((*r)["removed"].get<uint64_t>()),
              static_cast<unsigned long long>((*r)["retired"].get<uint64_t>()),
              static_cast<unsigned long long>((*r)["models"].get<uint64_t>()));
  return 0;
}

// `cairn peers`: the job's peer group as this node's daemon sees it.
int cmd_peers(bool as_json) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  auto r = cairn::tool::request(*client, json{{"op", "peers"}});
  if (!r.ok()) return fail(r.status());
  if (as_json) {
    std::printf("%s\n", r->dump(2).c_str());
    return 0;
  }
  if (!r->value("enabled", false)) {
    std::printf("peers: none (this daemon is not in a peer group: peers.job is empty and no batch job id is set)\n");
    return 0;
  }
  std::printf("job %s, %zu members (provider %s, rendezvous %s)\n", r->value("job", "").c_str(), (*r)["members"].size(),
              r->value("provider", "").c_str(), r->value("rendezvous", "").c_str());
  std::printf("  %-18s %-10s %-16s %8s %12s %12s\n", "member", "state", "host", "pid", "sent", "received");
  for (const json& m : (*r)["members"])
    std::printf("  %-18s %-10s %-16s %8lld %12s %12s\n", m.value("id", "").c_str(), m.value("state", "").c_str(),
                m.value("host", "").c_str(), static_cast<long long>(m.value("pid", int64_t{0})),
                human_bytes(m.value("bytes_sent", uint64_t{0})).c_str(),
                human_bytes(m.value("bytes_received", uint64_t{0})).c_str());
  std::printf("chunks fetched from peers %llu (%s), served %llu (%s); %llu corrupt bodies dropped, %llu timeouts\n",
              static_cast<unsigned long long>(r->value("fetched_chunks", uint64_t{0})),
              human_bytes(r->value("fetched_bytes", uint64_t{0})).c_str(),
              static_cast<unsigned long long>(r->value("served_chunks", uint64_t{0})),
              human_bytes(r->value("served_bytes", uint64_t{0})).c_str(),
              static_cast<unsigned long long>(r->value("bad_bodies", uint64_t{0})),
              static_cast<unsigned long long>(r->value("timeouts", uint64_t{0})));
  return 0;
}

// `cairn prefetch ID [--all] [--json]`: into this daemon's DRAM; with --all, into every member's of
// the job's peer group at once. Exit 1 when a member failed.
int cmd_prefetch(const std::string& id, bool all, bool as_json, const std::string& tier, int device,
                 const ProgressFlags& pf) {
  auto client = connect();
  if (!client.ok()) return fail(client.status());
  if (!tier.empty() && tier != "dram" && tier != "hbm")
    return fail(cairn::invalid_argument("prefetch --tier " + tier +
                                        ": cairn prefetches into dram or hbm (the burst buffer is filled by commits "
                                        "at durability local and by DRAM evictions)"));
  cairn_prefetch_options opts = CAIRN_PREFETCH_OPTIONS_INIT;
  opts.all = all ? 1 : 0;
  if (tier == "hbm") {  // into the GPU tier (docs/gpu.md)
    opts.kind = CAIRN_MEM_CUDA;
    opts.device = device >= 0 ? device : CAIRN_DEVICE_DEFAULT;
  }
  cairn::tool::ProgressLine line("prefetch " + id, pf.mode(), stderr);
  cairn::tool::DaemonProgress watch(line);
  const std::string progress_id = watch.token();
  opts.progress_id = progress_id.empty() ? nullptr : progress_id.c_str();
  watch.start();
  auto r = cairn::tool::parse_reply(client->model_prefetch(id, opts), "the prefetch");
  watch.stop();
  if (!r.ok()) return fail(r.status());
  line.finish("prefetch " + id + ": " + cairn::tool::human_bytes(r->value("bytes", uint64_t{0})) + " in " +
              cairn::tool::human_duration(line.elapsed()));
  if (as_json) std::printf("%s\n", r->dump(2).c_str());
  if (!as_json && tier == "hbm")
    std::printf("%s: %s in HBM on device %d\n", id.c_str(), human_bytes(r->value("bytes", uint64_t{0})).c_str(),
                r->value("device", 0));
  if (!all) return 0;
  bool ok = true;
  if (!as_json) {
    if (!r->value("peers", false))
      std::printf("%s: %s in this daemon's DRAM (no peer group: nobody else to ask)\n", id.c_str(),
                  human_bytes(r->value("bytes", uint64_t{0})).c_str());
    else
      std::printf("%s: %s in DRAM here (%.3f s) and on %zu other members (%.3f s in all)\n", id.c_str(),
                  human_bytes(r->value("bytes", uint64_t{0})).c_str(), r->value("seconds", 0.0), (*r)["members"].size(),
                  r->value("all_seconds", 0.0));
  }
  for (const json& m : r->value("members", json::array())) {
    const bool mok = m.value("ok", false);
    ok = ok && mok;
    if (as_json) continue;
    if (mok)
      std::printf("  %-18s ok     %10s  %.3f s\n", m.value("member", "").c_str(),
                  human_bytes(m.value("bytes", uint64_t{0})).c_str(), m.value("seconds", 0.0));
    else
      std::printf("  %-18s FAILED %s\n", m.value("member", "").c_str(), m.value("error", "").c_str());
  }
  return ok ? 0 : 1;
}

// `cairn migrate DIR`: opens the repository directly (no daemon), which migrates a version-1
// repository, and compacts it.
int cmd_migrate(const std::string& dir, const ProgressFlags& pf) {
  // Opening migrates, compacting folds the logs: neither counts its work, so the line shows the
  // step and the time it has taken.
  cairn::tool::ProgressLine line("migrate " + dir, pf.mode(), stderr);
  line.update(cairn::ProgressSnapshot{"opening and migrating", cairn::ProgressUnit::kItems, 0, 0});
  auto repo = cairn::Repository::open(dir, cairn::kDefaultChunkSize);
  if (!repo.ok()) return fail(repo.status());
  line.update(cairn::ProgressSnapshot{"compacting", cairn::ProgressUnit::kItems, 0, 0});
  auto c = (*repo)->compact();
  if (!c.ok()) return fail(c.status());
  line.finish("migrate " + dir + ": done in " + cairn::tool::human_duration(line.elapsed()));
  auto st = (*repo)->stats();
  std::printf("%s: repository format 3, %llu models, %llu files\n", dir.c_str(),
              static_cast<unsigned long long>(st.models), static_cast<unsigned long long>(st.files));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairn — the model cache's command-line tool (talks to the node's cairnd; CAIRN_SOCKET selects it)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("cairn ") + cairn::version_string(), "print the version and exit");
  int rc = 0;

  std::string id, file, parent, arch, meta, durability = "global", out;
  std::vector<std::string> tensors;
  bool as_json = false;

  auto* put = app.add_subcommand("put", "store a model from a safetensors file");
  put->add_option("ID", id, "model id")->required();
  put->add_option("FILE", file, "safetensors file")->required();
  put->add_option("--parent", parent, "the model this one was derived from");
  put->add_option("--arch", arch, "architecture graph (JSON file)");
  put->add_option("--meta", meta, "metadata (a JSON object)");
  put->add_option("--durability", durability, "memory, local or global (default: global)");
  ProgressFlags pf;
  add_progress_flags(put, pf);
  put->callback([&] { rc = cmd_put(id, file, parent, arch, meta, durability, pf); });

  auto* get = app.add_subcommand("get", "write a model, or some of its tensors, to a safetensors file");
  get->add_option("ID", id, "model id")->required();
  get->add_option("-o,--output", out, "output file")->required();
  get->add_option("--tensor", tensors, "only this tensor (repeatable)");
  add_progress_flags(get, pf);
  get->callback([&] { rc = cmd_get(id, out, tensors, pf); });

  auto* import = app.add_subcommand("import", "store a model from a .safetensors, Keras .h5 or PyTorch .pt/.bin file");
  import->add_option("ID", id, "model id")->required();
  import->add_option("FILE", file, "the file; its extension says the format")->required();
  import->add_option("--parent", parent, "the model this one was derived from");
  import->add_option("--meta", meta, "metadata (a JSON object)");
  import->add_option("--durability", durability, "memory, local or global (default: global)");
  add_progress_flags(import, pf);
  import->callback([&] { rc = cmd_import(id, file, parent, meta, durability, pf);
});

auto* exp = app.add_subcommand("export", "write a model as a .safetensors, Keras .h5 or PyTorch .pt/.bin file");
exp->add_option("ID", id, "model id")->required();
exp->add_option("FILE", file, "the file; its extension says the format")->required();
add_progress_flags(exp, pf);
exp->callback([&] { rc = cmd_export(id, file, pf); });

bool all = false, dot = false, quick = false;
auto* ls = app.add_subcommand("ls", "list models");
ls->add_flag("--json", as_json, "print JSON");
ls->add_flag("--all", all, "include retired models");
ls->callback([&] { rc = cmd_ls(as_json, all); });

auto* show = app.add_subcommand("show", "describe a model (JSON)");
show->add_option("ID", id, "model id")->required();
show->callback([&] { rc = cmd_simple(json{{"op", "show"}, {"id", id}}, true); });

auto* lineage = app.add_subcommand("lineage", "ancestors and descendants of a model");
lineage->add_option("ID", id, "model id")->required();
lineage->add_flag("--json", as_json, "print JSON");
lineage->add_flag("--dot", dot, "print the whole lineage tree as Graphviz (dot -Tpng)");
std::string svg, png;
lineage->add_option("--svg", svg, "draw the whole lineage tree into this SVG file (scores on the nodes)");
lineage->add_option("--png", png, "draw the whole lineage tree into this PNG file");
lineage->callback([&] {
  if (int(dot) + int(!svg.empty()) + int(!png.empty()) > 1) {
    rc = fail(cairn::invalid_argument("--dot, --svg and --png are one picture each: give one"));
  } else if (dot || !svg.empty() || !png.empty()) {
    rc = cmd_lineage_picture(id, dot ? "" : !svg.empty() ? "svg" : "png", !svg.empty() ? svg : png);
  } else {
    rc = cmd_lineage(id, as_json);
  }
});

std::string where;
auto* match = app.add_subcommand("match", "the stored model sharing the most layers with a graph (JSON)");
match->add_option("GRAPH", file, "architecture graph (JSON file)")->required();
match->add_option("--where", where, "metadata filter, e.g. '{\"score\": {\">=\": 0.9}}'");
match->callback([&] { rc = cmd_match(file, where); });

std::vector<std::string> du_ids;
auto* du = app.add_subcommand("du",
                              "what models cost in the repository: alone and with their ancestors, after "
                              "deduplication and coding");
du->add_option("ID", du_ids, "model ids (default: every live model)");
du->add_flag("--json", as_json, "print JSON");
du->callback([&] { rc = cmd_du(du_ids, as_json); });

auto* stats = app.add_subcommand("stats", "per-tier and repository statistics");
stats->add_flag("--json", as_json, "print JSON");
stats->callback([&] { rc = cmd_stats(as_json); });

auto* rm = app.add_subcommand("rm", "retire a model (its bytes are reclaimed by `cairn gc`)");
rm->add_option("ID", id, "model id")->required();
rm->callback([&] { rc = cmd_simple(json{{"op", "remove"}, {"id", id}}, false); });

double flush_timeout = -1;
auto* flush = app.add_subcommand("flush", "wait until every acknowledged model is in the repository");
flush->add_option("--timeout", flush_timeout, "give up after this many seconds (exit status non-zero)");
add_progress_flags(flush, pf);
flush->callback([&] { rc = cmd_flush(flush_timeout, pf); });

auto* sync = app.add_subcommand("sync", "see now what other daemons published to the shared repository");
add_progress_flags(sync, pf);
sync->callback([&] { rc = cmd_sync(pf); });

auto* peers =
    app.add_subcommand("peers", "list the members of this job's peer group and the bytes exchanged with each");
peers->add_flag("--json", as_json, "print JSON");
peers->callback([&] { rc = cmd_peers(as_json); });

std::string repo_dir;
auto* migrate = app.add_subcommand("migrate",
                                   "migrate a repository of an older format (1: cairn 0.1, a file per model; 2: no "
                                   "coded chunks) to format 3, in place");
migrate->add_option("DIR", repo_dir, "repository directory")->required();
add_progress_flags(migrate, pf);
migrate->callback([&] { rc = cmd_migrate(repo_dir, pf); });

auto* gc = app.add_subcommand("gc", "reclaim what only retired models use");
add_progress_flags(gc, pf);
gc->callback([&] { rc = cmd_gc(pf); });

auto* fsck = app.add_subcommand("fsck", "check every chunk reference; report dangling and orphaned data");
fsck->add_flag("--quick", quick, "check locations only, do not read and verify the bytes");
fsck->add_flag("--json", as_json, "print JSON");
add_progress_flags(fsck, pf);
fsck->callback([&] { rc = cmd_fsck(quick, as_json, pf); });

auto* prefetch = app.add_subcommand("prefetch", "bring a model into DRAM ahead of need");
bool prefetch_all = false;
prefetch->add_option("ID", id, "model id")->required();
prefetch->add_flag("--all", prefetch_all, "into the DRAM of every member of the job's peer group at once");
prefetch->add_flag("--json", as_json, "print JSON");
std::string prefetch_tier;
int prefetch_device = -1;
prefetch->add_option("--tier", prefetch_tier, "dram (default) or hbm: the daemon's GPU tier (docs/gpu.md)")
    ->check(CLI::IsMember({"dram", "hbm", "nvme"}));
prefetch->add_option("--device", prefetch_device, "with --tier hbm: the device (default: the daemon's first)");
add_progress_flags(prefetch, pf);
prefetch->callback([&] { rc = cmd_prefetch(id, prefetch_all, as_json, prefetch_tier, prefetch_device, pf); });

// cairn hint KIND MODEL... [--tensor NAME]... [--when SECONDS|next] [--ahead K] [--tier dram|hbm]
//            [--score S]... [--tournament K]
std::string hint_kind, hint_when, hint_tier;
std::vector<std::string> hint_models, hint_tensors;
std::vector<double> hint_scores;
unsigned hint_ahead = 0, hint_tournament = 0;
auto* hint = app.add_subcommand("hint", "tell the daemon what the workflow will read (docs/policy.md)");
hint->add_option("KIND", hint_kind, "will_load, population, sequence or done")->required();
hint->add_option("MODEL", hint_models, "model ids (in order, for sequence)")->required();
hint->add_option("--tensor", hint_tensors, "will_load: only these tensors");
hint->add_option("--when", hint_when, "will_load: seconds from now, or next");
hint->add_option("--ahead", hint_ahead, "sequence: models to stage ahead of the reader");
hint->add_option("--tier", hint_tier, "will_load: hbm stages into the GPU tier too (docs/gpu.md)")
    ->check(CLI::IsMember({"dram", "hbm"}));
hint->add_option("--score", hint_scores, "population: each model's score, in the models' order (higher is better)");
hint->add_option("--tournament", hint_tournament, "population: how many members a parent is drawn from");
hint->callback([&] {
  json h{{"kind", hint_kind}, {"models", hint_models}};
  if (!hint_scores.empty()) h["scores"] = hint_scores;
  if (hint_tournament) h["tournament"] = hint_tournament;
  if (!hint_tensors.empty()) h["tensors"] = hint_tensors;
  if (hint_ahead) h["ahead"] = hint_ahead;
  if (!hint_tier.empty()) h["tier"] = hint_tier;
  if (!hint_when.empty()) {
    if (hint_when == "next") {
      h["when"] = "next";
    } else {
      char* end = nullptr;
      double secs = std::strtod(hint_when.c_str(), &end);
      if (end == hint_when.c_str() || *end != '\0') {
        rc = fail(cairn::invalid_argument("--when: '" + hint_when + "' is neither seconds nor 'next'"));
        return;
      }
      h["when"] = secs;
    }
  }
  rc = cmd_simple(json{{"op", "hint"}, {"hint", h}}, true);
});

std::string query_text;
auto* query = app.add_subcommand("query", "run a JSON query, e.g. '{\"op\":\"ancestors\",\"model\":\"m3\"}'");
query->add_option("JSON", query_text, "the query")->required();
query->callback([&] {
  json q = json::parse(query_text, nullptr, false);
  if (q.is_discarded() || !q.is_object())
    rc = fail(cairn::invalid_argument("the query is not a JSON object"));
  else
    rc = cmd_simple(json{{"op", "query"}, {"query", q}}, true);
});

cairn::tool::add_job_commands(app, rc);
cairn::tool::add_fault_commands(app, rc);

CLI11_PARSE(app, argc, argv);
return rc;
}
