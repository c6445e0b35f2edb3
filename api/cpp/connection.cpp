#include "api/cpp/connection.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "api/cpp/connection_internal.hpp"
#include "core/copy.hpp"
#include "core/wire.hpp"

namespace cairn {

using nlohmann::json;

namespace client_detail {
// Maps n bytes of the caller's memory at p in one call instead of one fault per 4 KiB page, for
// copies of 1 MiB and more (measured: a 1 GiB commit on a fresh connection took 5x a memcpy, 2x
// once mapped). A buffer that is mapped already (the common case: a buffer read into again) is
// left alone: walking its page tables again costs a tenth of copying into it (measured, 256 MiB),
// so a sample of its pages is asked first (mincore). Best effort: kernels before 5.14 know neither
// flag and fault as before. The arena's own pages are populated by ArenaView::prefault.
void populate(const void* p, uint64_t n, bool write) {
  if (n < (1u << 20)) return;
  const uintptr_t page = 4096, at = reinterpret_cast<uintptr_t>(p), start = at & ~(page - 1);
  const uint64_t len = n + (at - start), pages = (len + page - 1) / page;
  bool mapped = true;
  constexpr uint64_t kSamples = 16;
  for (uint64_t k = 0; k < kSamples && mapped; ++k) {
    const uint64_t i = k * (pages - 1) / (kSamples - 1);
    unsigned char in = 0;
    mapped = ::mincore(reinterpret_cast<void*>(start + i * page), page, &in) == 0 && (in & 1);
  }
  if (!mapped) (void)::madvise(reinterpret_cast<void*>(start), len, write ? kMadvPopulateWrite : kMadvPopulateRead);
}

json shape_json(const std::vector<int64_t>& shape) {
  json a = json::array();
  for (auto d : shape) a.push_back(d);
  return a;
}

Status check_shape(DType dtype, const std::vector<int64_t>& shape, uint64_t* nbytes) {
  if (shape.size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(std::to_string(shape.size()) + " dimensions; at most " + std::to_string(kMaxDims));
  auto n = tensor_nbytes(dtype, shape);
  if (!n) return invalid_argument("shape has a negative dimension or is too large");
  *nbytes = *n;
  return Status::OK();
}
}  // namespace client_detail
using namespace client_detail;

namespace {

Result<TensorInfo> info_from_json(const json& j) {
  TensorInfo t;
  t.name = j.value("name", std::string());
  auto dt = dtype_from_name(j.value("dtype", std::string()));
  if (!dt) return protocol_error("daemon sent an unknown dtype");
  t.dtype = *dt;
  for (const auto& d : j.value("shape", json::array())) t.shape.push_back(d.get<int64_t>());
  t.nbytes = j.value("nbytes", uint64_t{0});
  return t;
}

}  // namespace

// ---- Connection ----

Result<std::unique_ptr<Connection>> Connection::connect(const std::string& address_in) {
  std::string address = address_in.empty() ? wire::default_socket_path() : address_in;
  sockaddr_un addr{};
  if (address.size() >= sizeof(addr.sun_path)) return invalid_argument("socket path '" + address + "' is too long");
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_status("socket()", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, address.c_str(), address.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    return unavailable("no cairnd is listening on " + address + " (" + std::strerror(err) +
                       "); start one with `cairnd` or point CAIRN_SOCKET at a running daemon");
  }
  auto c = std::unique_ptr<Connection>(new Connection(fd, address));
  // A daemon that refuses the connection (another uid: SO_PEERCRED) says why and closes at once, maybe
  // before the hello arrives: the send then fails, but its answer is there to read.
  const Status sent = wire::send_frame(fd, wire::Kind::kRequest, json{{"op", "hello"}});
  auto f = wire::recv_frame(fd);
  if (!f.ok())
    return unavailable("cairnd on " + address +
                       " closed the connection: " + (sent.ok() ? f.status() : sent).to_string());
  Status st = wire::response_status(f->body);
  if (!st.ok()) {
    if (f->passed_fd >= 0) ::close(f->passed_fd);
    return st.with_context("cairnd on " + address);
  }
  if (f->passed_fd < 0) return protocol_error("cairnd on " + address + " did not send its arena");
  uint64_t size = f->body.value("arena_size", uint64_t{0});
  c->chunk_size_ = f->body.value("chunk_size", uint64_t{0});
  if (auto h = f->body.find("hbm"); h != f->body.end() && h->is_object()) {
    c->hbm_backend_ = h->value("backend", std::string());
    for (const auto& d : h->value("devices", json::array()))
      if (d.is_number_integer()) c->hbm_devices_.push_back(d.get<int>());
  }
  CAIRN_ASSIGN_OR_RETURN(c->view_, ArenaView::map(f->passed_fd, size));
  return c;
}

Connection::~Connection() {
  // Every request sent is answered before the connection ends: a pipelined commit the daemon had
  // not read yet would otherwise be dropped with the connection.
  (void)flush_pipeline();
  for (const auto& [handle, slab] : slabs_) mapper_->close(slab.first, slab.second);
  for (int v = 0; v < 2; v++)
    for (size_t g = 0; g < pinned_[v].size(); g++)
      if (pinned_[v][g])
        mapper_->unpin_host((v == 0 ? const_cast<uint8_t*>(view_->read_base()) : view_->write_base()) +
                            g * kPinGranule);
  ::close(fd_);
}

Status Connection::lost(const std::string& why) {
  if (broken_.ok()) broken_ = unavailable("lost the connection to cairnd on " + address_ + ": " + why);
  // Every request in flight ends with that error (none of their replies can arrive any more).
  std::deque<ReplyHandler> pending;
  pending.swap(in_flight_);
  for (auto& h : pending)
    if (h) h(broken_);
  return broken_;
}

Status Connection::write_all(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  const std::span<const uint8_t> parts[2] = {a, b};
  for (const auto& part : parts) {
    size_t done = 0;
    while (done < part.size()) {
      ssize_t r = ::send(fd_, part.data() + done, part.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r >= 0) {
        done += static_cast<size_t>(r);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return lost(std::strerror(errno));
      // The socket is full. The daemon may itself be blocked writing replies we have not read:
      // read them meanwhile, so that a long pipeline never deadlocks.
      pollfd p{fd_, static_cast<short>(POLLOUT | (in_flight_.empty() ? 0 : POLLIN)), 0};
      int n = ::poll(&p, 1, -1);
      if (n < 0 && errno != EINTR) return lost(std::strerror(errno));
      if (n > 0 && (p.revents & POLLIN)) {
        auto c = collect(0);
        if (!c.ok()) return c.status();
      }
    }
  }
  return Status::OK();
}

void Connection::dispatch_buffered() {
  while (broken_.ok() && rend_ - rpos_ >= wire::kFrameHeaderBytes) {
    auto h = wire::decode_header({rbuf_.data() + rpos_, wire::kFrameHeaderBytes});
    if (!h.ok()) {
      (void)lost(h.status().message());
      return;
    }
    const size_t total = wire::kFrameHeaderBytes + h->json_len + h->blob_len;
    if (rend_ - rpos_ < total) {
      want_ = total - (rend_ - rpos_);
      return;
    }
    want_ = 0;
    if (h->kind != wire::Kind::kResponse) {
      (void)lost("cairnd sent a request frame where a response was expected");
      return;
    }
    auto body = wire::decode_body(wire::Kind::kResponse, {rbuf_.data() + rpos_ + wire::kFrameHeaderBytes, h->json_len});
    rpos_ += total;
    if (!body.ok()) {
      (void)lost(body.status().message());
      return;
    }
    if (in_flight_.empty()) {
      (void)lost("cairnd sent a response to no request");
      return;
    }
    ReplyHandler handler = std::move(in_flight_.front());
    in_flight_.pop_front();
    Status st = wire::response_status(*body);
    if (!handler) continue;
    if (st.ok())
      handler(std::move(body).value());
    else
      handler(std::move(st));
  }
  if (rpos_ == rend_) rpos_ = rend_ = 0;
}

Result<bool> Connection::collect(int timeout_ms) {
  if (!broken_.ok()) return broken_;
  pollfd p{fd_, POLLIN, 0};
  for (;;) {
    int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) break;
    if (n == 0) return false;
    if (errno != EINTR) return lost(std::strerror(errno));
  }
  // Room for at least 64 KiB, or for the rest of the frame being received.
  const size_t room = std::max<size_t>(64 * 1024, want_);
  if (rbuf_.size() - rend_ < room) {
    if (rpos_ > 0) {
      std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
      rend_ -= rpos_;
      rpos_ = 0;
    }
    if (rbuf_.size() - rend_ < room) rbuf_.resize(rend_ + room);
  }
  ssize_t r;
  do {
    r = ::recv(fd_, rbuf_.data() + rend_, rbuf_.size() - rend_, MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    return lost(std::strerror(errno));
  }
  if (r == 0) return lost("cairnd closed the connection");
  rend_ += static_cast<size_t>(r);
  dispatch_buffered();
  if (!broken_.ok()) return broken_;
  return true;
}

Status Connection::send_request(const json& request_in, std::span<const uint8_t> blob, ReplyHandler on_reply) {
  if (!broken_.ok()) return broken_;
  const json* request = &request_in;
  json with_release;
  if (!deferred_release_.empty()) {
    with_release = request_in;
    with_release["release"] = deferred_release_;
    request = &with_release;
  }
  std::string js = request->dump(-1, ' ', false, json::error_handler_t::replace);
  if (js.size() > wire::kMaxJsonBytes)
    return invalid_argument("message too large (" + std::to_string(js.size()) + " bytes of JSON)");
  if (blob.size() > wire::kMaxBlobBytes)
    return invalid_argument("inline payload too large (" + std::to_string(blob.size()) + " bytes)");
  auto hb = wire::encode_header(wire::FrameHeader{wire::Kind::kRequest, static_cast<uint32_t>(js.size()), blob.size()});
  // Small frames go out in one piece.
  const bool one_piece = blob.size() <= 64 * 1024;
  std::vector<uint8_t> head;
  head.reserve(hb.size() + js.size() + (one_piece ? blob.size() : 0));
  head.insert(head.end(), hb.begin(), hb.end());
  head.insert(head.end(), js.begin(), js.end());
  if (one_piece) head.insert(head.end(), blob.begin(), blob.end());
  ++requests_;
  deferred_release_.clear();  // sent, or the connection is gone and with it the leases
  CAIRN_RETURN_IF_ERROR(write_all(head, one_piece ? std::span<const uint8_t>() : blob));
  in_flight_.push_back(std::move(on_reply));
  return Status::OK();
}

Result<json> Connection::call(const json& request, std::span<const uint8_t> blob) {
  free_failed_spaces();
  std::optional<Result<json>> mine;
  CAIRN_RETURN_IF_ERROR(send_request(request, blob, [&mine](Result<json> r) { mine.emplace(std::move(r)); }));
  // Replies come in request order: those of pipelined requests sent before this one first.
  while (!mine) {
    auto c = collect(-1);
    if (!c.ok() && !mine) return c.status();
  }
  return std::move(*mine);
}

Status Connection::send_pipelined(const json& request, std::span<const uint8_t> blob, ReplyHandler on_reply) {
  free_failed_spaces();
  while (in_flight_.size() >= kMaxInFlight) {
    auto c = collect(-1);
    if (!c.ok()) return c.status();
  }
  return send_request(request, blob, std::move(on_reply));
}

void Connection::free_failed_spaces() {
  if (spaces_to_free_.empty() || !broken_.ok()) return;
  std::vector<uint64_t> ids;
  ids.swap(spaces_to_free_);
  // A space the daemon does not know (any more) is harmless to free: the replies are not needed.
  for (uint64_t id : ids) (void)send_request(json{{"op", "free"}, {"space", id}}, {}, nullptr);
}

Status Connection::flush_pipeline() {
  free_failed_spaces();
  while (!in_flight_.empty()) {
    auto c = collect(-1);
    if (!c.ok()) break;
  }
  Status orphan = std::exchange(orphan_error_, Status::OK());
  if (!orphan.ok()) return orphan;
  return broken_;
}

Status Connection::wait(const Ticket& t, int timeout_ms) {
  if (!t) return invalid_argument("no ticket to wait for");
  const auto start = std::chrono::steady_clock::now();
  auto left_ms = [&]() -> int {
    if (timeout_ms < 0) return -1;
    auto spent =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    return static_cast<int>(std::max<int64_t>(0, timeout_ms - spent));
  };
  while (!t->resolved) {
    const int left = left_ms();
    auto c = collect(left);
    if (!c.ok()) break;  // the connection is lost: every ticket in flight is resolved with that
    if (!*c && !t->resolved && left == 0)
      return timed_out("the reply to the commit of model '" + t->id + "' has not arrived after " +
                       std::to_string(timeout_ms) + " ms");
  }
  if (!t->resolved) return broken_;
  if (!t->status.ok() || t->daemon_ticket == 0) return t->status;
  Status st = wait(t->daemon_ticket, left_ms());
  if (st.code() == StatusCode::kTimeout) return st;  // the daemon keeps the ticket: wait again
  t->daemon_ticket = 0;
  t->status = st;
  return st;
}

Status Connection::put_tensor(const std::string& key, const void* data, DType dtype,
                              const std::vector<int64_t>& shape) {
  uint64_t n;
  CAIRN_RETURN_IF_ERROR(check_shape(dtype, shape, &n));
  json req{{"op", "put_tensor"}, {"key", key}, {"dtype", dtype_name(dtype)}, {"shape", shape_json(shape)}};
  if (n <= kInlineLimit) {
    return call(req, {static_cast<const uint8_t*>(data), n}).status();
  }
  CAIRN_ASSIGN_OR_RETURN(Space sp, allocate(n));
  stream_copy(sp.data, data, n, should_stream(n, n));
  req["space"] = sp.id;
  auto r = call(req);
  if (!r.ok()) (void)free_space(sp.id);
  return r.status();
}

Result<TensorInfo> Connection::tensor_info(const std::string& key) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "tensor_info"}, {"key", key}}));
  auto t = info_from_json(r);
  if (t.ok()) t->name = key;
  return t;
}

