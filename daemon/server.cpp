#include "daemon/server.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/log.hpp"
#include "core/wire.hpp"

namespace cairn {

std::string socket_path_for(const Config& config) {
  return config.socket.empty() ? wire::default_socket_path() : config.socket;
}

namespace {

Status prepare_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return errno_status("socket directory '" + dir + "'", errno);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(dir).parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return errno_status("creating socket directory '" + dir + "'", errno);
    if (::stat(dir.c_str(), &st) != 0) return errno_status("socket directory '" + dir + "'", errno);
  }
  if (!S_ISDIR(st.st_mode)) return invalid_argument("socket directory '" + dir + "' is not a directory");
  if (st.st_uid != ::getuid())
    return permission_denied("socket directory '" + dir + "' belongs to uid " + std::to_string(st.st_uid) +
                             ", not to this user (" + std::to_string(::getuid()) +
                             "); set CAIRN_SOCKET to a path of your own");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return permission_denied("socket directory '" + dir + "' is writable by other users; make it mode 0700");
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Server>> Server::start(Engine& engine, const std::string& socket_path) {
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path))
    return invalid_argument("socket path '" + socket_path + "' must be 1.." +
                            std::to_string(sizeof(addr.sun_path) - 1) +
                            " bytes long (Unix socket limit); choose a shorter CAIRN_SOCKET");
  std::string dir = std::filesystem::path(socket_path).parent_path().string();
  if (dir.empty()) dir = ".";
  CAIRN_RETURN_IF_ERROR(prepare_directory(dir));

  std::string lock_path = socket_path + ".lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return errno_status("opening lock file '" + lock_path + "'", errno);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    ssize_t n = ::pread(lock_fd, buf, sizeof buf - 1, 0);
    ::close(lock_fd);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return busy("another cairnd (pid " + pid + ") is already serving " + socket_path +
                "; stop it first or set CAIRN_SOCKET to another path");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd, 0) != 0 || ::pwrite(lock_fd, pid.data(), pid.size(), 0) < 0) {
    ::close(lock_fd);
    return errno_status("writing lock file '" + lock_path + "'", errno);
  }

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::close(lock_fd);
    return errno_status("socket()", errno);
  }
  ::unlink(socket_path.c_str());  // a stale socket of a dead daemon: we hold the lock
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  mode_t old = ::umask(0177);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(fd, 128) != 0) {
    Status st = errno_status("listening on '" + socket_path + "'", errno);
    ::close(fd);
    ::close(lock_fd);
    return st;
  }
  auto server = std::unique_ptr<Server>(new Server(engine, socket_path, fd, lock_fd));
  // Without the watcher (no epoll or eventfd), a dead client's leases wait for its request to end.
  server->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  server->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.u64 = 0;  // connection ids start at 1
  if (server->epoll_fd_ >= 0 && server->wake_fd_ >= 0 &&
      ::epoll_ctl(server->epoll_fd_, EPOLL_CTL_ADD, server->wake_fd_, &wake) == 0) {
    server->hangups_ = std::thread([s = server.get()] { s->hangup_loop(); });
  } else {
    CAIRN_LOG_WARN(
        "no hang-up watcher ({}): a client killed while a request of its waits keeps its leases until "
        "that request returns",
        std::strerror(errno));
    if (server->epoll_fd_ >= 0) ::close(server->epoll_fd_);
    if (server->wake_fd_ >= 0) ::close(server->wake_fd_);
    server->epoll_fd_ = server->wake_fd_ = -1;
  }
  server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
  return server;
}

Server::Server(Engine& engine, std::string path, int listen_fd, int lock_fd)
    : engine_(engine), path_(std::move(path)), listen_fd_(listen_fd), lock_fd_(lock_fd) {}

Server::~Server() {
  stop();
  ::unlink(path_.c_str());
  ::unlink((path_ + ".lock").c_str());
  ::close(lock_fd_);
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  // First the watcher: the shutdowns below look like hang-ups, and a client still reading the reply
  // to its request keeps its leases.
  stop_hangups();
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  std::map<uint64_t, std::thread> threads;
  {
    cairn::MutexLock lock(mu_);
    // A connection thread finishes the request in hand; its next read sees end-of-file.
    for (auto& [id, fd] : conns_) ::shutdown(fd, SHUT_RD);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads)
    if (t.joinable()) t.join();
}

