#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/hash.hpp"
#include "policy/trace.hpp"

using cairn::HintKind;
using cairn::Trace;
using cairn::TraceEvent;
using cairn::TraceEventKind;
using cairn::TraceTier;

namespace {

TraceEvent event(int64_t t, TraceEventKind kind, std::vector<std::string> models, std::string chunk = "",
                 uint64_t bytes = 0, TraceTier tier = TraceTier::kUnknown) {
  TraceEvent e;
  e.time_ns = t;
  e.kind = kind;
  e.models = std::move(models);
  e.chunk = std::move(chunk);
  e.bytes = bytes;
  e.tier = tier;
  return e;
}

TraceEvent hint(int64_t t, HintKind kind, std::vector<std::string> models, std::optional<double> when = std::nullopt) {
  TraceEvent e = event(t, TraceEventKind::kHint, std::move(models));
  e.hint = kind;
  e.when_s = when;
  return e;
}

// A trace of every kind of event, with model ids that need escaping.
Trace sample_trace() {
  const std::string hex = cairn::hash_bytes("x", 1).hex();
  Trace t;
  t.events.push_back(event(0, TraceEventKind::kInsert, {"m0"}, hex, 16 << 20, TraceTier::kDram));
  t.events.push_back(event(5, TraceEventKind::kInherit, {"m1"}, hex, 16 << 20));
  t.events.push_back(event(7, TraceEventKind::kCommit, {"m1"}, "", 16 << 20));
  t.events.push_back(event(10, TraceEventKind::kAccess, {"we,ird;id%\"\n\xc3\xa9"}, "tok.en:1/2+3-_", 0));
  t.events.push_back(event(10, TraceEventKind::kAccess, {"m0"}, hex, 16 << 20, TraceTier::kNvme));
  t.events.push_back(event(11, TraceEventKind::kAccess, {"m0"}, hex, 16 << 20, TraceTier::kRepository));
  t.events.push_back(event(12, TraceEventKind::kAccess, {"m0"}, hex, 16 << 20, TraceTier::kPeer));
  t.events.push_back(hint(20, HintKind::kPopulation, {"m0", "m1", "a;b"}));
  t.events.push_back(hint(21, HintKind::kWillLoad, {"m1"}, 0.1));
  t.events.push_back(hint(22, HintKind::kWillLoad, {"m1"}, 1e-7));
  t.events.push_back(hint(23, HintKind::kWillLoad, {"m1"}));
  t.events.push_back(hint(24, HintKind::kSequence, {"m1", "m0"}));
  t.events.push_back(hint(25, HintKind::kDone, {"m0"}));
  t.events.push_back(hint(25, HintKind::kPopulation, {"m0", "m1"}));
  t.events.push_back(hint(25, HintKind::kParentChance, {"m0"}, 0.75));
  t.events.push_back(hint(25, HintKind::kParentChance, {"m1"}, 0.25));
  TraceEvent scoped = hint(26, HintKind::kWillLoad, {"m1"}, 0.5);  // a will_load scoped to tensors
  scoped.chunk = "c9";
  scoped.bytes = 77;
  t.events.push_back(scoped);
  t.events.push_back(event(30, TraceEventKind::kEvict, {}, hex, 16 << 20, TraceTier::kDram));
  t.events.push_back(
      event(9'000'000'000'000'000'000, TraceEventKind::kEvict, {"m0"}, hex, UINT64_MAX, TraceTier::kNvme));
  return t;
}

const char* kHeader = "#cairn-trace v1\ntime_ns,event,model,chunk,bytes,tier,hint,when_s\n";

// The error for a trace of the header plus `body`.
std::string error_of(const std::string& body) {
  auto r = cairn::parse_trace(kHeader + body, "t.csv");
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == cairn::StatusCode::kInvalidArgument);
  return r.status().message();
}

std::string temp_path(const char* name) { return "/tmp/cairn_test_trace_" + std::to_string(::getpid()) + "_" + name; }

}  // namespace

