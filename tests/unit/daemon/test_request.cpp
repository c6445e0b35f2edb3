// The request decoders and encoders (daemon/request.hpp): what a well-formed request becomes, and
// that every malformed one is refused with a message naming the op (or model) and the field.
#include <catch2/catch.hpp>
#include <cerrno>

#include "daemon/request.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {
namespace {

using nlohmann::json;
namespace rq = request;

// A request as the server decodes it from a frame (non-negative integers are unsigned there).
json wire(const json& j) { return json::parse(j.dump()); }

void refused(const Status& st, const std::string& names) {
  INFO(st.to_string());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find(names) != std::string::npos);
}

TEST_CASE("request: a commit decodes into its fields, in order", "[request]") {
  json req{{"op", "commit"},
           {"id", "m"},
           {"parent", "p"},
           {"durability", "memory"},
           {"wait", false},
           {"ticket", false},
           {"metadata", {{"score", 1}}},
           {"tensors",
            {{{"name", "w"}, {"dtype", "F32"}, {"shape", {2, 3}}, {"inline", {4, 24}}},
             {{"name", "s"},
              {"dtype", "U8"},
              {"shape", {40}},
              {"space", 7},
              {"hashes", {std::string(32, 'a'), std::string(32, 'b'), std::string(32, 'c')}}},
             {{"name", "b"}, {"inherit", true}}}}};
  auto c = rq::decode_commit(wire(req), {16});
  REQUIRE(c.ok());
  CHECK(c->id == "m");
  CHECK(c->parent == "p");
  CHECK(c->durability == Durability::kMemory);
  CHECK_FALSE(c->wait);
  CHECK_FALSE(c->want_ticket);
  CHECK(c->metadata == json{{"score", 1}});
  CHECK(c->architecture.is_null());
  CHECK_FALSE(c->graph);
  CHECK_FALSE(c->part);
  REQUIRE(c->tensors.size() == 3);
  CHECK(c->tensors[0].source == rq::CommitTensor::Source::kInline);
  CHECK(c->tensors[0].desc.nbytes == 24);
  CHECK(c->tensors[0].inline_offset == 4);
  CHECK(c->tensors[0].inline_length == 24);
  CHECK(c->tensors[1].source == rq::CommitTensor::Source::kSpace);
  CHECK(c->tensors[1].space == 7);
  CHECK(c->tensors[1].hashes.size() == 3);  // 40 bytes in chunks of 16
  CHECK(c->tensors[2].source == rq::CommitTensor::Source::kInherit);

  // The defaults: global, waited, with a ticket, no parent.
  auto d = rq::decode_commit(json{{"op", "commit"}, {"id", "n"}, {"tensors", json::array()}}, {16});
  REQUIRE(d.ok());
  CHECK(d->durability == Durability::kGlobal);
  CHECK(d->wait);
  CHECK(d->want_ticket);
  CHECK(d->parent.empty());
  CHECK(d->metadata == json::object());
}

TEST_CASE("request: a malformed commit is refused naming the field", "[request]") {
  auto commit = [](json extra) {
    json req{{"op", "commit"}, {"id", "m"}, {"tensors", json::array()}};
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    return rq::decode_commit(wire(req), {16}).status();
  };
  refused(commit({{"id", 3}}), "'id'");
  refused(commit({{"durability", "disk"}}), "'disk' is not one of memory, local, global");
  // Fields of the wrong type are refused as such, not failed as internal errors.
  refused(commit({{"durability", 2}}), "is not one of memory, local, global");
  refused(commit({{"wait", "yes"}}), "model 'm': 'wait' must be true or false");
  refused(commit({{"ticket", 1}}), "model 'm': 'ticket' must be true or false");
  refused(commit({{"inherit_all", "all"}}), "model 'm': 'inherit_all' must be true or false");
  refused(commit({{"metadata", json::array()}}), "model 'm': metadata must be a JSON object");
  refused(commit({{"tensors", 5}}), "model 'm': missing array field 'tensors'");
  refused(commit({{"part", 1}}), "'part' must be an object");
  refused(commit({{"part", {{"index", 2}, {"of", 2}}}}), "part.index 2 is not below part.of 2");
  refused(commit({{"part", {{"index", 0}, {"of", 1}}}}), "part.of is 1");
  refused(commit({{"part", {{"index", 0}, {"of", 2}}}, {"inherit_all", true}}), "inherit_all cannot be used in a part");
  refused(commit({{"tensors", {7}}}), "each entry of 'tensors' must be an object");
  refused(commit({{"tensors", {{{"name", "w"}, {"inherit", true}}, {{"name", "w"}, {"inherit", true}}}}}),
          "tensor 'w' is given twice");
  refused(commit({{"tensors", {{{"name", "w"}, {"inherit", "yes"}}}}}), "tensor 'w': 'inherit' must be true or false");
  refused(commit({{"tensors", {{{"name", "w"}, {"dtype", "F99"}, {"shape", {1}}, {"space", 1}}}}}),
          "unknown dtype 'F99'");
  refused(commit({{"tensors", {{{"name", "w"}, {"dtype", "U8"}, {"shape", {1}}}}}}),
          "give one of 'space', 'inline' or 'inherit'");
  refused(commit({{"tensors", {{{"name", "w"}, {"dtype", "U8"}, {"shape", {1}}, {"inline", {1}}}}}}),
          "'inline' must be [offset, length]");
  refused(commit({{"tensors", {{{"name", "w"}, {"dtype", "U8"}, {"shape", {40}}, {"space", 1}, {"hashes", {"ab"}}}}}}),
          "'hashes' must be an array of 3 chunk hashes");
  refused(commit({{"tensors", {{{"name", "w"}, {"dtype", "U8"}, {"shape", {4}}, {"space", 1}, {"hashes", {"AB"}}}}}}),
          "hashes[0] is not 32 lowercase hex digits");
}

