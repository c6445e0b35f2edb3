// A fresh directory under /tmp for one test, removed with everything in it at scope exit.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace cairn::testing {

struct TempDir {
  std::string path;
  explicit TempDir(const char* tag = "cairn-test") {
    std::string tmpl = std::string("/tmp/") + tag + "-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string repo() const { return path + "/repo"; }
};

}  // namespace cairn::testing