Status Connection::unpack_tensor(const std::string& key, void* dst, uint64_t dst_bytes) {
  return unpack_tensor_to(key, [&](const TensorInfo& t) -> Result<void*> {
    if (t.nbytes != dst_bytes)
      return invalid_argument("tensor '" + key + "' has " + std::to_string(t.nbytes) + " bytes, the buffer " +
                              std::to_string(dst_bytes));
    return dst;
  });
}

Status Connection::unpack_tensor_to(const std::string& key,
                                    const std::function<Result<void*>(const TensorInfo&)>& buffer) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "lease_tensor"}, {"key", key}}));
  uint64_t n = r.value("nbytes", uint64_t{0});
  uint64_t off = r.value("offset", uint64_t{0});
  uint64_t lease = r.value("lease", uint64_t{0});
  Status st;
  void* dst = nullptr;
  auto info = info_from_json(r);
  if (!info.ok()) {
    st = info.status();
  } else if (auto expect = tensor_nbytes(info->dtype, info->shape); !expect || *expect != n) {
    st = protocol_error("daemon described tensor '" + key + "' with a size that does not match its shape");
  } else if (off + n > view_->size()) {
    st = protocol_error("daemon leased an extent outside the arena");
  } else {
    info->name = key;
    auto b = buffer(*info);
    if (!b.ok())
      st = b.status();
    else if (!*b && n)
      st = no_space("no buffer for the " + std::to_string(n) + " bytes of tensor '" + key + "'");
    else
      dst = *b;
  }
  if (st.ok() && n) {
    view_->prefault(off, n, false);
    populate(dst, n, true);
    stream_copy(dst, view_->read_base() + off, n, should_stream(n, n));
  }
  if (lease) release_later(lease);  // with the next request: one round trip per unpack
  return st;
}

