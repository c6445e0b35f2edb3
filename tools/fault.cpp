#include "tools/fault.hpp"

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/public_client.hpp"

namespace cairn::tool {
namespace {

using nlohmann::json;

// Sends one `fault` request; prints the reply as JSON (as_json) or through `print`.
int fault_request(json req, bool as_json, void (*print)(const json&)) {
  auto client = connect();
  if (!client.ok()) {
    std::fprintf(stderr, "cairn: %s\n", client.status().to_string().c_str());
    return 1;
  }
  req["op"] = "fault";
  auto r = request(*client, req);
  if (!r.ok()) {
    std::fprintf(stderr, "cairn: %s\n", r.status().to_string().c_str());
    return 1;
  }
  r->erase("status");
  if (as_json)
    std::cout << r->dump(2) << "\n";
  else
    print(*r);
  return 0;
}

std::string describe(const json& rule) {
  std::string s = rule.value("op", std::string()) + " on paths containing '" + rule.value("path", std::string()) +
                  "': " + rule.value("effect", std::string());
  if (rule.value("effect", std::string()) == "fail") s += " with " + rule.value("error", std::string());
  if (rule.contains("delay_ms")) s += " " + std::to_string(rule["delay_ms"].get<uint64_t>()) + " ms";
  s += ", skip " + std::to_string(rule.value("skip", 0)) + ", times " +
       (rule.value("times", 0) < 0 ? std::string("forever") : std::to_string(rule.value("times", 0)));
  return s;
}

}  // namespace

void add_fault_commands(CLI::App& app, int& rc) {
  auto* fault = app.add_subcommand(
      "fault", "inject filesystem faults into a cairnd started with debug.fault_injection (test harnesses only)");
  fault->require_subcommand(1);

  // Shared by the subcommands' callbacks, which run after parsing.
  struct Args {
    std::string op, path, effect, error;
    int skip = 0, times = 1;
    unsigned delay_ms = 0;
    bool as_json = false;
  };
  auto a = std::make_shared<Args>();

  auto* add =
      fault->add_subcommand("add", "add a rule: matching operations fail, are torn, dropped, flipped or delayed");
  add->add_option("--op", a->op, "open, write, read, sync, allocate, rename or unlink")->required();
  add->add_option("--path", a->path, "only paths containing this (e.g. /packs/, /nvme/data); default: every path");
  add->add_option("--effect", a->effect, "fail (default), short_write, drop_write, flip_bit or delay");
  add->add_option("--error", a->error, "with fail: the errno to inject, e.g. ENOSPC, EIO (default), EDQUOT, EROFS");
  add->add_option("--skip", a->skip, "matching operations to let through first (default 0)");
  add->add_option("--times", a->times, "operations to change, -1 = forever (default 1)");
  add->add_option("--delay-ms", a->delay_ms, "with delay: how long each matching operation waits");
  add->add_flag("--json", a->as_json, "print JSON");
  add->callback([a, &rc] {
    json rule{{"op", a->op}, {"skip", a->skip}, {"times", a->times}};
    if (!a->path.empty()) rule["path"] = a->path;
    if (!a->effect.empty()) rule["effect"] = a->effect;
    if (!a->error.empty()) rule["error"] = a->error;
    if (a->delay_ms) rule["delay_ms"] = a->delay_ms;
    rc = fault_request(json{{"action", "add"}, {"rule", rule}}, a->as_json, [](const json& r) {
      std::printf("fault added: %s (%zu rules)\n", describe(r["added"]).c_str(), r.value("rules", size_t{0}));
    });
  });

  auto* list = fault->add_subcommand("list", "the rules, with how many operations each has changed");
  list->add_flag("--json", a->as_json, "print JSON");
  list->callback([a, &rc] {
    rc = fault_request(json{{"action", "list"}}, a->as_json, [](const json& r) {
      size_t i = 0;
      for (const auto& rule : r["rules"])
        std::printf("%zu. %s; injected %llu\n", ++i, describe(rule).c_str(),
                    static_cast<unsigned long long>(rule.value("injected", uint64_t{0})));
      std::printf("%zu rules; %llu operations changed in all\n", r["rules"].size(),
                  static_cast<unsigned long long>(r.value("injected", uint64_t{0})));
    });
  });

  auto* clear = fault->add_subcommand("clear", "remove every rule (the filesystem behaves again)");
  clear->add_flag("--json", a->as_json, "print JSON");
  clear->callback([a, &rc] {
    rc = fault_request(json{{"action", "clear"}}, a->as_json, [](const json& r) {
      std::printf("cleared %zu rules (%llu operations changed in all)\n", r.value("cleared", size_t{0}),
                  static_cast<unsigned long long>(r.value("injected", uint64_t{0})));
    });
  });
}

}  // namespace cairn::tool