void Server::stop_hangups() {
  {
    cairn::MutexLock lock(mu_);
    hangups_stopped_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (hangups_.joinable()) hangups_.join();
  // Connection threads still in begin_wait/end_wait read epoll_fd_ under mu_.
  cairn::MutexLock lock(mu_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

bool Server::begin_wait(int fd, uint64_t conn_id, Session& session) {
  cairn::MutexLock lock(mu_);
  if (epoll_fd_ < 0 || hangups_stopped_) return false;
  epoll_event ev{};
  ev.events = EPOLLRDHUP | EPOLLONESHOT;  // EPOLLHUP and EPOLLERR are always reported
  ev.data.u64 = conn_id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  waiting_[conn_id] = &session;
  return true;
}

void Server::end_wait(int fd, uint64_t conn_id) {
  cairn::MutexLock lock(mu_);
  waiting_.erase(conn_id);
  if (epoll_fd_ >= 0) (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

void Server::hangup_loop() {
  epoll_event events[16];
  for (;;) {
    int n = ::epoll_wait(epoll_fd_, events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      CAIRN_LOG_WARN("the hang-up watcher stops: epoll_wait: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t conn_id = events[i].data.u64;
      if (conn_id == 0) return;  // stop()
      // Under mu_, so the connection's thread cannot leave its request (end_wait) and touch the
      // leases meanwhile; the waiting request itself never does.
      cairn::MutexLock lock(mu_);
      auto it = waiting_.find(conn_id);
      if (it == waiting_.end()) continue;  // its request returned meanwhile
      const size_t leases = it->second->leases.size();
      engine_.release_leases(*it->second);
      waiting_.erase(it);
      if (leases)
        CAIRN_LOG_INFO(
            "connection {}: the client hung up while a request of its waits; its {} lease(s) are released "
            "now",
            conn_id, leases);
    }
  }
}

void Server::accept_loop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    // Join threads of connections that have ended.
    std::vector<std::thread> done;
    {
      cairn::MutexLock lock(mu_);
      for (uint64_t id : finished_) {
        auto it = threads_.find(id);
        if (it != threads_.end()) {
          done.push_back(std::move(it->second));
          threads_.erase(it);
        }
      }
      finished_.clear();
    }
    for (auto& t : done) t.join();
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) break;
      if (errno == EMFILE || errno == ENFILE) {
        CAIRN_LOG_WARN("accept: {} (too many open files); retrying", std::strerror(errno));
        ::usleep(10000);
        continue;
      }
      break;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) {
      nlohmann::json err = wire::error_response(
          permission_denied("cairnd serves only uid " + std::to_string(::getuid()) + "; start your own daemon"));
      (void)wire::send_frame(fd, wire::Kind::kResponse, err);
      ::close(fd);
      continue;
    }
    cairn::MutexLock lock(mu_);
    uint64_t id = next_conn_++;
    conns_[id] = fd;
    threads_[id] = std::thread([this, fd, id, pid = cred.pid] { serve(fd, id, pid); });
  }
}

namespace {

// Reads request frames from a connection through a buffer: one recv() brings every request a
// pipelining client has sent so far, instead of two reads per frame. Same rules and errors as
// wire::recv_frame (a descriptor that arrives is closed: clients pass none).
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd) {}

  // A whole frame (or a header that does not decode) is buffered: next() will not block.
  bool frame_buffered() const {
    const size_t have = end_ - pos_;
    if (have < wire::kFrameHeaderBytes) return false;
    auto h = wire::decode_header({buf_.data() + pos_, wire::kFrameHeaderBytes});
    return !h.ok() || have >= wire::kFrameHeaderBytes + h->json_len + h->blob_len;
  }

  Result<wire::Frame> next() {
    while (end_ - pos_ < wire::kFrameHeaderBytes) {
      const bool started = end_ > pos_;
      CAIRN_ASSIGN_OR_RETURN(size_t n, fill(wire::kFrameHeaderBytes - (end_ - pos_)));
      if (n == 0)
        return started ? protocol_error("connection closed in the middle of a frame")
                       : unavailable("connection closed");
    }
    CAIRN_ASSIGN_OR_RETURN(wire::FrameHeader h, wire::decode_header({buf_.data() + pos_, wire::kFrameHeaderBytes}));
    const size_t head = wire::kFrameHeaderBytes + h.json_len;
    while (end_ - pos_ < head) {
      CAIRN_ASSIGN_OR_RETURN(size_t n, fill(head - (end_ - pos_)));
      if (n == 0) return protocol_error("connection closed in the middle of a frame");
    }
    CAIRN_ASSIGN_OR_RETURN(nlohmann::json body,
                           wire::decode_body(h.kind, {buf_.data() + pos_ + wire::kFrameHeaderBytes, h.json_len}));
    pos_ += head;
    wire::Frame f;
    f.kind = h.kind;
    f.body = std::move(body);
    if (h.blob_len > 0) {
      // What is buffered, then the rest straight into the blob (no second copy of big payloads).
      f.blob.resize(h.blob_len);
      const size_t have = std::min<size_t>(end_ - pos_, h.blob_len);
      std::memcpy(f.blob.data(), buf_.data() + pos_, have);
      pos_ += have;
      if (have < h.blob_len) CAIRN_RETURN_IF_ERROR(wire::read_full(fd_, f.blob.data() + have, h.blob_len - have));
    }
    if (pos_ == end_) {
      pos_ = end_ = 0;
      if (buf_.size() > (1u << 20)) std::vector<uint8_t>().swap(buf_);  // after one huge request
    }
    return f;
  }

 private:
  // One read of at least `need` bytes of room; returns the bytes read (0: end of file).
  Result<size_t> fill(size_t need) {
    const size_t room = std::max<size_t>(need, 64 * 1024);
    if (buf_.size() - end_ < room) {
      if (pos_ > 0) {
        std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
        end_ -= pos_;
        pos_ = 0;
      }
      if (buf_.size() - end_ < room) buf_.resize(end_ + room);
    }
    // Descriptors are never passed to the daemon: recv_some closes any that come.
    CAIRN_ASSIGN_OR_RETURN(size_t r, wire::recv_some(fd_, buf_.data() + end_, buf_.size() - end_));
    end_ += r;
    return r;
  }

  int fd_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, end_ = 0;
};

// A request that may block for long (waiting for durability, a tensor, the flusher): the answers
// held back for the requests before it are sent first.
bool may_block(const nlohmann::json& req) {
  const auto op = req.find("op");
  if (op == req.end() || !op->is_string()) return true;
  if (*op != "commit") return *op != "ping";
  const auto wait = req.find("wait");
  const auto durability = req.find("durability");
  const bool waits = wait == req.end() || !wait->is_boolean() || wait->get<bool>();
  return waits && !(durability != req.end() && durability->is_string() && *durability == "memory");
}

// Requests that may wait long and never touch the session's leases (nor carry leases to release):
// while one runs, the hang-up watcher may release the leases of a client that died.
bool waits_without_leases(const nlohmann::json& req) {
  const auto op = req.find("op");
  if (op == req.end() || !op->is_string() || req.contains("release")) return false;
  static const char* const kOps[] = {"gc", "remove", "wait", "flush", "fsck", "sync", "prefetch"};
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* o) { return *op == o; });
}

}  // namespace