Result<bool> Connection::poll_tensor(const std::string& key, int timeout_ms) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "poll_tensor"}, {"key", key}, {"timeout_ms", timeout_ms}}));
  return r.value("found", false);
}

Status Connection::delete_tensor(const std::string& key) {
  return call(json{{"op", "delete_tensor"}, {"key", key}}).status();
}

Result<Connection::Space> Connection::allocate(uint64_t nbytes) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "allocate"}, {"nbytes", nbytes}}));
  uint64_t off = r.value("offset", uint64_t{0});
  if (off + nbytes > view_->size()) return protocol_error("daemon allocated space outside the arena");
  view_->prefault(off, nbytes, true);  // the pages the caller is about to write
  return Space{r.value("space", uint64_t{0}), view_->write_base() + off, nbytes};
}

Result<std::vector<Connection::Space>> Connection::allocate_many(const std::vector<uint64_t>& sizes) {
  if (sizes.empty()) return std::vector<Space>{};
  // The replies land in `got` as they are collected; the last request is a plain call, which
  // collects every earlier reply first, so all handlers have run when it returns.
  auto got = std::make_shared<std::vector<std::optional<Result<json>>>>(sizes.size());
  Status sent;
  for (size_t i = 0; i + 1 < sizes.size() && sent.ok(); ++i)
    sent = send_pipelined(json{{"op", "allocate"}, {"nbytes", sizes[i]}}, {},
                          [got, i](Result<json> r) { (*got)[i].emplace(std::move(r)); });
  if (sent.ok())
    (*got).back().emplace(call(json{{"op", "allocate"}, {"nbytes", sizes.back()}}));
  else
    (void)flush_pipeline();
  std::vector<Space> out;
  Status first = sent;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto& r = (*got)[i];
    if (!r) continue;
    if (!r->ok()) {
      if (first.ok()) first = r->status();
      continue;
    }
    uint64_t off = (*r)->value("offset", uint64_t{0}), id = (*r)->value("space", uint64_t{0});
    if (off + sizes[i] > view_->size()) {
      if (first.ok()) first = protocol_error("daemon allocated space outside the arena");
      spaces_to_free_.push_back(id);
      continue;
    }
    out.push_back(Space{id, view_->write_base() + off, sizes[i]});
  }
  if (!first.ok()) {
    for (const auto& sp : out) spaces_to_free_.push_back(sp.id);  // freed with the next request
    return first;
  }
  for (const auto& sp : out) view_->prefault(static_cast<uint64_t>(sp.data - view_->write_base()), sp.nbytes, true);
  return out;
}

