// The metrics HTTP endpoint: Boost.Beast over Boost.Asio, one io_context run by one thread.
#include "daemon/metrics_http.hpp"

#include <fcntl.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.hpp"
#include "core/sync.hpp"

namespace cairn {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// How long a connection may take to send a request (or stay idle between two), and to take a
// response.
constexpr std::chrono::seconds kIoLimit{30};
constexpr size_t kHeaderLimit = 16 * 1024;
constexpr size_t kBodyLimit = 16 * 1024;

void close_on_exec(int fd) {
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

http::response<http::string_body> plain(http::status status, unsigned version, std::string body) {
  http::response<http::string_body> res{status, version};
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.body() = std::move(body);
  return res;
}

http::response<http::string_body> answer(const http::request<http::string_body>& req,
                                         const MetricsHttp::Render& render) {
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  if (target != "/metrics")
    return plain(http::status::not_found, req.version(), "not found: cairnd serves its metrics at /metrics\n");
  if (req.method() != http::verb::get) {
    auto res = plain(http::status::method_not_allowed, req.version(), "only GET /metrics is served here\n");
    res.set(http::field::allow, "GET");
    return res;
  }
  auto accept = req[http::field::accept];
  const metrics::Format format = metrics::negotiate(std::string_view(accept.data(), accept.size()));
  std::string body;
  try {
    body = render(format);
  } catch (const std::exception& e) {
    CAIRN_LOG_ERROR("metrics.listen: rendering the metrics failed: {}", e.what());
    return plain(http::status::internal_server_error, req.version(), "rendering the metrics failed\n");
  }
  http::response<http::string_body> res{http::status::ok, req.version()};
  const std::string_view type = metrics::content_type(format);
  res.set(http::field::content_type, beast::string_view(type.data(), type.size()));
  res.body() = std::move(body);
  return res;
}

}  // namespace

struct MetricsHttp::Impl {
  explicit Impl(Render r) : render(std::move(r)) {}

  void accept();
  void serve(tcp::socket socket);

  // Declared before the io_context: connections destroyed with it still count themselves out.
  Render render;
  int connections = 0;  // on the endpoint's thread only
  uint16_t port = 0;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};  // after a failed accept (out of descriptors): try again later
  std::thread thread;
  cairn::Mutex stop_mu;
  bool stopped CAIRN_GUARDED_BY(stop_mu) = false;
};

namespace {

// One client connection: read a request, answer, and again while the client keeps it alive.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(int& count, const MetricsHttp::Render& render, tcp::socket socket)
      : count_(count), render_(render), stream_(std::move(socket)) {
    ++count_;
  }
  ~Connection() { --count_; }

  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(kIoLimit);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted) {
      close();
      return;
    }
    if (ec) {
      // Not an HTTP/1.x request (or larger than the limits): say so if the client sent anything.
      if (parser_->got_some()) {
        res_ = plain(http::status::bad_request, 11, "bad request: send GET /metrics over HTTP/1.1\n");
        res_.keep_alive(false);
        write();
      } else {
        close();
      }
      return;
    }
    const auto& req = parser_->get();
    res_ = answer(req, render_);
    if (req.method() == http::verb::head) res_.body().clear();  // a response to HEAD has no body
    res_.keep_alive(req.keep_alive());
    write();
  }

  void write() {
    res_.prepare_payload();
    stream_.expires_after(kIoLimit);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->res_.keep_alive()) {
        self->close();
        return;
      }
      self->read();
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  int& count_;
  const MetricsHttp::Render& render_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
};

}  // namespace

void MetricsHttp::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // stopping
    if (ec) {
      CAIRN_LOG_WARN("metrics.listen: accepting a connection failed: {}; trying again in 1 s", ec.message());
      retry.expires_after(std::chrono::seconds(1));
      retry.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    serve(std::move(socket));
    accept();
  });
}

void MetricsHttp::Impl::serve(tcp::socket socket) {
  close_on_exec(socket.native_handle());
  if (connections >= kMaxConnections) {
    beast::error_code ignored;
    socket.close(ignored);
    return;
  }
  std::make_shared<Connection>(connections, render, std::move(socket))->read();
}

MetricsHttp::MetricsHttp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttp::~MetricsHttp() { stop(); }

Result<std::unique_ptr<MetricsHttp>> MetricsHttp::start(const HostPort& at, Render render) {
  auto impl = std::make_unique<Impl>(std::move(render));
  const std::string where =
      (at.host.find(':') != std::string::npos ? "[" + at.host + "]" : at.host) + ":" + std::to_string(at.port);
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  auto found =
      resolver.resolve(at.host, std::to_string(at.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty())
    return unavailable("cannot listen on '" + where + "': the host '" + at.host + "' does not resolve (" +
                       (ec ? ec.message() : std::string("no address")) + ")");
  const tcp::endpoint endpoint = *found.begin();
  tcp::acceptor& a = impl->acceptor;
  if (a.open(endpoint.protocol(), ec); !ec) {
    close_on_exec(a.native_handle());
    a.set_option(asio::socket_base::reuse_address(true), ec);
  }
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return unavailable("cannot listen on '" + where + "': " + ec.message());
  impl->port = a.local_endpoint(ec).port();
  impl->accept();
  Impl* i = impl.get();
  impl->thread = std::thread([i] {
    while (true) {
      try {
        i->ioc.run();
        return;
      } catch (const std::exception& e) {
        CAIRN_LOG_ERROR("metrics.listen: the endpoint's thread caught an exception: {}; serving on", e.what());
      }
    }
  });
  return std::unique_ptr<MetricsHttp>(new MetricsHttp(std::move(impl)));
}

void MetricsHttp::stop() {
  cairn::MutexLock lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

uint16_t MetricsHttp::port() const { return impl_->port; }

}  // namespace cairn
