// Logging: spdlog, configured once by the host process (cairnd, the tool) from the `log` config.
// Library code logs through CAIRN_LOG_* so that a client library never prints unless asked.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "core/status.hpp"

namespace cairn {

// Sets the default logger's level ("trace".."off") and destination ("" = stderr).
Status init_logging(const std::string& level, const std::string& file);

// In a process that did not call init_logging (a program embedding the engine or a repository,
// a benchmark, a test), log to stderr instead of spdlog's default stdout: a program's standard
// output is its own (JSON a caller parses, for one). Called by Engine::create and Repository::open.
void log_to_stderr_by_default();

}  // namespace cairn

#define CAIRN_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define CAIRN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define CAIRN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define CAIRN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
