// Fabric: open() (hints, endpoint setup, the control receive ring), memory registration and the public
// methods (tiers/peer/fabric_internal.hpp says how the implementation works and is split).
#include "tiers/peer/fabric.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/log.hpp"
#include "tiers/peer/fabric_internal.hpp"

namespace cairn {

namespace {

constexpr uint32_t kFiVersion = FI_VERSION(1, 17);
constexpr size_t kControlRing = 64;  // control receives kept posted

// "eth0" -> its IPv4 address (else its IPv6 one); an IP address or anything else unchanged (a host
// name: fi_getinfo resolves it, or says it cannot).
std::string resolve_node(const std::string& address) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, address.c_str(), &a4) == 1 || inet_pton(AF_INET6, address.c_str(), &a6) == 1) return address;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return address;
  std::string v4, v6;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_name || address != i->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      v4 = buf;
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf, sizeof buf);
      v6 = buf;
    }
  }
  freeifaddrs(ifs);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return address;
}

}  // namespace

std::string Fabric::Impl::where() const {
  return "fabric " + prov_name + (options.address.empty() ? "" : " on " + options.address);
}

// ---- memory registration ----

Status Fabric::Impl::reg_mr(const void* base, size_t length, uint64_t access, fid_mr** mr, void** desc) {
  uint64_t key = prov_key ? 0 : next_key.fetch_add(1);
  int ret = fi_mr_reg(domain, base, length, access, 0, key, 0, mr, nullptr);
  if (ret) return unavailable(where() + ": fi_mr_reg of " + std::to_string(length) + " bytes: " + fi_error_text(ret));
  if (mr_endpoint) {
    ret = fi_mr_bind(*mr, &ep->fid, 0);
    if (!ret) ret = fi_mr_enable(*mr);
    if (ret) {
      fi_close(&(*mr)->fid);
      *mr = nullptr;
      return unavailable(where() + ": binding a memory region to the endpoint: " + fi_error_text(ret));
    }
  }
  *desc = fi_mr_desc(*mr);
  return Status::OK();
}

void Fabric::Impl::close_mr(fid_mr*& mr) {
  if (!mr) return;
  int ret = fi_close(&mr->fid);
  if (ret) CAIRN_LOG_WARN("fabric: closing a memory region: {}", fi_error_text(ret));
  mr = nullptr;
}

Status Fabric::Impl::describe(Op* op, uint64_t access) {
  op->desc = nullptr;
  if (!need_desc || op->length == 0) return Status::OK();
  auto a = reinterpret_cast<uintptr_t>(op->data);
  {
    std::shared_lock l(regions_mu);
    auto it = regions.upper_bound(a);
    if (it != regions.begin()) {
      --it;
      const Region& r = it->second;
      if (a >= r.base && a + op->length <= r.base + r.length) {
        op->desc = r.desc;
        return Status::OK();
      }
    }
  }
  return reg_mr(op->data, op->length, access, &op->temp_mr, &op->desc);
}

// ---- open ----

namespace {

fi_info* make_hints(const FabricOptions& options, bool ordered) {
  fi_info* hints = fi_allocinfo();
  if (!hints) return nullptr;
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (ordered) {
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  }
  if (!options.provider.empty()) hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  return hints;
}

}  // namespace