TEST_CASE("request: reads and named tensors decode, and refuse naming the op and field", "[request]") {
  auto lease = rq::decode_lease(json{{"op", "lease"}, {"id", "m"}, {"tensors", {"a", "b"}}, {"contiguous", true}});
  REQUIRE(lease.ok());
  CHECK(lease->tensors == std::vector<std::string>{"a", "b"});
  CHECK(lease->contiguous);
  refused(rq::decode_lease(json{{"op", "lease"}, {"id", "m"}}).status(),
          "request 'lease': missing array field 'tensors'");
  refused(rq::decode_lease(json{{"op", "lease"}, {"id", "m"}, {"tensors", {1}}}).status(),
          "request 'lease': tensor names must be strings");
  refused(
      rq::decode_lease_device(json{{"op", "lease_device"}, {"id", "m"}, {"tensors", {"a"}}, {"device", "x"}}).status(),
      "request 'lease_device': field 'device' must be an integer");
  json rel = wire({1, -2});
  refused(rq::decode_release(&rel).status(), "request 'release': lease ids must be non-negative integers");
  refused(rq::decode_release(nullptr).status(), "request 'release': missing array field 'leases'");

  auto p = rq::decode_prefetch(
      wire({{"op", "prefetch"}, {"id", "m"}, {"tier", "hbm"}, {"device", 1}, {"all", true}, {"timeout_ms", 5}}));
  REQUIRE(p.ok());
  CHECK(p->tier == rq::Prefetch::Tier::kHbm);
  CHECK(p->device == 1);
  CHECK(p->all);
  CHECK(p->timeout_ms == 5u);
  refused(rq::decode_prefetch(json{{"op", "prefetch"}, {"id", "m"}, {"tier", "nvme"}}).status(), "--tier nvme");
  refused(rq::decode_prefetch(json{{"op", "prefetch"}, {"id", "m"}, {"all", 1}}).status(),
          "request 'prefetch': field 'all' must be true or false");

  auto put = rq::decode_put_tensor(json{{"op", "put_tensor"}, {"key", "k"}, {"dtype", "I32"}, {"shape", {3}}});
  REQUIRE(put.ok());
  CHECK(put->desc.nbytes == 12);
  CHECK_FALSE(put->space);
  refused(rq::decode_tensor_key(json{{"op", "tensor_info"}}).status(),
          "request 'tensor_info': missing string field 'key'");
}