Status Connection::free_space(uint64_t id) { return call(json{{"op", "free"}, {"space", id}}).status(); }

Status Connection::release(const std::vector<uint64_t>& leases) {
  if (leases.empty()) return Status::OK();
  return call(json{{"op", "release"}, {"leases", leases}}).status();
}

Status Connection::wait(uint64_t ticket, int timeout_ms) {
  if (ticket == 0) return Status::OK();
  return call(json{{"op", "wait"}, {"ticket", ticket}, {"timeout_ms", timeout_ms}}).status();
}

Status Connection::prefetch(const std::string& id) { return call(json{{"op", "prefetch"}, {"id", id}}).status(); }

Result<json> Connection::prefetch_all(const std::string& id) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "prefetch"}, {"id", id}, {"all", true}}));
  r.erase("status");
  return r;
}

Result<json> Connection::hint(const json& h) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "hint"}, {"hint", h}}));
  r.erase("status");
  return r;
}

Result<json> Connection::query(const json& q) {
  CAIRN_ASSIGN_OR_RETURN(json r, call(json{{"op", "query"}, {"query", q}}));
  r.erase("status");
  return r;
}

// ---- ConnectionReader ----

std::shared_ptr<const Connection::ModelInfo> Connection::cached_model(const std::string& id) const {
  auto it = model_cache_.find(id);
  return it == model_cache_.end() ? nullptr : it->second;
}

