// The metrics exporter's HTTP endpoint (metrics_exporter.hpp): GET /metrics on one TCP acceptor,
// served by one thread of its own with Boost.Beast over Boost.Asio. Connections are handled
// asynchronously on that thread, each read and write with a time limit, so a slow or idle client
// holds no other back; at most kMaxConnections are open at once (more are closed at once).
//
// Answers: 200 with the exposition (OpenMetrics when the Accept header asks for it, else Prometheus
// text; metrics::negotiate), 404 for any other path, 405 (Allow: GET) for any other method, 400 for
// a request that is not HTTP/1.x, 500 when rendering fails. Keep-alive as the client asks.
//
// Thread-safety: stop() and port() may be called from any thread; `render` is called on the
// endpoint's thread, one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "core/metrics.hpp"
#include "core/status.hpp"

namespace cairn {

class MetricsHttp {
 public:
  using Render = std::function<std::string(metrics::Format)>;
  static constexpr int kMaxConnections = 64;

  // Resolves the host, binds and listens, then starts the thread. Fails with kUnavailable and the
  // system's reason when the address cannot be resolved or bound (the caller names the config key).
  static Result<std::unique_ptr<MetricsHttp>> start(const HostPort& at, Render render);
  // stop().
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  // Closes the acceptor and every connection and joins the thread. Idempotent.
  void stop();
  // The port listened on: the one asked for, or the one the system picked for port 0.
  uint16_t port() const;

 private:
  struct Impl;
  explicit MetricsHttp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
