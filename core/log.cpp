#include "core/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <mutex>

namespace cairn {

Status init_logging(const std::string& level, const std::string& file) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    return invalid_argument("log.level: '" + level + "' is not one of trace, debug, info, warn, error, off");
  try {
    std::shared_ptr<spdlog::logger> logger;
    if (file.empty())
      logger = spdlog::stderr_logger_mt("cairn");
    else
      logger = spdlog::basic_logger_mt("cairn", file);
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ cairnd[%P] %v");
    // Warnings and errors reach the file at once: they are what an operator reads after a crash.
    logger->flush_on(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  } catch (const spdlog::spdlog_ex& e) {
    return io_error(std::string("log.file: cannot open '") + file + "': " + e.what());
  }
  spdlog::set_level(lvl);
  return Status::OK();
}

void log_to_stderr_by_default() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto current = spdlog::default_logger();
    if (current && current->name() == "cairn") return;  // init_logging chose already
    // Unnamed, as spdlog's own default: init_logging may still register "cairn" later.
    auto logger = std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_level(current ? current->level() : spdlog::level::info);
    spdlog::set_default_logger(logger);
  });
}

}  // namespace cairn