void Connection::cache_model(std::shared_ptr<const ModelInfo> info) {
  std::string id = info->id;
  if (model_cache_.insert_or_assign(id, std::move(info)).second) model_cache_order_.push_back(id);
  while (model_cache_.size() > kModelCacheEntries && !model_cache_order_.empty()) {
    model_cache_.erase(model_cache_order_.front());
    model_cache_order_.pop_front();
  }
  if (model_cache_order_.size() > 2 * kModelCacheEntries) {  // ids forgotten meanwhile
    std::deque<std::string> live;
    for (auto& k : model_cache_order_)
      if (model_cache_.count(k)) live.push_back(std::move(k));
    model_cache_order_ = std::move(live);
  }
}

Result<std::unique_ptr<ConnectionReader>> ConnectionReader::open(Connection& client, const std::string& id) {
  std::shared_ptr<const Connection::ModelInfo> info = client.cached_model(id);
  if (!info) {
    CAIRN_ASSIGN_OR_RETURN(json r, client.call(json{{"op", "open"}, {"id", id}}));
    auto fresh = std::make_shared<Connection::ModelInfo>();
    fresh->id = id;
    if (r.contains("parent") && r["parent"].is_string()) fresh->parent = r["parent"].get<std::string>();
    fresh->metadata = r.value("metadata", json::object());
    fresh->created_ns = r.value("created_ns", int64_t{0});
    for (const auto& t : r.value("tensors", json::array())) {
      CAIRN_ASSIGN_OR_RETURN(TensorInfo ti, info_from_json(t));
      fresh->tensors.push_back(std::move(ti));
    }
    info = fresh;
    client.cache_model(std::move(fresh));
  }
  auto reader = std::unique_ptr<ConnectionReader>(new ConnectionReader(client));
  reader->id_ = id;
  reader->parent_ = info->parent;
  reader->created_ns_ = info->created_ns;
  reader->metadata_ = info->metadata;
  reader->tensors_ = info->tensors;
  return reader;
}