Result<std::unique_ptr<Fabric>> Fabric::open(const FabricOptions& options) {
  auto im = std::make_unique<Impl>();
  im->options = options;
  im->prov_name = options.provider;
  const std::string what = "peers.provider '" + options.provider + "'";
  const std::string on_address =
      options.address.empty() ? std::string() : " on peers.address '" + options.address + "'";

  std::string node = options.address.empty() ? std::string() : resolve_node(options.address);
  int ret = -FI_ENODATA;
  for (bool ordered : {true, false}) {  // FI_ORDER_SAS where the provider has it
    fi_info* hints = make_hints(options, ordered);
    if (!hints) return internal_error("fabric: fi_allocinfo failed");
    ret = fi_getinfo(kFiVersion, node.empty() ? nullptr : node.c_str(), nullptr, node.empty() ? 0 : FI_SOURCE, hints,
                     &im->info);
    fi_freeinfo(hints);
    if (ret != -FI_ENODATA) break;
  }
  if (ret) {
    // Tell "no such provider" from "the provider cannot do this here".
    fi_info* any = nullptr;
    fi_info* phints = fi_allocinfo();
    if (phints && !options.provider.empty()) phints->fabric_attr->prov_name = strdup(options.provider.c_str());
    int pret = phints ? fi_getinfo(kFiVersion, nullptr, nullptr, 0, phints, &any) : -FI_ENOMEM;
    if (any) fi_freeinfo(any);
    if (phints) fi_freeinfo(phints);
    if (pret == -FI_ENODATA) return invalid_argument(what + ": libfabric has no such provider (fi_info -l lists them)");
    if (ret == -FI_ENODATA)
      return invalid_argument(what + " offers no tagged reliable-datagram endpoint (FI_EP_RDM, FI_TAGGED, " +
                              "FI_THREAD_SAFE)" + on_address + ": " + fi_error_text(ret));
    return unavailable(what + on_address + ": fi_getinfo: " + fi_error_text(ret));
  }
  fi_info* info = im->info;
  im->prov_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : options.provider;
  uint64_t mr_mode = static_cast<uint64_t>(info->domain_attr->mr_mode);
  im->need_desc = (mr_mode & FI_MR_LOCAL) || options.descriptors_always;
  im->mr_endpoint = mr_mode & FI_MR_ENDPOINT;
  im->prov_key = mr_mode & FI_MR_PROV_KEY;

  auto fail = [&](const char* step, int r) -> Status {
    return unavailable(im->where() + ": " + step + ": " + fi_error_text(r));
  };
  // Where the endpoint listens is opened with the endpoint (rxm) or when it is enabled.
  auto fail_bind = [&](const char* step, int r) -> Status {
    if (options.address.empty()) return fail(step, r);
    return invalid_argument(what + " cannot listen" + on_address + " (" + node + "): " + step + ": " +
                            fi_error_text(r));
  };
  if ((ret = fi_fabric(info->fabric_attr, &im->fabric, nullptr))) return fail("fi_fabric", ret);
  if ((ret = fi_domain(im->fabric, info, &im->domain, nullptr))) return fail("fi_domain", ret);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((ret = fi_av_open(im->domain, &av_attr, &im->av, nullptr))) return fail("fi_av_open", ret);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  // An fd the progress thread can sleep on (rxm: its sockets). Not FI_WAIT_UNSPEC: shm answers
  // that with a sched_yield loop that burns a core (and, in 1.17, misses messages).
  cq_attr.wait_obj = FI_WAIT_FD;
  ret = fi_cq_open(im->domain, &cq_attr, &im->cq, nullptr);
  im->cq_waitable = ret == 0 && cq_attr.wait_obj != FI_WAIT_NONE;
  if (ret) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((ret = fi_cq_open(im->domain, &cq_attr, &im->cq, nullptr))) return fail("fi_cq_open", ret);
  }

  if ((ret = fi_endpoint(im->domain, info, &im->ep, nullptr))) return fail_bind("fi_endpoint", ret);
  if ((ret = fi_ep_bind(im->ep, &im->av->fid, 0))) return fail("binding the address vector", ret);
  if ((ret = fi_ep_bind(im->ep, &im->cq->fid, FI_TRANSMIT | FI_RECV))) return fail("binding the completion queue", ret);
  if ((ret = fi_enable(im->ep))) return fail_bind("fi_enable", ret);

  size_t len = 0;
  char probe[1];
  ret = fi_getname(&im->ep->fid, probe, &len);
  if (ret != -FI_ETOOSMALL && ret != 0) return fail("fi_getname", ret);
  im->name.assign(len, '\0');
  if ((ret = fi_getname(&im->ep->fid, im->name.data(), &len))) return fail("fi_getname", ret);
  im->name.resize(len);

  // The control receive ring.
  im->ring_mem.reset(new uint8_t[kControlRing * kMaxControlBytes]);
  if (im->need_desc)
    CAIRN_RETURN_IF_ERROR(
        im->reg_mr(im->ring_mem.get(), kControlRing * kMaxControlBytes, FI_RECV, &im->ring_mr, &im->ring_desc));
  Impl* raw = im.get();
  raw->progress = std::thread([raw] { raw->progress_loop(); });
  for (size_t i = 0; i < kControlRing; ++i) {
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kControlRecv;
    op->tag = kControlTag;
    op->data = raw->ring_mem.get() + i * kMaxControlBytes;
    op->length = kMaxControlBytes;
    op->desc = raw->ring_desc;
    Status st = raw->submit(op.get());
    raw->ring.push_back(std::move(op));
    if (!st.ok()) return st;
  }
  std::unique_ptr<Fabric> f(new Fabric(std::move(im)));
  CAIRN_LOG_DEBUG("{}: open at {} (mr_mode {:#x}, {} data progress, {})", raw->where(), f->address_text(), mr_mode,
                  info->domain_attr->data_progress == FI_PROGRESS_MANUAL ? "manual" : "auto",
                  raw->cq_waitable ? "fi_cq_sread" : "polling");
  return f;
}

