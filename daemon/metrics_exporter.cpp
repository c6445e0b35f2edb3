#include "daemon/metrics_exporter.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "core/log.hpp"
#include "daemon/metrics_http.hpp"

namespace cairn {
namespace {

// Writes all of `text` to a new file `path` (mode 0644).
Status write_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("creating '" + path + "'", errno);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = errno_status("writing '" + path + "'", errno);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return errno_status("writing '" + path + "'", errno);
  return Status::OK();
}

}  // namespace

bool MetricsExporter::enabled(const Config& config) {
  return !config.metrics.listen.empty() || !config.metrics.textfile.empty();
}

Result<MetricsExporter::Options> MetricsExporter::options_from(const Config& config) {
  Options o;
  o.listen = config.metrics.listen;
  o.textfile = config.metrics.textfile;
  if (!o.listen.empty()) {
    auto at = parse_host_port(o.listen);
    if (!at.ok()) return at.status().with_context("metrics.listen");
  }
  auto interval = parse_duration(config.metrics.interval);
  if (!interval || interval->count() <= 0)
    return invalid_argument("metrics.interval: '" + config.metrics.interval +
                            "' is not a positive duration (such as 15s or 1m)");
  o.interval = *interval;
  return o;
}

MetricsExporter::MetricsExporter(Options options, Render render)
    : options_(std::move(options)), render_(std::move(render)) {}

MetricsExporter::~MetricsExporter() { stop(); }

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(Options options, Render render) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter(std::move(options), std::move(render)));
  if (!e->options_.listen.empty()) {
    auto at = parse_host_port(e->options_.listen);
    if (!at.ok()) return at.status().with_context("metrics.listen");
    auto http = MetricsHttp::start(*at, e->render_);
    if (!http.ok())
      return Status(http.status().code(),
                    "metrics.listen: " + http.status().message() +
                        " (choose a free port or another address in metrics.listen, or set it to \"\")");
    e->http_ = std::move(http).value();
    CAIRN_LOG_INFO("metrics: serving GET /metrics on port {} (metrics.listen {})", e->http_->port(),
                   e->options_.listen);
  }
  if (!e->options_.textfile.empty()) {
    Status first = e->write_textfile();
    if (!first.ok())
      return Status(first.code(), "metrics.textfile: " + first.message() +
                                      " (its directory must exist and be writable by the daemon's user)");
    e->textfile_thread_ = std::thread([p = e.get()] { p->textfile_loop(); });
  }
  return e;
}

void MetricsExporter::stop() {
  {
    cairn::MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (http_) http_->stop();
  if (textfile_thread_.joinable()) textfile_thread_.join();
  if (wrote_textfile_) (void)::unlink(options_.textfile.c_str());
}

uint16_t MetricsExporter::port() const { return http_ ? http_->port() : 0; }

Status MetricsExporter::write_textfile() {
  // Beside the file, under a name node_exporter's collector ignores (it reads *.prom only).
  const std::string temp = options_.textfile + "." + std::to_string(::getpid()) + ".tmp";
  std::string text;
  try {
    text = render_(metrics::Format::kPrometheus);
  } catch (const std::exception& e) {
    return internal_error(std::string("rendering the metrics failed: ") + e.what());
  }
  Status written = write_file(temp, text);
  if (written.ok() && ::rename(temp.c_str(), options_.textfile.c_str()) != 0)
    written = errno_status("renaming '" + temp + "' to '" + options_.textfile + "'", errno);
  if (!written.ok()) (void)::unlink(temp.c_str());
  wrote_textfile_ = wrote_textfile_ || written.ok();
  return written;
}

void MetricsExporter::textfile_loop() {
  cairn::MutexLock lock(mu_);
  while (!cv_.wait_for(lock, options_.interval, [this]() CAIRN_REQUIRES(mu_) { return stopping_; })) {
    lock.unlock();
    Status st = write_textfile();
    if (!st.ok() && !write_failing_)
      CAIRN_LOG_WARN("metrics.textfile: {}; trying again every {} ms", st.to_string(), options_.interval.count());
    else if (st.ok() && write_failing_)
      CAIRN_LOG_INFO("metrics.textfile: written again");
    write_failing_ = !st.ok();
    lock.lock();
  }
}

}  // namespace cairn