ConnectionReader::~ConnectionReader() { close(); }

const TensorInfo* ConnectionReader::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

json ConnectionReader::lease_request(const std::string& id, const std::vector<std::string>& names, bool contiguous) {
  return json{{"op", "lease"}, {"id", id}, {"tensors", names}, {"contiguous", contiguous}};
}

Result<std::vector<ConnectionReader::Leased>> ConnectionReader::lease(const std::vector<std::string>& names,
                                                                      bool contiguous) {
  for (const auto& n : names)
    if (!find(n)) return not_found("model '" + id_ + "' has no tensor '" + n + "'");
  CAIRN_ASSIGN_OR_RETURN(json r, client_.call(lease_request(id_, names, contiguous)));
  return parse_lease(r, names.size());
}

Result<std::vector<ConnectionReader::Leased>> ConnectionReader::parse_lease(const json& r, size_t count) {
  std::vector<Leased> out;
  for (const auto& l : r.value("leases", json::array())) {
    Leased x{l.value("lease", uint64_t{0}), {}};
    for (const auto& e : l.value("extents", json::array())) {
      uint64_t off = e.at(0).get<uint64_t>(), len = e.at(1).get<uint64_t>();
      if (off > client_.arena_size() || len > client_.arena_size() - off)
        return protocol_error("daemon leased an extent outside the arena");
      x.extents.emplace_back(off, len);
    }
    out.push_back(std::move(x));
  }
  if (out.size() != count) return protocol_error("daemon answered a lease with the wrong number of tensors");
  if (r.value("created_ns", int64_t{0}) != created_ns_) {
    // Not the model this reader was opened on: gc deleted it and a new commit reused its id.
    std::vector<uint64_t> ids;
    for (const auto& x : out) ids.push_back(x.lease);
    (void)client_.release(ids);
    client_.forget_model(id_);
    return not_found("model '" + id_ + "' is no longer the model this reader opened (it was deleted and its id " +
                     "committed again); open it again");
  }
  return out;
}

