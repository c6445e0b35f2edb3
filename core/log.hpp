// Logging: spdlog, configured once by the host process (cairnd, the tool) from the `log` config.
// Library code logs through CAIRN_LOG_* so that a client library never prints unless asked.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

#include "core/status.hpp"

namespace cairn {

// Sets the default logger's level ("trace".."off") and destination ("" = stderr).
Status init_logging(const std::string& level, const std::string& file);

}  // namespace cairn

#define CAIRN_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define CAIRN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define CAIRN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define CAIRN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