Fabric::Fabric(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Fabric::~Fabric() = default;

const std::string& Fabric::address() const { return impl_->name; }

std::string Fabric::address_text() const {
  char buf[256] = {};
  size_t len = sizeof buf;
  const char* s = fi_av_straddr(impl_->av, impl_->name.data(), buf, &len);
  return s ? std::string(s) : std::string();
}

std::string Fabric::provider() const { return impl_->prov_name; }

void Fabric::set_control_handler(ControlHandler handler) {
  auto h = std::make_shared<const ControlHandler>(std::move(handler));
  std::lock_guard l(impl_->handler_mu);
  impl_->handler = std::move(h);
}

Result<uint64_t> Fabric::add_peer(const std::string& address) {
  Impl& im = *impl_;
  if (address.empty()) return invalid_argument(im.where() + ": add_peer: the address is empty");
  if (im.info->src_addrlen && im.info->addr_format != FI_ADDR_STR && address.size() != im.info->src_addrlen)
    return invalid_argument(im.where() + ": add_peer: an address of " + std::to_string(address.size()) +
                            " bytes, not " + std::to_string(im.info->src_addrlen) + " (from another provider?)");
  fi_addr_t fa = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(im.av, address.data(), 1, &fa, 0, nullptr);
  if (ret != 1 || fa == FI_ADDR_NOTAVAIL)
    return invalid_argument(im.where() + ": add_peer: fi_av_insert: " +
                            (ret < 0 ? fi_error_text(ret) : std::string("the address was not accepted")));
  return static_cast<uint64_t>(fa);
}

void Fabric::remove_peer(uint64_t peer) {
  fi_addr_t fa = peer;
  int ret = fi_av_remove(impl_->av, &fa, 1, 0);
  if (ret) CAIRN_LOG_WARN("{}: remove_peer {}: {}", impl_->where(), peer, fi_error_text(ret));
}

Status Fabric::register_region(void* base, size_t length) {
  Impl& im = *impl_;
  if (!base || length == 0) return invalid_argument(im.where() + ": register_region: an empty region");
  Region r;
  r.base = reinterpret_cast<uintptr_t>(base);
  r.length = length;
  if (im.need_desc) CAIRN_RETURN_IF_ERROR(im.reg_mr(base, length, FI_SEND | FI_RECV, &r.mr, &r.desc));
  std::unique_lock l(im.regions_mu);
  auto [it, inserted] = im.regions.emplace(r.base, r);
  if (!inserted) {
    // Registered again: the larger registration wins; a replaced one stays open until close, for
    // the operations in flight that use its descriptor.
    if (it->second.length >= length) {
      l.unlock();
      Impl::close_mr(r.mr);
      return Status::OK();
    }
    if (it->second.mr) im.retired_mrs.push_back(it->second.mr);
    it->second = r;
  }
  return Status::OK();
}

Status Fabric::send_control(uint64_t peer, std::span<const uint8_t> message, Completion done) {
  Impl& im = *impl_;
  if (message.size() > kMaxControlBytes)
    return invalid_argument(im.where() + ": a control message of " + std::to_string(message.size()) +
                            " bytes (at most " + std::to_string(kMaxControlBytes) + ")");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kControlSend;
  op->tag = kControlTag;
  op->peer = peer;
  op->length = message.size();
  op->done = std::move(done);
  if (im.need_desc) {
    auto slot = im.take_slot();
    if (!slot.ok()) return slot.status();
    op->slot = std::move(slot).value();
    if (!message.empty()) std::memcpy(op->slot->buf.get(), message.data(), message.size());
    op->data = op->slot->buf.get();
    op->desc = op->slot->desc;
  } else {
    op->owned.assign(message.begin(), message.end());
    op->data = op->owned.data();
  }
  Status st = im.submit(op.get());
  if (!st.ok()) {
    if (op->slot) im.give_slot(std::move(op->slot));
    return st;
  }
  op.release();  // the progress thread frees it
  return Status::OK();
}

Status Fabric::post_body_receive(uint64_t tag, void* dst, size_t length, Completion done) {
  Impl& im = *impl_;
  if (!(tag & kBodyTagBit))
    return invalid_argument(im.where() + ": body tag " + std::to_string(tag) + " lacks kBodyTagBit");
  if (!dst && length) return invalid_argument(im.where() + ": a body receive into no memory");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kBodyRecv;
  op->tag = tag;
  op->data = dst;
  op->length = length;
  op->done = std::move(done);
  CAIRN_RETURN_IF_ERROR(im.describe(op.get(), FI_RECV));
  Status st = im.submit(op.get());
  if (!st.ok()) {
    Impl::close_mr(op->temp_mr);
    return st;
  }
  Op* raw = op.release();
  // A cancel (or close) that came while posting found nothing to cancel yet.
  std::lock_guard l(im.mu);
  if (im.in_flight.count(raw) && (raw->cancel_requested || im.closing.load())) fi_cancel(&im.ep->fid, &raw->c);
  return Status::OK();
}

void Fabric::cancel_body_receive(uint64_t tag) {
  Impl& im = *impl_;
  {
    std::lock_guard l(im.mu);
    auto it = im.body_recvs.find(tag);
    if (it == im.body_recvs.end()) return;
    it->second->cancel_requested = true;  // a queued one is failed by the progress thread
    int ret = fi_cancel(&im.ep->fid, &it->second->c);
    if (ret && ret != -FI_ENOENT)
      CAIRN_LOG_DEBUG("{}: fi_cancel of body receive {}: {}", im.where(), tag, fi_error_text(ret));
  }
  im.wake();
}

Status Fabric::send_body(uint64_t peer, uint64_t tag, const void* src, size_t length, Completion done) {
  Impl& im = *impl_;
  if (!(tag & kBodyTagBit))
    return invalid_argument(im.where() + ": body tag " + std::to_string(tag) + " lacks kBodyTagBit");
  if (!src && length) return invalid_argument(im.where() + ": a body send from no memory");
  auto op = std::make_unique<Op>();
  op->kind = OpKind::kBodySend;
  op->tag = tag;
  op->peer = peer;
  op->data = const_cast<void*>(src);  // fi_tsend takes const; the field serves receives too
  op->length = length;
  op->done = std::move(done);
  CAIRN_RETURN_IF_ERROR(im.describe(op.get(), FI_SEND));
  Status st = im.submit(op.get());
  if (!st.ok()) {
    Impl::close_mr(op->temp_mr);
    return st;
  }
  op.release();
  return Status::OK();
}

nlohmann::json Fabric::stats() const {
  const Impl& im = *impl_;
  return {{"provider", im.prov_name},
          {"progress", im.cq_waitable ? "fi_cq_sread" : "polling"},
          {"mr_local", im.need_desc},
          {"control_sent", im.control_sent.load()},
          {"control_received", im.control_received.load()},
          {"body_sent", im.body_sent.load()},
          {"body_received", im.body_received.load()},
          {"bytes_sent", im.bytes_sent.load()},
          {"bytes_received", im.bytes_received.load()},
          {"errors", im.errors.load()}};
}

}  // namespace cairn