TEST_CASE("A trace survives format and parse unchanged", "[policy][trace]") {
  const Trace t = sample_trace();
  for (const TraceEvent& e : t.events) REQUIRE(cairn::validate_trace_event(e).ok());
  const std::string text = cairn::format_trace(t);
  INFO(text);
  auto back = cairn::parse_trace(text);
  REQUIRE(back.ok());
  REQUIRE(*back == t);
  REQUIRE(cairn::format_trace(*back) == text);
  // Separators, quotes and newlines in a model id are escaped; the line stays one line.
  REQUIRE(text.find("we%2Cird%3Bid%25%22%0A\xc3\xa9") != std::string::npos);
  REQUIRE(text.find("20,hint,m0;m1;a%3Bb,,,,population,\n") != std::string::npos);
  REQUIRE(text.find("21,hint,m1,,,,will_load,0.1\n") != std::string::npos);
  REQUIRE(text.find("23,hint,m1,,,,will_load,\n") != std::string::npos);
  REQUIRE(text.find("26,hint,m1,c9,77,,will_load,0.5\n") != std::string::npos);
  REQUIRE(text.find("25,hint,m0,,,,parent_chance,0.75\n") != std::string::npos);
}

TEST_CASE("The trace reader takes CRLF, comments, a missing final newline and lower-case escapes", "[policy][trace]") {
  auto r = cairn::parse_trace(
      "#cairn-trace v1\r\ntime_ns,event,model,chunk,bytes,tier,hint,when_s\r\n# recorded by hand\r\n"
      "1,access,m%2c1,c1,10,dram,,\r\n2,access,m2,c2,0,,,");
  REQUIRE(r.ok());
  REQUIRE(r->events.size() == 2);
  REQUIRE(r->events[0].models == std::vector<std::string>{"m,1"});
  REQUIRE(r->events[0].tier == TraceTier::kDram);
  REQUIRE(r->events[1].bytes == 0);
  auto empty = cairn::parse_trace(kHeader);
  REQUIRE(empty.ok());
  REQUIRE(empty->events.empty());
}

