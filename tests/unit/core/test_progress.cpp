#include <catch2/catch.hpp>

#include "core/progress.hpp"

using cairn::OperationProgress;
using cairn::ProgressSnapshot;
using cairn::ProgressUnit;
using cairn::StatusCode;
using nlohmann::json;

TEST_CASE("a progress snapshot round-trips through its wire form", "[core][progress]") {
  ProgressSnapshot s{"verifying chunks", ProgressUnit::kBytes, 12, 34};
  json j = cairn::progress_to_json(s);
  CHECK(j == json{{"phase", "verifying chunks"}, {"unit", "bytes"}, {"done", 12}, {"total", 34}});
  auto back = cairn::progress_from_json(j);
  REQUIRE(back.ok());
  CHECK(*back == s);
}

TEST_CASE("the progress decoder refuses anything but its four typed fields", "[core][progress]") {
  const json good{{"phase", "p"}, {"unit", "items"}, {"done", 1}, {"total", 2}};
  auto refused = [](const json& j, const std::string& names) {
    auto r = cairn::progress_from_json(j);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kProtocol);
    CHECK(r.status().message().find(names) != std::string::npos);
  };
  refused(json::array(), "not a JSON object");
  json extra = good;
  extra["more"] = 1;
  refused(extra, "exactly the fields");
  json j = good;
  j["unit"] = "chunks";
  refused(j, "'unit'");
  j = good;
  j["done"] = -1;
  refused(j, "'done'");
  j = good;
  j["total"] = 2.5;
  refused(j, "'total'");
  j = good;
  j["phase"] = std::string(257, 'x');
  refused(j, "'phase'");
  j = good;
  j.erase("phase");
  j["phases"] = "p";
  refused(j, "'phase'");
}

TEST_CASE("an operation's progress restarts with each phase", "[core][progress]") {
  OperationProgress p;
  p.begin_phase("one", ProgressUnit::kItems, 3);
  p.add(2);
  CHECK(p.snapshot() == ProgressSnapshot{"one", ProgressUnit::kItems, 2, 3});
  p.begin_phase("two", ProgressUnit::kBytes, 100);
  p.add(10);
  p.add(5);
  CHECK(p.snapshot() == ProgressSnapshot{"two", ProgressUnit::kBytes, 15, 100});
}