TEST_CASE("request: administration requests decode, and refuse naming the op and field", "[request]") {
  auto list = rq::decode_list(json{{"op", "list"}, {"all", true}});
  REQUIRE(list.ok());
  CHECK(list->all);
  CHECK_FALSE(rq::decode_list(json{{"op", "list"}})->all);
  refused(rq::decode_list(json{{"op", "list"}, {"all", "yes"}}).status(),
          "request 'list': 'all' must be true or false");

  auto show = rq::decode_model_id(json{{"op", "show"}, {"id", "m"}});
  REQUIRE(show.ok());
  CHECK(show->id == "m");
  refused(rq::decode_model_id(json{{"op", "show"}}).status(), "request 'show': missing string field 'id'");
  refused(rq::decode_model_id(json{{"op", "show"}, {"id", ""}}).status(), "a model id must be 1..");
  refused(rq::decode_model_id(json{{"op", "remove"}, {"id", 3}}).status(),
          "request 'remove': missing string field 'id'");

  // The long ones: the progress token is optional and must be a name.
  auto gc = rq::decode_tracked(json{{"op", "gc"}, {"progress", "t1"}});
  REQUIRE(gc.ok());
  CHECK(gc->progress == std::optional<std::string>("t1"));
  CHECK_FALSE(rq::decode_tracked(json{{"op", "gc"}})->progress);
  refused(rq::decode_tracked(json{{"op", "gc"}, {"progress", 7}}).status(),
          "request 'gc': missing string field 'progress'");
  refused(rq::decode_tracked(json{{"op", "sync"}, {"progress", ""}}).status(), "a progress token must be 1..");
  auto prefetch = rq::decode_prefetch(json{{"op", "prefetch"}, {"id", "m"}, {"progress", "p"}});
  REQUIRE(prefetch.ok());
  CHECK(prefetch->progress == std::optional<std::string>("p"));

  auto fsck = rq::decode_fsck(json{{"op", "fsck"}, {"verify", false}, {"progress", "f"}});
  REQUIRE(fsck.ok());
  CHECK_FALSE(fsck->verify);
  CHECK(fsck->progress == std::optional<std::string>("f"));
  CHECK(rq::decode_fsck(json{{"op", "fsck"}})->verify);
  refused(rq::decode_fsck(json{{"op", "fsck"}, {"verify", 0}}).status(),
          "request 'fsck': 'verify' must be true or false");

  auto flush = rq::decode_flush(wire({{"op", "flush"}, {"timeout_ms", 250}}));
  REQUIRE(flush.ok());
  CHECK(flush->timeout_ms == 250);
  CHECK(rq::decode_flush(json{{"op", "flush"}})->timeout_ms == -1);  // forever

  auto progress = rq::decode_progress(json{{"op", "progress"}, {"id", "t1"}});
  REQUIRE(progress.ok());
  CHECK(progress->id == "t1");
  refused(rq::decode_progress(json{{"op", "progress"}}).status(), "request 'progress': missing string field 'id'");
}

