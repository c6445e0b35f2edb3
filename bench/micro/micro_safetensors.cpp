// The safetensors codec on headers of real-model size: parse_header (the strict reader) and
// build_header (the writer), against nlohmann::json parsing and dumping the same header, which is
// what a reader or writer that does not validate costs.
//
// Headers (F32 tensors, names as in the real state dicts):
//   resnet50   torchvision's resnet50().state_dict(): 320 entries (53 convolutions, 53 batch norms
//              with running statistics and the I64 num_batches_tracked scalar, the fc layer).
//   bert_base  Hugging Face's BertModel (bert-base-uncased) state dict: 199 entries (embeddings, 12
//              layers of separate Q/K/V, the pooler).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "core/safetensors.hpp"

namespace {

using cairn::DType;
using cairn::safetensors::TensorEntry;

void add(std::vector<TensorEntry>& out, const std::string& name, std::vector<int64_t> shape,
         DType dtype = DType::kF32) {
  TensorEntry t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  out.push_back(std::move(t));
}

void add_batch_norm(std::vector<TensorEntry>& out, const std::string& p, int64_t c) {
  add(out, p + ".weight", {c});
  add(out, p + ".bias", {c});
  add(out, p + ".running_mean", {c});
  add(out, p + ".running_var", {c});
  add(out, p + ".num_batches_tracked", {}, DType::kI64);
}

std::vector<TensorEntry> resnet50_tensors() {
  std::vector<TensorEntry> t;
  add(t, "conv1.weight", {64, 3, 7, 7});
  add_batch_norm(t, "bn1", 64);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t width = int64_t{64} << layer, out_c = width * 4;
    for (int b = 0; b < blocks[layer]; ++b) {
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(b);
      add(t, p + ".conv1.weight", {width, in, 1, 1});
      add_batch_norm(t, p + ".bn1", width);
      add(t, p + ".conv2.weight", {width, width, 3, 3});
      add_batch_norm(t, p + ".bn2", width);
      add(t, p + ".conv3.weight", {out_c, width, 1, 1});
      add_batch_norm(t, p + ".bn3", out_c);
      if (b == 0) {
        add(t, p + ".downsample.0.weight", {out_c, in, 1, 1});
        add_batch_norm(t, p + ".downsample.1", out_c);
      }
      in = out_c;
    }
  }
  add(t, "fc.weight", {1000, 2048});
  add(t, "fc.bias", {1000});
  return t;
}

std::vector<TensorEntry> bert_base_tensors() {
  std::vector<TensorEntry> t;
  const int64_t d = 768, ffn = 3072;
  add(t, "embeddings.word_embeddings.weight", {30522, d});
  add(t, "embeddings.position_embeddings.weight", {512, d});
  add(t, "embeddings.token_type_embeddings.weight", {2, d});
  add(t, "embeddings.LayerNorm.weight", {d});
  add(t, "embeddings.LayerNorm.bias", {d});
  for (int l = 0; l < 12; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m : {"query", "key", "value"}) {
      add(t, p + "attention.self." + m + ".weight", {d, d});
      add(t, p + "attention.self." + m + ".bias", {d});
    }
    add(t, p + "attention.output.dense.weight", {d, d});
    add(t, p + "attention.output.dense.bias", {d});
    add(t, p + "attention.output.LayerNorm.weight", {d});
    add(t, p + "attention.output.LayerNorm.bias", {d});
    add(t, p + "intermediate.dense.weight", {ffn, d});
    add(t, p + "intermediate.dense.bias", {ffn});
    add(t, p + "output.dense.weight", {d, ffn});
    add(t, p + "output.dense.bias", {d});
    add(t, p + "output.LayerNorm.weight", {d});
    add(t, p + "output.LayerNorm.bias", {d});
  }
  add(t, "pooler.dense.weight", {d, d});
  add(t, "pooler.dense.bias", {d});
  return t;
}

struct Model {
  std::string name;
  std::vector<TensorEntry> tensors;  // offsets assigned by build_header
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  std::string prefix;  // 8-byte length + JSON, as build_header wrote it
  uint64_t file_size = 0;
};

Model make_model(const std::string& name, std::vector<TensorEntry> tensors) {
  Model m{name, std::move(tensors)};
  auto prefix = cairn::safetensors::build_header(m.tensors, &m.metadata);
  if (!prefix.ok()) throw std::runtime_error("build_header(" + name + "): " + prefix.status().to_string());
  m.prefix = std::move(*prefix);
  m.file_size = m.prefix.size() + m.tensors.back().end;
  return m;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void set_counters(benchmark::State& state, const Model& m) {
  state.counters["tensors"] = static_cast<double>(m.tensors.size());
  state.counters["header_bytes"] = static_cast<double>(m.prefix.size());
}

void parse_cairn(benchmark::State& state, const Model* m) {
  for (auto _ : state) {
    auto h = cairn::safetensors::parse_header(bytes_of(m->prefix), m->file_size);
    if (!h.ok()) {
      state.SkipWithError(h.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(h->tensors.data());
  }
  set_counters(state, *m);
}

// Parsing the same JSON without any checks, into nlohmann's generic tree.
void parse_json(benchmark::State& state, const Model* m) {
  const std::string_view js(m->prefix.data() + 8, m->prefix.size() - 8);
  for (auto _ : state) {
    auto j = nlohmann::json::parse(js);
    benchmark::DoNotOptimize(j.size());
  }
  set_counters(state, *m);
}

void build_cairn(benchmark::State& state, const Model* m) {
  std::vector<TensorEntry> tensors = m->tensors;
  for (auto _ : state) {
    auto prefix = cairn::safetensors::build_header(tensors, &m->metadata);
    if (!prefix.ok()) {
      state.SkipWithError(prefix.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(prefix->data());
  }
  set_counters(state, *m);
}

// Building the same header as a nlohmann object (offsets computed the same way) and dumping it.
void build_json(benchmark::State& state, const Model* m) {
  for (auto _ : state) {
    nlohmann::json j = nlohmann::json::object();
    j["__metadata__"] = m->metadata;
    uint64_t offset = 0;
    for (const auto& t : m->tensors) {
      const uint64_t n = t.nbytes();
      j[t.name] = {{"dtype", cairn::dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
    std::string s = j.dump();
    benchmark::DoNotOptimize(s.data());
  }
  set_counters(state, *m);
}

}  // namespace

namespace cairn::bench {

void register_safetensors_benchmarks() {
  static const Model models[] = {make_model("resnet50", resnet50_tensors()),
                                 make_model("bert_base", bert_base_tensors())};
  using cairn::bench::bench_name;
  for (const Model& m : models) {
    benchmark::RegisterBenchmark(bench_name("safetensors_parse", m.name, "cairn").c_str(), parse_cairn, &m)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("safetensors_parse", m.name, "json_parse").c_str(), parse_json, &m)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  for (const Model& m : models) {
    benchmark::RegisterBenchmark(bench_name("safetensors_build", m.name, "cairn").c_str(), build_cairn, &m)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("safetensors_build", m.name, "json_dump").c_str(), build_json, &m)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

}  // namespace cairn::bench
