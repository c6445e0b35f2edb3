// The public C++ interface (include/cairn/client.hpp) against a running cairnd ($CAIRN_SOCKET),
// compiled against the installed headers and libcairn.so only. Run by tests/integration/test_c_api.py.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cairn/client.hpp"

namespace cn = cairn::v1;

static int failures = 0;
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ++failures;                                                           \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
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
  std::vector<float> a(1 << 18), b(64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);

  CHECK(client->put_tensor("cpp/x", b.data(), CAIRN_DTYPE_F32, {8, 8}));
  auto info = client->tensor_info("cpp/x");
  CHECK(info && info->nbytes == 256 && info->shape == std::vector<int64_t>({8, 8}));
  std::vector<float> back(64);
  CHECK(client->unpack_tensor("cpp/x", back.data(), 256));
  CHECK(back == b);
  auto found = client->poll_tensor("cpp/x", 0);
  CHECK(found && *found);

  {
    auto w = client->create_model("cpp-base" + suffix);
    CHECK(w);
    CHECK(w->add("a", a.data(), CAIRN_DTYPE_F32, {512, 512}));
    CHECK(w->add("b", b.data(), CAIRN_DTYPE_F32, {64}));
    CHECK(w->set_metadata("{\"score\": 0.8}"));
    CHECK(w->commit());
  }
  {
    auto w = client->create_model("cpp-child" + suffix, "cpp-base" + suffix);
    CHECK(w->inherit("a"));
    CHECK(w->add("b", a.data(), CAIRN_DTYPE_F32, {64}));
    auto t = w->commit_async(CAIRN_DURABILITY_MEMORY);
    CHECK(t && t->wait());
  }
  {
    auto w = client->create_model("cpp-many" + suffix);
    CHECK(w->add_many({{"a", a.data(), CAIRN_DTYPE_F32, {512, 512}}, {"b", b.data(), CAIRN_DTYPE_F32, {64}}}));
    auto st = w->add_many({{"c", b.data(), CAIRN_DTYPE_F32, {64}}, {"a", a.data(), CAIRN_DTYPE_F32, {4}}});
    CHECK(st.code() == CAIRN_ERR_EXISTS);  // "a" is in already: "c" is not added either
    CHECK(w->commit());
    auto r = client->open_model("cpp-many" + suffix);
    auto ts = r->tensors();
    CHECK(ts && ts->size() == 2 && (*ts)[0].name == "a" && (*ts)[1].name == "b");
  }
  {
    auto dup = client->create_model("cpp-base" + suffix);
    auto st = dup->commit();
    CHECK(st.code() == CAIRN_ERR_EXISTS && st.message().find("cpp-base") != std::string::npos);
  }
  {
    // Pipelined: the duplicate's error is on its ticket, not on the call.
    auto dup = client->create_model("cpp-base" + suffix, "cpp-base" + suffix);
    CHECK(dup->inherit("a"));
    auto t = dup->commit_async(CAIRN_DURABILITY_MEMORY);
    CHECK(t);
    auto next = client->create_model("cpp-next" + suffix, "cpp-base" + suffix);
    CHECK(next->inherit("a"));
    auto t2 = next->commit_async(CAIRN_DURABILITY_MEMORY);
    CHECK(t2);
    auto st = t->wait();
    CHECK(st.code() == CAIRN_ERR_EXISTS && st.message().find("cpp-base") != std::string::npos);
    CHECK(t2->wait());
    CHECK(client->flush_pipeline());
    CHECK(client->in_flight() == 0);
  }
  auto r = client->open_model("cpp-child" + suffix);
  CHECK(r);
  auto ts = r->tensors();
  CHECK(ts && ts->size() == 2 && (*ts)[0].name == "a");
  std::vector<float> got(a.size());
  CHECK(r->read("a", got.data(), got.size() * sizeof(float)));
  CHECK(got == a);
  auto v = r->map("b");
  CHECK(v && v->nbytes == 256 && std::memcmp(v->data, a.data(), 256) == 0);
  // Device memory (docs/gpu.md): this test's daemon has no HBM tier, and the error says so.
  auto dv = r->map_device("b");
  CHECK(!dv && dv.status().code() == CAIRN_ERR_UNAVAILABLE && dv.status().message().find("no HBM tier") != std::string::npos);
  auto q = client->query("{\"op\":\"ancestors\",\"model\":\"cpp-child" + suffix + "\"}");
  CHECK(q && q->find("cpp-base") != std::string::npos);
  CHECK(client->open_model("missing").status().code() == CAIRN_ERR_NOT_FOUND);
  std::printf("cpp_api_test: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