TEST_CASE("The trace reader rejects bad lines, naming the line and the field", "[policy][trace]") {
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"1,acces,m,c,1,,,\n", "t.csv:3: event: 'acces' is not one of access, insert, inherit, commit, hint, evict"},
      {"x1,access,m,c,1,,,\n", "t.csv:3: time_ns: 'x1' is not an unsigned decimal integer"},
      {"-5,access,m,c,1,,,\n", "t.csv:3: time_ns: '-5' is not an unsigned decimal integer"},
      {"9223372036854775808,access,m,c,1,,,\n", "t.csv:3: time_ns: '9223372036854775808' is out of range"},
      {"1,access,m,c,12x,,,\n", "t.csv:3: bytes: '12x' is not an unsigned decimal integer"},
      {"1,access,m,c,,,,\n", "t.csv:3: bytes: required, an unsigned decimal integer"},
      {"1,access,m,c,18446744073709551616,,,\n", "t.csv:3: bytes: '18446744073709551616' is out of range"},
      {"1,access,m,,1,,,\n", "t.csv:3: chunk: required for access"},
      {"1,access,m,a b,1,,,\n", "t.csv:3: chunk: 'a b' has a byte outside [A-Za-z0-9._:/+-]"},
      {"1,access,,c,1,,,\n", "t.csv:3: model: required for access"},
      {"1,access,a;b,c,1,,,\n", "t.csv:3: model: one model for access, found 2"},
      {"1,access,m%4,c,1,,,\n", "t.csv:3: model: '%' at byte 1 is not followed by two hex digits"},
      {"1,access,m%zz,c,1,,,\n", "t.csv:3: model: '%' at byte 1 is not followed by two hex digits"},
      {"1,access,\"m\",c,1,,,\n", "t.csv:3: model: byte 0 must be written as %22"},
      {"1,access,m%00,c,1,,,\n", "t.csv:3: model: 'm?' is not a valid model id"},
      {"1,access,%C3%28,c,1,,,\n", "t.csv:3: model: "},
      {"1,access,m,c,1,ssd,,\n", "t.csv:3: tier: 'ssd' is not one of dram, nvme, repository, peer or empty"},
      {"1,access,m,c,1,,done,\n", "t.csv:3: hint: must be empty for access"},
      {"1,access,m,c,1,,,5\n", "t.csv:3: when_s: allowed for will_load and parent_chance hints only"},
      {"1,inherit,m,c,1,dram,,\n", "t.csv:3: tier: must be empty for inherit"},
      {"1,commit,m,c,1,,,\n", "t.csv:3: chunk: must be empty for commit"},
      {"1,commit,m,,,,,\n", "t.csv:3: bytes: required"},
      {"1,evict,m,c,1,,,\n", "t.csv:3: tier: required for evict"},
      {"1,hint,,,,,done,\n", "t.csv:3: model: a hint names one or more models"},
      {"1,hint,m,,,,,\n", "t.csv:3: hint: required for a hint"},
      {"1,hint,m,,,,later,\n",
       "t.csv:3: hint: 'later' is not one of will_load, population, sequence, done, parent_chance or empty"},
      {"1,hint,m,,5,,done,\n", "t.csv:3: bytes: must be empty for a hint without a chunk"},
      {"1,hint,m,c,,,done,\n", "t.csv:3: chunk: allowed on will_load hints only"},
      {"1,hint,m;n,c,5,,will_load,\n", "t.csv:3: chunk: a will_load hint naming a chunk names one model, found 2"},
      {"1,hint,m,c d,5,,will_load,\n", "t.csv:3: chunk: 'c d' has a byte outside [A-Za-z0-9._:/+-]"},
      {"1,hint,m;;n,,,,done,\n", "t.csv:3: model: '' is not a valid model id"},
      {"1,hint,m,,,,population,3\n", "t.csv:3: when_s: allowed for will_load and parent_chance hints only"},
      {"1,hint,m,,,,parent_chance,\n", "t.csv:3: when_s: required for parent_chance: the member's chance"},
      {"1,hint,m,,,,parent_chance,1.5\n", "t.csv:3: when_s: required for parent_chance: the member's chance"},
      {"1,hint,m;n,,,,parent_chance,0.5\n", "t.csv:3: model: a parent_chance hint names one model, found 2"},
      {"1,hint,m,c,5,,parent_chance,0.5\n", "t.csv:3: chunk: allowed on will_load hints only"},
      {"1,hint,m,,,,will_load,inf\n", "t.csv:3: when_s: 'inf' is not a finite number of seconds >= 0"},
      {"1,hint,m,,,,will_load,-1\n", "t.csv:3: when_s: '-1' is not a finite number of seconds >= 0"},
      {"1,hint,m,,,,will_load,1s\n", "t.csv:3: when_s: '1s' is not a finite number"},
      {"1,access,m,c,1,,\n", "t.csv:3: expected 8 fields (time_ns,event,model,chunk,bytes,tier,hint,when_s), found 7"},
      {"1,access,m,c,1,,,,\n", "t.csv:3: expected 8 fields"},
      {"10,access,m,c,1,,,\n5,access,m,c,1,,,\n",
       "t.csv:4: time_ns: 5 is before the previous event's 10 (times must not decrease)"},
      {"# a comment\n1,access,m,c,1,,,\n\n2,access,m,c,1,,,\n", "t.csv:5: line: empty"},
      {"1,access,m,c,1,,,\r\r\n", "t.csv:3: when_s"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const std::string m = error_of(c.body);
    INFO(m);
    REQUIRE(m.rfind(c.message, 0) == 0);
  }
}