Status ConnectionReader::check_buffer(const std::string& name, uint64_t dst_bytes) const {
  const TensorInfo* t = find(name);
  if (!t) return not_found("model '" + id_ + "' has no tensor '" + name + "'");
  if (t->nbytes != dst_bytes)
    return invalid_argument("tensor '" + name + "' has " + std::to_string(t->nbytes) + " bytes, the buffer " +
                            std::to_string(dst_bytes));
  return Status::OK();
}

Status ConnectionReader::read(const std::string& name, void* dst, uint64_t dst_bytes) {
  return read_many({name}, {std::span<uint8_t>(static_cast<uint8_t*>(dst), dst_bytes)});
}

Status ConnectionReader::read_many(const std::vector<std::string>& names, const std::vector<std::span<uint8_t>>& dsts) {
  if (names.size() != dsts.size()) return invalid_argument("read_many: as many buffers as names are needed");
  for (size_t i = 0; i < names.size(); ++i) CAIRN_RETURN_IF_ERROR(check_buffer(names[i], dsts[i].size()));
  uint64_t total = 0;
  for (const auto& d : dsts) total += d.size();
  // A large read goes in groups of whole tensors of at least kMinGroup bytes (about an eighth of
  // the read each): while the client copies one group out, the daemon loads the next from below
  // DRAM, so a model read from the burst buffer or the repository costs the device's time, not
  // the device's plus the copy's. Only the last group's copy is not overlapped: an eighth of the
  // copy rather than a quarter (docs/tiering.md has the A/B figures).
  constexpr uint64_t kMinGroup = 32ull << 20;
  const uint64_t group_bytes = std::max(kMinGroup, total / 8);
  std::vector<size_t> group_ends;
  uint64_t in_group = 0;
  for (size_t i = 0; i < dsts.size(); ++i) {
    in_group += dsts[i].size();
    if (in_group >= group_bytes || i + 1 == dsts.size()) {
      group_ends.push_back(i + 1);
      in_group = 0;
    }
  }
  if (group_ends.size() > 1) return read_pipelined(names, dsts, group_ends, total);
  CAIRN_ASSIGN_OR_RETURN(auto leased, lease(names, false));
  for (size_t i = 0; i < leased.size(); ++i) copy_out(leased[i], dsts[i], total);
  return Status::OK();
}

void ConnectionReader::copy_out(const Leased& leased, std::span<uint8_t> dst, uint64_t total) {
  uint8_t* out = dst.data();
  populate(out, dst.size(), true);
  for (const auto& [off, len] : leased.extents) {
    client_.arena_view().prefault(off, len, false);
    stream_copy(out, client_.arena() + off, len, should_stream(total, len));
    out += len;
  }
  client_.release_later(leased.lease);
}

Status ConnectionReader::read_pipelined(const std::vector<std::string>& names,
                                        const std::vector<std::span<uint8_t>>& dsts,
                                        const std::vector<size_t>& group_ends, uint64_t total) {
  const size_t groups = group_ends.size();
  auto replies = std::make_shared<std::vector<std::optional<Result<json>>>>(groups);
  Status first;
  size_t sent = 0;
  for (size_t g = 0; g < groups; ++g) {
    const size_t from = g ? group_ends[g - 1] : 0;
    std::vector<std::string> group(names.begin() + static_cast<std::ptrdiff_t>(from),
                                   names.begin() + static_cast<std::ptrdiff_t>(group_ends[g]));
    first = client_.send_pipelined(lease_request(id_, group, false), {},
                                   [replies, g](Result<json> r) { (*replies)[g].emplace(std::move(r)); });
    if (!first.ok()) break;
    ++sent;
  }
  // Every reply sent for is collected, also after a failure, so that its leases are released.
  for (size_t g = 0; g < sent; ++g) {
    while (!(*replies)[g]) {
      auto c = client_.collect(-1);
      if (!c.ok()) return c.status();  // the connection is gone, and with it the leases
    }
    Result<json>& r = *(*replies)[g];
    const size_t from = g ? group_ends[g - 1] : 0;
    Result<std::vector<Leased>> leased = r.ok() ? parse_lease(*r, group_ends[g] - from) : r.status();
    if (!leased.ok()) {
      if (first.ok()) first = leased.status();
      continue;
    }
    for (size_t k = 0; k < leased->size(); ++k) {
      if (first.ok())
        copy_out((*leased)[k], dsts[from + k], total);
      else
        client_.release_later((*leased)[k].lease);
    }
  }
  return first;
}

