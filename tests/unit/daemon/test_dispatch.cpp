// The dispatch table against docs/protocol.md: every op the daemon serves is documented, and every
// documented op is served.
#include <catch2/catch.hpp>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "daemon/engine.hpp"

namespace cairn {
namespace {

// The ops docs/protocol.md documents under "## Requests": the first cell of each row of a table
// whose header starts with "| op |", and each "**`name`**" paragraph (commit, wait).
// The name in "`name`" at the start of s (after `prefix`), if it is [a-z_]+; "" otherwise.
std::string op_name_after(const std::string& s, const std::string& prefix) {
  if (s.rfind(prefix, 0) != 0) return "";
  const size_t begin = prefix.size();
  size_t end = begin;
  while (end < s.size() && (std::islower(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
  if (end == begin || end >= s.size() || s[end] != '`') return "";
  return s.substr(begin, end - begin);
}

std::set<std::string> documented_ops(const std::string& markdown) {
  std::set<std::string> ops;
  std::istringstream in(markdown);
  std::string line;
  bool in_requests = false, in_op_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_requests = line == "## Requests";
    if (!in_requests) continue;
    if (line.rfind("| op |", 0) == 0)
      in_op_table = true;
    else if (line.empty() || line[0] != '|')
      in_op_table = false;
    if (in_op_table) {
      std::string name = op_name_after(line, "| `");
      if (!name.empty() && line.compare(3 + name.size(), 3, "` |") == 0) ops.insert(name);
    }
    std::string bold = op_name_after(line, "**`");
    if (!bold.empty() && line.compare(3 + bold.size(), 3, "`**") == 0) ops.insert(bold);
  }
  return ops;
}

}  // namespace

TEST_CASE("dispatch: every op is documented in docs/protocol.md and every documented op has a handler",
          "[engine][dispatch]") {
  std::ifstream f(std::string(CAIRN_SOURCE_DIR) + "/docs/protocol.md");
  REQUIRE(f.good());
  std::stringstream text;
  text << f.rdbuf();
  const std::set<std::string> documented = documented_ops(text.str());
  const std::vector<std::string> served_list = Engine::ops();
  const std::set<std::string> served(served_list.begin(), served_list.end());
  REQUIRE(served.size() == served_list.size());  // no op twice in the table
  for (const auto& op : served) {
    INFO("op '" << op << "' has a handler but no row in docs/protocol.md");
    CHECK(documented.count(op) == 1);
  }
  for (const auto& op : documented) {
    INFO("op '" << op << "' is documented in docs/protocol.md but has no handler");
    CHECK(served.count(op) == 1);
  }
  // The parser itself: the table rows and the bold paragraphs are both seen.
  CHECK(documented.count("hello") == 1);
  CHECK(documented.count("commit") == 1);
  CHECK(documented.count("wait") == 1);
  CHECK(documented.count("release") == 1);
  CHECK(documented.count("id") == 0);  // a field table's row is not an op
}

TEST_CASE("dispatch: the parser of the docs finds ops only in op tables of the Requests section", "[dispatch]") {
  const std::string md =
      "# x\n## Frames\n| op | a |\n|---|---|\n| `not_here` | x |\n## Requests\n### A\n\n| op | f |\n|---|---|\n"
      "| `alpha` | x |\n| `beta` | y |\n\ntext\n| `gamma` | stray row outside a table |\n\n"
      "**`delta`** — a paragraph.\n\n| request field | default |\n|---|---|\n| `id` | required |\n## Status codes\n"
      "| op | z |\n|---|---|\n| `omega` | z |\n";
  CHECK(documented_ops(md) == std::set<std::string>{"alpha", "beta", "delta"});
}

}  // namespace cairn