TEST_CASE("The trace reader rejects a missing or foreign header", "[policy][trace]") {
  auto message = [](const std::string& text) {
    auto r = cairn::parse_trace(text, "t.csv");
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  REQUIRE(message("") ==
          "t.csv:1: header: missing (a trace starts with '#cairn-trace v1' and "
          "'time_ns,event,model,chunk,bytes,tier,hint,when_s')");
  REQUIRE(message("#cairn-trace v1\n").rfind("t.csv:2: header: missing", 0) == 0);
  REQUIRE(message("#cairn-trace v2\n") ==
          "t.csv:1: header: version 'v2' is not supported (this reader takes #cairn-trace v1)");
  REQUIRE(message("time,event\n").rfind("t.csv:1: header: expected '#cairn-trace v1' as the first line", 0) == 0);
  REQUIRE(message("#cairn-trace v1\ntime_ns,event\n").rfind("t.csv:2: header: expected the columns", 0) == 0);
}

TEST_CASE("validate_trace_event checks what the writer is given", "[policy][trace]") {
  TraceEvent e = event(1, TraceEventKind::kAccess, {"m"}, "c", 1);
  REQUIRE(cairn::validate_trace_event(e).ok());
  e.time_ns = -1;
  REQUIRE(cairn::validate_trace_event(e).message() == "time_ns: must be >= 0");
  e = hint(1, HintKind::kWillLoad, {"m"}, -2.0);
  REQUIRE(cairn::validate_trace_event(e).message() == "when_s: must be a finite number of seconds >= 0");
  e = hint(1, HintKind::kDone, {std::string(1025, 'x')});
  REQUIRE(cairn::validate_trace_event(e).message().rfind("model: 'xxxx", 0) == 0);
  e = event(1, TraceEventKind::kAccess, {"m"}, std::string(257, 'c'), 1);
  REQUIRE(cairn::validate_trace_event(e).message() == "chunk: longer than 256 bytes");
}

TEST_CASE("TraceWriter appends whole lines from many threads, in non-decreasing time", "[policy][trace]") {
  const std::string path = temp_path("writer.csv");
  auto w = cairn::TraceWriter::open(path);
  REQUIRE(w.ok());
  constexpr int kThreads = 4, kEach = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // Stamped out of order on purpose: the writer clamps.
        const int64_t time = (i * kThreads + t) * 1000 - (i % 3) * 5000;
        const cairn::Status s =
            (*w)->append(event(std::max<int64_t>(0, time), TraceEventKind::kAccess, {"m" + std::to_string(t)},
                               "c" + std::to_string(i), 4096, TraceTier::kDram));
        if (!s.ok()) ++failures;  // Catch2 assertions are not thread-safe
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(failures == 0);
  // An invalid event is refused and writes nothing.
  cairn::Status bad = (*w)->append(event(1, TraceEventKind::kAccess, {}, "c", 1));
  REQUIRE(bad.code() == cairn::StatusCode::kInvalidArgument);
  REQUIRE(bad.message() == "model: required for access");
  REQUIRE((*w)->events_written() == kThreads * kEach);
  REQUIRE((*w)->close().ok());
  REQUIRE((*w)->close().ok());
  REQUIRE((*w)->append(event(1, TraceEventKind::kAccess, {"m"}, "c", 1)).code() == cairn::StatusCode::kIo);

  auto back = cairn::read_trace_file(path);
  REQUIRE(back.ok());
  REQUIRE(back->events.size() == kThreads * kEach);
  std::remove(path.c_str());
}

TEST_CASE("TraceWriter and read_trace_file name the path when they fail", "[policy][trace]") {
  auto w = cairn::TraceWriter::open("/nonexistent-dir/x/trace.csv");
  REQUIRE_FALSE(w.ok());
  REQUIRE(w.status().message().find("/nonexistent-dir/x/trace.csv") != std::string::npos);
  auto r = cairn::read_trace_file("/nonexistent-dir/trace.csv");
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == cairn::StatusCode::kIo);
  REQUIRE(r.status().message().find("/nonexistent-dir/trace.csv") != std::string::npos);

  const std::string path = temp_path("bad.csv");
  {
    std::ofstream f(path);
    f << kHeader << "1,access,m,c,1,,,\n2,access,m,c,x,,,\n";
  }
  auto bad = cairn::read_trace_file(path);
  REQUIRE_FALSE(bad.ok());
  REQUIRE(bad.status().message() == path + ":4: bytes: 'x' is not an unsigned decimal integer");
  std::remove(path.c_str());
}