Result<std::span<const uint8_t>> ConnectionReader::map(const std::string& name) {
  CAIRN_ASSIGN_OR_RETURN(auto v, map_many({name}));
  return v[0];
}

Result<std::vector<std::span<const uint8_t>>> ConnectionReader::map_many(const std::vector<std::string>& names) {
  CAIRN_ASSIGN_OR_RETURN(auto leased, lease(names, true));
  std::vector<std::span<const uint8_t>> out;
  for (size_t i = 0; i < leased.size(); ++i) {
    held_.push_back(leased[i].lease);
    const TensorInfo* t = find(names[i]);
    if (leased[i].extents.empty()) {
      out.emplace_back(client_.arena(), 0);
      continue;
    }
    if (leased[i].extents.size() != 1) return protocol_error("daemon answered a contiguous lease with several extents");
    out.emplace_back(client_.arena() + leased[i].extents[0].first, t->nbytes);
  }
  return out;
}

Result<std::vector<std::span<uint8_t>>> ConnectionReader::map_many_private(const std::vector<std::string>& names) {
  CAIRN_ASSIGN_OR_RETURN(auto leased, lease(names, true));
  for (const auto& l : leased) held_.push_back(l.lease);  // released by close(), after the views are gone
  // The tensors of a model mostly lie side by side in the arena: tensors less than 1 MiB apart
  // share one mapping (one mmap and one populate for a run instead of one per tensor: ResNet-50
  // has 320 tensors). Tensors whose bytes overlap (identical tensors of one model are stored once)
  // never share one: each gets its own, so a write to one cannot show in the other.
  struct View {
    uint64_t offset, nbytes;
    size_t index;  // in names
  };
  std::vector<View> order;
  for (size_t i = 0; i < leased.size(); ++i) {
    if (leased[i].extents.size() > 1) return protocol_error("daemon answered a contiguous lease with several extents");
    const uint64_t n = find(names[i])->nbytes;
    if (!leased[i].extents.empty() && n > 0) order.push_back(View{leased[i].extents[0].first, n, i});
  }
  std::sort(order.begin(), order.end(), [](const View& a, const View& b) { return a.offset < b.offset; });
  std::vector<std::span<uint8_t>> out(leased.size());
  auto map_run = [&](const std::vector<View>& run, uint64_t from, uint64_t to) -> Status {
    auto p = client_.arena_view().map_private(from, to - from);
    if (!p.ok()) return p.status();  // the runs mapped so far are unmapped by close()
    private_.emplace_back(*p, to - from);
    for (const View& v : run) out[v.index] = {*p + (v.offset - from), v.nbytes};
    return Status::OK();
  };
  constexpr uint64_t kGap = 1u << 20;
  std::vector<View> run;
  uint64_t from = 0, to = 0;
  for (const View& v : order) {
    if (!run.empty() && v.offset < to) {  // overlaps the run: a mapping of its own
      CAIRN_RETURN_IF_ERROR(map_run({v}, v.offset, v.offset + v.nbytes));
      continue;
    }
    if (!run.empty() && v.offset > to + kGap) {
      CAIRN_RETURN_IF_ERROR(map_run(run, from, to));
      run.clear();
    }
    if (run.empty()) from = to = v.offset;
    run.push_back(v);
    to = std::max(to, v.offset + v.nbytes);
  }
  if (!run.empty()) CAIRN_RETURN_IF_ERROR(map_run(run, from, to));
  return out;
}

void ConnectionReader::close() {
  for (const auto& v : private_) ArenaView::unmap_private(v.data(), v.size());
  private_.clear();
  if (!held_.empty()) (void)client_.release(held_);
  held_.clear();
}

}  // namespace cairn
