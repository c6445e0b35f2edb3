// `cairn fault add|list|clear`: filesystem faults injected into a running cairnd started with
// debug.fault_injection (daemon/fault_injection.hpp; docs/config.md, "Fault injection"). For test
// harnesses: ENOSPC, EIO, torn, dropped or bit-flipped writes, flipped reads and delays in the
// repository and the burst buffer, at the moments the harness chooses.
#pragma once

#include <CLI/CLI.hpp>

namespace cairn::tool {

// Adds the `fault` subcommand and its three subcommands to the tool; their exit status goes to rc.
void add_fault_commands(CLI::App& app, int& rc);

}  // namespace cairn::tool
