// cairnd: the per-node daemon. A thin host around the engine: read the config, start the engine
// and the local server, wait for SIGTERM/SIGINT, then stop serving and drain what was acknowledged.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "core/config.hpp"
#include "core/log.hpp"
#include "core/version.hpp"
#include "daemon/engine.hpp"
#include "daemon/server.hpp"

namespace {
int fail(const cairn::Status& s) {
  std::fprintf(stderr, "cairnd: %s\n", s.to_string().c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairnd — the cairn model cache daemon (one per node)"};
  std::string config_path;
  bool print_config = false;
  app.add_option("-c,--config", config_path, "YAML config file (default: the embedded configs/default.yaml)");
  app.add_flag("--print-config", print_config, "print the effective config and exit");
  app.set_version_flag("--version", std::string("cairnd ") + cairn::version_string(), "print the version and exit");
  CLI11_PARSE(app, argc, argv);

  auto config = cairn::load_config(config_path, cairn::process_env());
  if (!config.ok()) return fail(config.status());
  if (print_config) {
    std::cout << config->to_yaml();
    return 0;
  }
  if (auto st = cairn::init_logging(config->log.level, config->log.file); !st.ok()) return fail(st);

  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto engine = cairn::Engine::create(*config);
  if (!engine.ok()) return fail(engine.status());
  std::string socket = cairn::socket_path_for(*config);
  auto server = cairn::Server::start(**engine, socket);
  if (!server.ok()) return fail(server.status());
  auto rs = (*engine)->repository().stats();
  CAIRN_LOG_INFO("serving {} (repository {} with {} models, DRAM arena {} bytes, chunk size {})", socket,
                 config->repository, rs.models, (*engine)->arena_size(), (*engine)->repository().chunk_size());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  CAIRN_LOG_INFO("signal {}: stopping; draining acknowledged writes to the repository", sig);
  (*server)->stop();
  (*engine)->drain();
  server->reset();
  engine->reset();
  CAIRN_LOG_INFO("stopped cleanly");
  return 0;
}