TEST_CASE("request: fault, query and hint requests decode, and refuse naming the field", "[request]") {
  auto add =
      rq::decode_fault(wire({{"op", "fault"},
                             {"action", "add"},
                             {"rule", {{"op", "write"}, {"path", "/packs/"}, {"error", "ENOSPC"}, {"times", 2}}}}));
  REQUIRE(add.ok());
  CHECK(add->action == rq::Fault::Action::kAdd);
  REQUIRE(add->rule);
  CHECK(add->rule->op == FaultyFileSystem::Op::kWrite);
  CHECK(add->rule->path_contains == "/packs/");
  CHECK(add->rule->err == ENOSPC);
  CHECK(add->rule->times == 2);
  CHECK(rq::decode_fault(json{{"op", "fault"}, {"action", "list"}})->action == rq::Fault::Action::kList);
  CHECK(rq::decode_fault(json{{"op", "fault"}, {"action", "clear"}})->action == rq::Fault::Action::kClear);
  refused(rq::decode_fault(json{{"op", "fault"}}).status(), "fault: field 'action' must be one of add, list, clear");
  refused(rq::decode_fault(json{{"op", "fault"}, {"action", "drop"}}).status(),
          "fault: field 'action': \"drop\" is not one of add, list, clear");
  refused(rq::decode_fault(json{{"op", "fault"}, {"action", "add"}}).status(), "fault: field 'rule' is missing");
  refused(rq::decode_fault(json{{"op", "fault"}, {"action", "add"}, {"rule", {{"op", "write"}, {"error", "ENOPE"}}}})
              .status(),
          "fault: field 'rule.error'");

  auto query = [](json q) { return rq::decode_query(wire({{"op", "query"}, {"query", std::move(q)}})); };
  auto ancestors = query({{"op", "ancestors"}, {"model", "C"}, {"depth", 2}});
  REQUIRE(ancestors.ok());
  CHECK(ancestors->op == rq::Query::Op::kAncestors);
  CHECK(ancestors->model == "C");
  CHECK(ancestors->depth == 2);
  CHECK(query({{"op", "descendants"}, {"model", "A"}})->depth == -1);
  auto lca = query({{"op", "lca"}, {"models", {"a", "b"}}});
  REQUIRE(lca.ok());
  CHECK((lca->a == "a" && lca->b == "b"));
  auto path = query({{"op", "path"}, {"from", "a"}, {"to", "b"}});
  REQUIRE(path.ok());
  CHECK((path->op == rq::Query::Op::kPath && path->from == "a" && path->to == "b"));
  auto find = query(
      {{"op", "find"}, {"contains_path", {"Conv2d", "ReLU"}}, {"limit", 5}, {"where", {{"score", {{">=", 0.5}}}}}});
  REQUIRE(find.ok());
  CHECK(find->contains_path == std::vector<std::string>{"Conv2d", "ReLU"});
  CHECK(find->limit == 5);
  CHECK(find->where.matches(json{{"score", 0.7}}));
  CHECK_FALSE(find->where.matches(json{{"score", 0.2}}));
  CHECK(query({{"op", "find"}, {"contains_path", {"Linear"}}})->limit == 1000);
  auto best = query(
      {{"op", "best_ancestor"},
       {"graph",
        {{"layers", {{{"name", "in"}, {"type", "Input"}, {"config", json::object()}, {"inputs", json::array()}}}}}}});
  REQUIRE(best.ok());
  REQUIRE(best->graph);
  CHECK(rq::query_op_name(best->op) == std::string("best_ancestor"));
  refused(rq::decode_query(json{{"op", "query"}}).status(), "request 'query': missing object field 'query'");
  refused(query({{"model", "A"}}).status(), "query: missing string field 'op'");
  refused(query({{"op", "siblings"}}).status(), "query op 'siblings' is not supported");
  refused(query({{"op", "ancestors"}}).status(), "query 'ancestors': missing string field 'model'");
  refused(query({{"op", "ancestors"}, {"model", "A"}, {"depth", "all"}}).status(),
          "query 'ancestors': 'depth' must be");
  refused(query({{"op", "lca"}, {"models", {"a"}}}).status(),
          "query 'lca': 'models' must be an array of two model ids");
  refused(query({{"op", "path"}, {"from", "a"}}).status(), "query 'path': missing string field 'to'");
  refused(query({{"op", "find"}, {"contains_path", json::array()}}).status(), "query 'find': 'contains_path' must be");
  refused(query({{"op", "find"}, {"contains_path", {"Linear"}}, {"limit", -1}}).status(),
          "query 'find': 'limit' must be a non-negative integer");
  refused(query({{"op", "best_ancestor"}}).status(), "query 'best_ancestor': missing object field 'graph'");

  auto hint =
      rq::decode_hint(wire({{"op", "hint"}, {"hint", {{"kind", "sequence"}, {"models", {"a", "b"}}, {"ahead", 3}}}}));
  REQUIRE(hint.ok());
  CHECK(hint->kind == Hint::Kind::kSequence);
  CHECK(hint->models == std::vector<std::string>{"a", "b"});
  CHECK(hint->ahead == 3);
  refused(rq::decode_hint(json{{"op", "hint"}}).status(), "request 'hint': missing object field 'hint'");
  refused(rq::decode_hint(json{{"op", "hint"}, {"hint", {{"kind", "done"}, {"models", {""}}}}}).status(),
          "hint.models[0]");
}

TEST_CASE("request: replies encode as the protocol documents them", "[request]") {
  rq::CommitReply waited;
  waited.id = "m";
  waited.reached = Durability::kMemory;
  CHECK(rq::encode(waited) == json{{"id", "m"}, {"reached", "memory"}});
  rq::CommitReply part;
  part.id = "m";
  part.part = rq::Part{1, 2, 100};
  part.ticket = 9;
  CHECK(rq::encode(part) == json{{"id", "m"}, {"part", 1}, {"of", 2}, {"assembled", false}, {"ticket", 9}});
  rq::LeaseReply lease;
  lease.created_ns = 5;
  lease.leases.push_back({3, {{0, 10}, {64, 6}}, 16});
  CHECK(rq::encode(lease) ==
        json{{"leases", {{{"lease", 3}, {"extents", {{0, 10}, {64, 6}}}, {"nbytes", 16}}}}, {"created_ns", 5}});
  CHECK(rq::encode(rq::PrefetchReply{7, std::nullopt}) == json{{"bytes", 7}});
  CHECK(rq::encode(rq::PrefetchReply{7, 0}) == json{{"bytes", 7}, {"tier", "hbm"}, {"device", 0}});
  auto m = std::make_shared<ModelManifest>();
  m->id = "m";
  m->created_ns = 4;
  m->tensors.push_back(TensorManifest{"w", DType::kF32, {2}, 8, {}});
  json open = rq::encode(rq::OpenReply{m, false});
  CHECK(open["parent"].is_null());
  CHECK(open["tensors"] == json{{{"name", "w"}, {"dtype", "F32"}, {"shape", {2}}, {"nbytes", 8}}});
}

}  // namespace
}  // namespace cairn
