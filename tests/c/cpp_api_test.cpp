// The public C++ interface (include/cairn/client.hpp) against a running cairnd ($CAIRN_SOCKET),
// compiled against the installed headers and libcairn.so only. Run by tests/integration/test_c_api.py.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cairn/client.hpp"

namespace cn = cairn::v1;

static int failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ++failures;                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
    }                                                                               \
  } while (0)

int main(int argc, char** argv) {
  std::string suffix = argc > 1 ? argv[1] : "";
  auto bad = cn::Client::connect("/nonexistent/cairnd.sock");
  CHECK(!bad && bad.status().code() == CAIRN_ERR_UNAVAILABLE);
  CHECK(bad.status().message().find("/nonexistent/cairnd.sock") != std::string::npos);
  auto client = cn::Client::connect();
  if (!client) {
    std::fprintf(stderr, "connect: %s\n", client.status().message().c_str());
    return 1;
  }
  // The options of the calls below, from their initialisers.
  cairn_commit_options pipelined = CAIRN_COMMIT_OPTIONS_INIT, no_wait = CAIRN_COMMIT_OPTIONS_INIT;
  pipelined.durability = no_wait.durability = CAIRN_DURABILITY_MEMORY;
  pipelined.wait = no_wait.wait = 0;
  pipelined.pipelined = 1;
  cairn_read_options cuda = CAIRN_READ_OPTIONS_INIT, cow = CAIRN_READ_OPTIONS_INIT;
  cuda.kind = CAIRN_MEM_CUDA;
  cow.private_copy = 1;
  cairn_prefetch_options everyone = CAIRN_PREFETCH_OPTIONS_INIT;
  everyone.all = 1;
  std::vector<float> a(1 << 18), b(64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);

  CHECK(client->tensor_put("cpp/x", b.data(), CAIRN_DTYPE_F32, {8, 8}));
  auto info = client->tensor_info("cpp/x");
  CHECK(info && info->nbytes == 256 && info->shape == std::vector<int64_t>({8, 8}));
  std::vector<float> back(64);
  CHECK(client->tensor_unpack("cpp/x", back.data(), 256));
  CHECK(back == b);
  auto found = client->tensor_poll("cpp/x", 0);
  CHECK(found && *found);

  {
    auto w = client->model_create("cpp-base" + suffix);
    CHECK(w);
    CHECK(w->add_tensor("a", a.data(), CAIRN_DTYPE_F32, {512, 512}));
    CHECK(w->add_tensor("b", b.data(), CAIRN_DTYPE_F32, {64}));
    CHECK(w->set_metadata("{\"score\": 0.8}"));
    CHECK(w->commit());
  }
  {
    auto w = client->model_create("cpp-child" + suffix, "cpp-base" + suffix);
    CHECK(w->inherit_tensor("a"));
    CHECK(w->add_tensor("b", a.data(), CAIRN_DTYPE_F32, {64}));
    auto t = w->commit(pipelined);
    CHECK(t && t->wait());
  }
  {
    auto w = client->model_create("cpp-many" + suffix);
    CHECK(w->add_tensors({{"a", a.data(), CAIRN_DTYPE_F32, {512, 512}}, {"b", b.data(), CAIRN_DTYPE_F32, {64}}}));
    auto st = w->add_tensors({{"c", b.data(), CAIRN_DTYPE_F32, {64}}, {"a", a.data(), CAIRN_DTYPE_F32, {4}}});
    CHECK(st.code() == CAIRN_ERR_EXISTS);  // "a" is in already: "c" is not added either
    CHECK(w->commit());
    auto r = client->model_open("cpp-many" + suffix);
    auto ts = r->tensors();
    CHECK(ts && ts->size() == 2 && (*ts)[0].name == "a" && (*ts)[1].name == "b");
  }
  {
    auto dup = client->model_create("cpp-base" + suffix);
    auto st = dup->commit();
    CHECK(st.code() == CAIRN_ERR_EXISTS && st.message().find("cpp-base") != std::string::npos);
  }
  {
    // Pipelined: the duplicate's error is on its ticket, not on the call.
    auto dup = client->model_create("cpp-base" + suffix, "cpp-base" + suffix);
    CHECK(dup->inherit_tensor("a"));
    auto t = dup->commit(pipelined);
    CHECK(t);
    auto next = client->model_create("cpp-next" + suffix, "cpp-base" + suffix);
    CHECK(next->inherit_tensor("a"));
    auto t2 = next->commit(pipelined);
    CHECK(t2);
    auto st = t->wait();
    CHECK(st.code() == CAIRN_ERR_EXISTS && st.message().find("cpp-base") != std::string::npos);
    CHECK(t2->wait());
    CHECK(client->pipeline_flush());
    CHECK(client->pipeline_in_flight() == 0);
  }
  auto r = client->model_open("cpp-child" + suffix);
  CHECK(r);
  auto ts = r->tensors();
  CHECK(ts && ts->size() == 2 && (*ts)[0].name == "a");
  std::vector<float> got(a.size());
  CHECK(r->read_tensor("a", got.data(), got.size() * sizeof(float)));
  CHECK(got == a);
  auto v = r->map_tensor("b");
  CHECK(v && v->nbytes == 256 && std::memcmp(v->data, a.data(), 256) == 0);
  // Device memory (docs/gpu.md): this test's daemon has no HBM tier, and the error says so.
  auto dv = r->map({"b"}, cuda);
  CHECK(!dv && dv.status().code() == CAIRN_ERR_UNAVAILABLE &&
        dv.status().message().find("no HBM tier") != std::string::npos);
  auto q = client->query("{\"op\":\"ancestors\",\"model\":\"cpp-child" + suffix + "\"}");
  CHECK(q && q->find("cpp-base") != std::string::npos);
  CHECK(client->model_open("missing").status().code() == CAIRN_ERR_NOT_FOUND);

  // The rest of the C API, one call each.
  CHECK(std::string(cn::status_name(CAIRN_ERR_NOT_FOUND)) == "CAIRN_ERR_NOT_FOUND");
  CHECK(cn::status_name(-12345) == nullptr);
  CHECK(std::strlen(cn::status_string(CAIRN_ERR_NOT_FOUND)) > 0);
  CHECK(cn::library_has_cuda() == (cairn_library_has_cuda() != 0));
  CHECK(!client->address().empty());
  {
    std::vector<float> into;
    CHECK(client->tensor_unpack_alloc("cpp/x", [&](const cn::TensorInfo& t) -> void* {
      CHECK(t.name == "cpp/x" && t.dtype == CAIRN_DTYPE_F32 && t.shape == std::vector<int64_t>({8, 8}));
      into.resize(t.nbytes / sizeof(float));
      return into.data();
    }));
    CHECK(into == b);
    auto none = client->tensor_unpack_alloc("cpp/none", [](const cn::TensorInfo&) -> void* { return nullptr; });
    CHECK(none.code() == CAIRN_ERR_NOT_FOUND);
    auto refused = client->tensor_unpack_alloc("cpp/x", [](const cn::TensorInfo&) -> void* { return nullptr; });
    CHECK(refused.code() == CAIRN_ERR_NO_SPACE);
  }
  {
    // Arena space filled in place and sealed, reserved sizes, one copy thread, everything else inherited.
    auto w = client->model_create("cpp-space" + suffix, "cpp-base" + suffix);
    CHECK(w->set_copy_threads(1));
    CHECK(w->reserve({a.size() * sizeof(float)}));
    auto space = w->add_tensor_space("a", CAIRN_DTYPE_F32, {512, 512});
    CHECK(space && *space != nullptr);
    if (space) std::memcpy(*space, b.data(), b.size() * sizeof(float));
    if (space)
      std::memcpy(static_cast<float*>(*space) + b.size(), a.data() + b.size(), (a.size() - b.size()) * sizeof(float));
    CHECK(w->seal_tensor("a"));
    CHECK(w->seal_tensor("a").code() == CAIRN_ERR_INVALID_ARGUMENT);  // sealed already
    CHECK(w->inherit_all());
    CHECK(w->commit());
    auto rs = client->model_open("cpp-space" + suffix);
    CHECK(rs);
    auto views = rs->map({"a", "b"});
    CHECK(views && views->size() == 2 && (*views)[0].nbytes == a.size() * sizeof(float));
    if (views) {
      CHECK(std::memcmp((*views)[0].data, b.data(), b.size() * sizeof(float)) == 0);
      CHECK(std::memcmp((*views)[1].data, b.data(), b.size() * sizeof(float)) == 0);  // b inherited
    }
    CHECK(rs->map({"a", "missing"}).status().code() == CAIRN_ERR_NOT_FOUND);
    auto priv = rs->map({"b"}, cow);
    CHECK(priv && (*priv)[0].nbytes == 256);
    if (priv) static_cast<float*>((*priv)[0].data)[0] = 42.0f;  // this process's copy only
    std::vector<float> b_back(b.size()), a_back(a.size());
    CHECK(rs->read({"b", "a"}, {b_back.data(), a_back.data()}, {256, a.size() * sizeof(float)}));
    CHECK(b_back == b);
    CHECK(rs->read({"b"}, {b_back.data(), a_back.data()}, {256}).code() == CAIRN_ERR_INVALID_ARGUMENT);
    auto dev = rs->map({"b"}, cuda);
    CHECK(!dev && dev.status().code() == CAIRN_ERR_UNAVAILABLE);
  }
  {
    // A model of two parts from two writers; each part's ticket resolves when both are in.
    auto p0 = client->model_create_part("cpp-parts" + suffix, "", 0, 2);
    auto p1 = client->model_create_part("cpp-parts" + suffix, "", 1, 2);
    CHECK(p0 && p1);
    CHECK(p0->add_tensor("first", b.data(), CAIRN_DTYPE_F32, {64}));
    CHECK(p1->add_tensor("second", a.data(), CAIRN_DTYPE_F32, {64}));
    auto t0 = p0->commit(no_wait);
    auto t1 = p1->commit(no_wait);
    CHECK(t0 && t1 && t0->wait() && t1->wait());
    auto rp = client->model_open("cpp-parts" + suffix);
    auto tp = rp->tensors();
    CHECK(tp && tp->size() == 2 && (*tp)[0].name == "first" && (*tp)[1].name == "second");
  }
  {
    // Files: a model out as safetensors and back in, byte for byte.
    const std::string path = "/tmp/cpp_api_test" + suffix + "-" + std::to_string(::getpid()) + ".safetensors";
    CHECK(client->model_get_file("cpp-base" + suffix, path));
    CHECK(client->model_put_file("cpp-file" + suffix, path, "cpp-base" + suffix, CAIRN_DURABILITY_MEMORY,
                                 "{\"from\": \"file\"}"));
    auto rf = client->model_open("cpp-file" + suffix);
    std::vector<float> got_b(b.size());
    CHECK(rf && rf->read_tensor("b", got_b.data(), 256));
    CHECK(got_b == b);
    CHECK(client->model_put_file("cpp-bad" + suffix, "/nonexistent.safetensors").code() != CAIRN_OK);
    // With options: architecture and metadata in, progress reported, one tensor out.
    cairn_file_options fo = CAIRN_FILE_OPTIONS_INIT;
    const std::string parent = "cpp-base" + suffix;
    fo.parent = parent.c_str();
    fo.durability = CAIRN_DURABILITY_MEMORY;
    fo.metadata_json = "{\"epoch\": 3}";
    fo.architecture_json =
        R"({"layers": [{"name": "fc", "type": "Linear", "config": {}, "inputs": []}], "tensors": {"a": "fc", "b": "fc"}})";
    std::vector<std::string> phases;
    uint64_t last_done = 0;
    auto progress = [&](const char* phase, uint64_t done, uint64_t) {
      phases.emplace_back(phase);
      last_done = std::max(last_done, done);
    };
    CHECK(client->model_put_file("cpp-file-opts" + suffix, path, fo, progress));
    CHECK(!phases.empty() && phases.back() == "committing" && last_done == (a.size() + b.size()) * sizeof(float));
    auto ro = client->model_open("cpp-file-opts" + suffix);
    auto desc = ro ? ro->describe() : cn::Result<cn::Reader::Description>(ro.status());
    CHECK(desc && desc->id == "cpp-file-opts" + suffix && desc->parent == parent &&
          desc->metadata_json.find("\"epoch\":3") != std::string::npos);
    const char* only[] = {"b"};
    cairn_file_options go = CAIRN_FILE_OPTIONS_INIT;
    go.names = only;
    go.count = 1;
    phases.clear();
    last_done = 0;
    CHECK(client->model_get_file("cpp-file-opts" + suffix, path, go, progress));
    CHECK(!phases.empty() && last_done == 256);
    const cairn_file_options defaults = CAIRN_FILE_OPTIONS_INIT;
    CHECK(client->model_put_file("cpp-file-opts2" + suffix, path, defaults));
    auto r2 = client->model_open("cpp-file-opts2" + suffix);
    auto t2 = r2 ? r2->tensors() : cn::Result<std::vector<cn::TensorInfo>>(r2.status());
    CHECK(t2 && t2->size() == 1 && (*t2)[0].name == "b");
    std::remove(path.c_str());
  }
  {
    auto all = client->model_prefetch("cpp-base" + suffix, everyone);
    CHECK(all && all->find("\"peers\":false") != std::string::npos);
    auto listed = client->request("{\"op\":\"list\"}");
    CHECK(listed && listed->find("cpp-file" + suffix) != std::string::npos);
    CHECK(client->request("{\"op\":\"show\",\"id\":\"no-such-model\"}").status().code() == CAIRN_ERR_NOT_FOUND);
  }
  {
    // The calls of cairn.h not used above, one each.
    CHECK(client->tensor_delete("cpp/x"));
    auto gone = client->tensor_poll("cpp/x", 0);
    CHECK(gone && !*gone);
    auto hinted = client->hint("{\"kind\":\"will_load\",\"models\":[\"cpp-base" + suffix + "\"]}");
    CHECK(hinted && hinted->find("unknown") != std::string::npos);
    auto staged = client->model_prefetch("cpp-base" + suffix);
    CHECK(staged && staged->find("\"bytes\"") != std::string::npos);
    CHECK(client->request("{\"op\":\"query\",\"query\":{}}").status().code() == CAIRN_ERR_INVALID_ARGUMENT);
    auto r2 = client->model_open("cpp-base" + suffix);
    auto n = r2->tensor_count();
    CHECK(n && *n == 2);
    auto t1 = r2->tensor_info(1);
    CHECK(t1 && t1->name == "b" && t1->nbytes == 256);
    CHECK(r2->tensor_info(2).status().code() == CAIRN_ERR_INVALID_ARGUMENT);
    std::vector<float> got_b(b.size());
    CHECK(r2->read({"b"}, {got_b.data()}, {256}));
    CHECK(got_b == b);
    r2->close();
    // A waited commit gives an empty ticket, which is done; abort drops a model.
    auto w = client->model_create("cpp-waited" + suffix, "cpp-base" + suffix);
    CHECK(w->inherit_all());
    auto done = w->commit(CAIRN_COMMIT_OPTIONS_INIT);
    CHECK(done && done->wait(0));
    auto dropped = client->model_create("cpp-dropped" + suffix);
    dropped->abort();
    CHECK(client->model_open("cpp-dropped" + suffix).status().code() == CAIRN_ERR_NOT_FOUND);
  }
  {
    // The names kept for one release still work (client.hpp marks them [[deprecated]]).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK(client->put_tensor("cpp/old", b.data(), CAIRN_DTYPE_F32, {64}));
    std::vector<float> back_old(64);
    CHECK(client->unpack_tensor("cpp/old", back_old.data(), 256) && back_old == b);
    auto polled = client->poll_tensor("cpp/old", 0);
    CHECK(polled && *polled);
    CHECK(client->delete_tensor("cpp/old"));
    auto w = client->create_model("cpp-old" + suffix, "cpp-base" + suffix);
    CHECK(w && w->inherit("a") && w->add("b", b.data(), CAIRN_DTYPE_F32, {64}));
    auto t = w->commit_async(CAIRN_DURABILITY_MEMORY);
    CHECK(t && t->wait());
    CHECK(client->flush_pipeline() && client->in_flight() == 0);
    auto old_r = client->open_model("cpp-old" + suffix);
    std::vector<float> old_got(64);
    CHECK(old_r && old_r->read("b", old_got.data(), 256) && old_got == b);
    auto old_v = old_r->map("b");
    CHECK(old_v && old_v->nbytes == 256);
    auto many = old_r->map_many({"a", "b"});
    CHECK(many && many->size() == 2);
    CHECK(old_r->map_device("b").status().code() == CAIRN_ERR_UNAVAILABLE);
    CHECK(client->prefetch("cpp-old" + suffix));
    auto all = client->prefetch_all("cpp-old" + suffix);
    CHECK(all && all->find("\"peers\":false") != std::string::npos);
#pragma GCC diagnostic pop
  }
  std::printf("cpp_api_test: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
