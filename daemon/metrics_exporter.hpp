// Metrics for the site's monitoring (docs/metrics.md): the daemon's counters, gauges and latency
// histograms, rendered by the engine (Engine::metrics_text) and handed out two ways, either or both:
//   metrics.listen    an HTTP endpoint, GET /metrics (metrics_http.hpp), for Prometheus to scrape;
//   metrics.textfile  a file rewritten every metrics.interval — written beside itself under a
//                     temporary name, then renamed over it, so a reader never sees half a file — for
//                     node_exporter's textfile collector. Removed when the exporter stops.
//
// Owns: the HTTP endpoint and its thread, and the textfile's thread.
//
// Thread-safety: stop() and port() may be called from any thread. `render` is called from the two
// threads, possibly at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/config.hpp"
#include "core/metrics.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"

namespace cairn {

class MetricsHttp;

class MetricsExporter {
 public:
  using Render = std::function<std::string(metrics::Format)>;

  struct Options {
    std::string listen;                         // metrics.listen: HOST:PORT; "" = no endpoint
    std::string textfile;                       // metrics.textfile: "" = no file
    std::chrono::milliseconds interval{15000};  // metrics.interval: how often the file is rewritten
  };

  // Whether the config turns metrics on (metrics.listen or metrics.textfile set).
  static bool enabled(const Config& config);
  // The options of a config; kInvalidArgument naming the key for a malformed address or interval.
  static Result<Options> options_from(const Config& config);

  // Listens (when listen is set) and writes the textfile once (when textfile is set), then starts
  // the threads. Fails naming the key: "metrics.listen: cannot listen on '0.0.0.0:9464': Address
  // already in use (...)", "metrics.textfile: cannot write '/x/cairn.prom': ...".
  static Result<std::unique_ptr<MetricsExporter>> start(Options options, Render render);
  // stop().
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Closes the endpoint, stops rewriting the textfile and removes it; joins the threads.
  // Idempotent. After it, `render` is never called.
  void stop();
  // The endpoint's port (the one the system picked for port 0); 0 without an endpoint.
  uint16_t port() const;

 private:
  MetricsExporter(Options options, Render render);
  // Renders and replaces the textfile.
  Status write_textfile();
  void textfile_loop();

  const Options options_;
  const Render render_;
  std::unique_ptr<MetricsHttp> http_;
  cairn::Mutex mu_;
  cairn::CondVar cv_;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  bool write_failing_ = false;  // textfile thread only: the last write failed (logged once)
  // The textfile was written at least once (stop() removes it only then). Written by start() and
  // the textfile thread, read by stop() after joining it.
  bool wrote_textfile_ = false;
  std::thread textfile_thread_;
};

}  // namespace cairn
