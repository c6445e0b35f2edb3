// libFuzzer target for the files of the job lifecycle that cairn reads back: the job summary
// (tools/job_summary.cpp, read by `cairn job summary`) and the node settings state
// (tools/job_node.cpp, read by the prolog and epilog as root). Any bytes must give a value or a
// kInvalidArgument Status naming the file, never a crash or an escaping exception; a summary that
// parses writes back as text that parses to the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/job_node.hpp"
#include "tools/job_summary.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto s = cairn::tool::parse_job_summary(text, "fuzz.json");
  if (!s.ok()) {
    if (s.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    if (s.status().message().find("fuzz.json") == std::string::npos) std::abort();
  } else {
    const std::string again = cairn::tool::summary_to_json(*s);
    auto back = cairn::tool::parse_job_summary(again, "again");
    if (!back.ok() || cairn::tool::summary_to_json(*back) != again) std::abort();
    (void)cairn::tool::summary_table(*s);
    (void)cairn::tool::summary_line(*s);
  }
  auto n = cairn::tool::parse_node_state(text, "state.json");
  if (!n.ok()) {
    if (n.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    if (n.status().message().find("state.json") == std::string::npos) std::abort();
  } else if (!cairn::tool::parse_node_state(cairn::tool::node_state_to_json(*n), "again").ok()) {
    std::abort();
  }
  return 0;
}
