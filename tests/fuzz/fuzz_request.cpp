// Fuzzes every op's request decoder (daemon/request.hpp): whatever the bytes, a request is either decoded
// into its op's struct with every field within its bounds, or refused with an invalid-argument
// error that says what was wrong; never a crash. The first byte picks the repository's chunk size.
#include <cstdint>
#include <cstdlib>
#include <set>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "daemon/request.hpp"

namespace {

void refused(const cairn::Status& st) {
  if (st.ok() || st.message().empty()) std::abort();
  if (st.code() != cairn::StatusCode::kInvalidArgument) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const cairn::request::Edge edge{static_cast<uint64_t>(data[0]) + 1};
  auto j = nlohmann::json::parse(data + 1, data + size, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  namespace rq = cairn::request;

  if (auto c = rq::decode_commit(j, edge); c.ok()) {
    if (!cairn::valid_name(c->id) || (!c->parent.empty() && !cairn::valid_name(c->parent))) std::abort();
    if (!c->metadata.is_object() || (c->graph.has_value() == c->architecture.is_null())) std::abort();
    if (c->part && (c->part->of < 2 || c->part->index >= c->part->of || c->part->timeout_ms == 0 || c->inherit_all))
      std::abort();
    std::set<std::string> names;
    for (const auto& t : c->tensors) {
      if (!cairn::valid_name(t.name) || !names.insert(t.name).second) std::abort();
      if (!t.hashes.empty() && t.hashes.size() != cairn::chunk_count(t.desc.nbytes, edge.chunk_size)) std::abort();
    }
  } else {
    refused(c.status());
  }
  if (auto o = rq::decode_open(j); o.ok() ? !cairn::valid_name(o->id) : (refused(o.status()), false)) std::abort();
  for (auto l : {rq::decode_lease(j), rq::decode_lease_device(j)}) {
    if (!l.ok()) {
      refused(l.status());
      continue;
    }
    if (!cairn::valid_name(l->id)) std::abort();
  }
  if (auto p = rq::decode_prefetch(j); p.ok()) {
    if (!cairn::valid_name(p->id) || (p->device && p->tier != rq::Prefetch::Tier::kHbm)) std::abort();
  } else {
    refused(p.status());
  }
  auto leases = j.find("leases");
  if (auto r = rq::decode_release(leases == j.end() ? nullptr : &*leases); !r.ok()) refused(r.status());
  if (auto a = rq::decode_allocate(j); !a.ok()) refused(a.status());
  if (auto f = rq::decode_free(j); !f.ok()) refused(f.status());
  if (auto w = rq::decode_wait(j); !w.ok()) refused(w.status());
  if (auto p = rq::decode_put_tensor(j); p.ok()) {
    if (!cairn::valid_name(p->key)) std::abort();
  } else {
    refused(p.status());
  }
  if (auto k = rq::decode_tensor_key(j); k.ok() ? !cairn::valid_name(k->key) : (refused(k.status()), false))
    std::abort();
  if (auto p = rq::decode_poll_tensor(j); !p.ok()) refused(p.status());

  // Administration, progress, fault injection, queries, hints.
  auto token_ok = [](const rq::ProgressToken& t) { return !t || cairn::valid_name(*t); };
  if (auto l = rq::decode_list(j); !l.ok()) refused(l.status());
  if (auto m = rq::decode_model_id(j); m.ok() ? !cairn::valid_name(m->id) : (refused(m.status()), false)) std::abort();
  if (auto t = rq::decode_tracked(j); t.ok() ? !token_ok(t->progress) : (refused(t.status()), false)) std::abort();
  if (auto f = rq::decode_fsck(j); f.ok() ? !token_ok(f->progress) : (refused(f.status()), false)) std::abort();
  if (auto f = rq::decode_flush(j); f.ok() ? !token_ok(f->progress) : (refused(f.status()), false)) std::abort();
  if (auto p = rq::decode_progress(j); p.ok() ? !cairn::valid_name(p->id) : (refused(p.status()), false)) std::abort();
  if (auto f = rq::decode_fault(j); f.ok()) {
    if ((f->action == rq::Fault::Action::kAdd) != f->rule.has_value()) std::abort();
  } else {
    refused(f.status());
  }
  if (auto q = rq::decode_query(j); q.ok()) {
    using Op = rq::Query::Op;
    if ((q->op == Op::kBestAncestor) != q->graph.has_value()) std::abort();
    if (q->op == Op::kFind && q->contains_path.empty()) std::abort();
    for (const auto& t : q->contains_path)
      if (t.empty()) std::abort();
    if (q->depth < -1) std::abort();
    (void)q->where.matches(j);
  } else {
    refused(q.status());
  }
  if (auto h = rq::decode_hint(j); h.ok()) {
    if (h->models.size() > cairn::kMaxHintModels) std::abort();
    for (const auto& m : h->models)
      if (!cairn::valid_name(m)) std::abort();
  } else {
    refused(h.status());
  }
  return 0;
}