void Server::serve(int fd, uint64_t conn_id, pid_t client_pid) {
  Session session;
  session.client_pid = client_pid;
  FrameReader reader(fd);
  // Responses are held back while more requests are already buffered (a pipelining client), and
  // sent together: one write for many answers. Order is always the requests' order.
  std::vector<uint8_t> out;
  auto flush = [&]() -> Status {
    if (out.empty()) return Status::OK();
    Status st = wire::write_full(fd, out.data(), out.size());
    out.clear();
    if (out.capacity() > (1u << 20)) std::vector<uint8_t>().swap(out);
    return st;
  };
  for (;;) {
    if (!reader.frame_buffered() && !flush().ok()) break;
    auto frame = reader.next();
    if (!frame.ok()) {
      if (frame.status().code() != StatusCode::kUnavailable) {
        // Garbage on the socket: say what was wrong, then drop the connection.
        CAIRN_LOG_WARN("connection {}: {}", conn_id, frame.status().to_string());
        if (flush().ok()) (void)wire::send_frame(fd, wire::Kind::kResponse, wire::error_response(frame.status()));
      }
      break;
    }
    if (frame->kind != wire::Kind::kRequest) {
      if (flush().ok())
        (void)wire::send_frame(fd, wire::Kind::kResponse,
                               wire::error_response(protocol_error("expected a request frame, got a response")));
      break;
    }
    if (may_block(frame->body) && !flush().ok()) break;
    const bool watched = waits_without_leases(frame->body) && begin_wait(fd, conn_id, session);
    Response r = engine_.handle(session, frame->body, frame->blob);
    if (watched) end_wait(fd, conn_id);
    bool hello = frame->body.value("op", std::string()) == "hello" && r.body.value("status", 1) == 0;
    if (hello) {
      // The arena's descriptor rides on this frame: sent on its own.
      if (!flush().ok() || !wire::send_frame(fd, wire::Kind::kResponse, r.body, r.blob, engine_.arena_fd()).ok()) break;
      continue;
    }
    std::vector<uint8_t> encoded = wire::encode_frame(wire::Kind::kResponse, r.body, r.blob);
    if (encoded.size() - wire::kFrameHeaderBytes - r.blob.size() > wire::kMaxJsonBytes) {
      CAIRN_LOG_WARN("connection {}: a response of {} bytes exceeds the frame limit; closing", conn_id, encoded.size());
      break;
    }
    out.insert(out.end(), encoded.begin(), encoded.end());
    if (out.size() >= (256u << 10) && !flush().ok()) break;
  }
  (void)flush();
  engine_.end_session(session);
  cairn::MutexLock lock(mu_);
  ::close(fd);
  conns_.erase(conn_id);
  finished_.push_back(conn_id);
}

}  // namespace cairn
