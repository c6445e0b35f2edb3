// Random NAS-like architecture graphs for the catalog's benchmarks and tests (docs/graph-format.md).
//
// A graph is a stem (Conv2d, BatchNorm2d, ReLU, sometimes a MaxPool2d), a body of blocks and a
// classifier head (AdaptiveAvgPool2d, Flatten, optional Dropout, one or two Linear). Blocks:
//   conv      Conv2d + BatchNorm2d + ReLU (sometimes stride 2)
//   residual  two Conv2d/BatchNorm2d, skip connection joined by Add (a 1x1 projection when the
//             width changes), then ReLU
//   branch    two parallel paths from the same input (Conv2d paths of different kernels, or a
//             MaxPool2d + 1x1 Conv2d path) joined by Add or Concat
//   pool      MaxPool2d or AvgPool2d, stride 2
//   dropout   Dropout
// A block is sometimes repeated 2-4 times with the same configuration (a "stage"). Configs are
// realistic and consistent: every Conv2d's in_channels, BatchNorm2d's num_features and Linear's
// in_features follow the channels that reach them, and Add joins equal widths.
//
// mutate() makes a child as regularized evolution does (Real et al., 2019): it copies the parent and
// changes one thing, sometimes two (a kernel or width of one convolution, a block inserted or dropped,
// the head replaced, a dropout rate changed), so the child shares every layer upstream of the change
// with its parent; changes favour the later layers (NasSpace::position_draws), so with the defaults
// a child shares about 60% of its layers with its parent. Children are sometimes renamed wholesale in another naming
// style: layer names do not count in signatures, and the catalog must not depend on them.
//
// Everything is deterministic given the seed of the std::mt19937_64 (the distributions are written
// out here rather than taken from <random>, whose output differs between standard libraries).
// Every graph returned is exactly what parse_graph makes of it (validated, in parse_graph's
// topological order); one in NasSpace::verify_every is checked against parse_graph itself.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/graph.hpp"

namespace cairn::bench {

// The search space: what random graphs and mutations may produce, and the evolution's knobs.
struct NasSpace {
  // Layers per graph, head included. Random graphs are drawn in this range; a mutation that would
  // leave it is tried another way.
  size_t min_layers = 20;
  size_t max_layers = 60;
  int in_channels = 3;
  int classes = 10;
  std::vector<int> stem_widths = {16, 32, 64};
  std::vector<int> widths = {16, 32, 64, 96, 128, 192, 256};
  std::vector<int> kernels = {1, 3, 5, 7};       // residual and Add-branch convolutions use the odd ones > 1
  std::vector<int> head_hidden = {0, 256, 512};  // 0: the head is a single Linear
  std::vector<double> dropouts = {0.1, 0.2, 0.3, 0.5};
  // Relative weights of the block kinds.
  double w_conv = 3, w_residual = 3, w_branch = 2, w_pool = 1, w_dropout = 0.5;
  double p_repeat = 0.3;    // a conv, residual or branch block is repeated 2-4 times
  double p_concat = 0.4;    // a branch block joins by Concat rather than Add
  int max_downsamples = 4;  // stride-2 convolutions and pools per graph
  // Mutation.
  int position_draws = 2;           // where a change goes: the latest of this many uniform draws (1: uniform)
  double p_second_mutation = 0.25;  // a child gets two changes instead of one
  double p_rename = 0.3;            // a child's layers are all renamed
  // Regularized evolution.
  size_t population = 64;
  size_t sample = 16;     // tournament size: the parent is the best of this many random members
  double p_fresh = 0.05;  // a new model is a fresh random graph rather than a mutation
  // Every this many graphs, one also goes through JSON and parse_graph and must come out identical
  // (1: all of them; 0: none). See finish().
  uint32_t verify_every = 16;
};

namespace nas_detail {

using nlohmann::json;

// Portable draws (same numbers with every standard library). The modulo bias is < 2^-50.
inline uint64_t below(std::mt19937_64& rng, uint64_t n) { return n == 0 ? 0 : rng() % n; }
inline double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
inline bool chance(std::mt19937_64& rng, double p) { return uniform(rng) < p; }
inline double normal(std::mt19937_64& rng) {  // Box-Muller
  double u = std::max(uniform(rng), 1e-300), v = uniform(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}
template <typename T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[below(rng, v.size())];
}
// Like pick, but different from `not_this` when v offers another value.
template <typename T>
T pick_other(std::mt19937_64& rng, const std::vector<T>& v, const T& not_this) {
  std::vector<T> others;
  for (const auto& x : v)
    if (x != not_this) others.push_back(x);
  return others.empty() ? not_this : pick(rng, others);
}
// An element of v, the latest of `draws` uniform picks (favours the end of v).
template <typename T>
const T& pick_late(std::mt19937_64& rng, const std::vector<T>& v, int draws) {
  uint64_t i = below(rng, v.size());
  for (int d = 1; d < draws; ++d) i = std::max(i, below(rng, v.size()));
  return v[i];
}
inline std::string hex_tag(std::mt19937_64& rng) {
  char buf[12];
  std::snprintf(buf, sizeof buf, "%06llx", static_cast<unsigned long long>(rng() & 0xffffff));
  return buf;
}

// ---- layers ----

inline json conv_config(int cin, int cout, int k, int stride) {
  return {{"in_channels", cin}, {"out_channels", cout}, {"kernel_size", k},
          {"stride", stride},   {"padding", k / 2},     {"bias", false}};
}

// Appends layers to a list in topological order and returns their names.
struct Emitter {
  std::vector<Layer>& layers;
  std::string add(std::string name, const char* type, json config, std::vector<std::string> inputs) {
    layers.push_back(Layer{std::move(name), type, std::move(config), std::move(inputs)});
    return layers.back().name;
  }
  std::string conv_bn_relu(const std::string& p, const std::string& in, int cin, int cout, int k, int stride) {
    std::vector<std::string> ins;
    if (!in.empty()) ins.push_back(in);
    add(p + ".conv", "Conv2d", conv_config(cin, cout, k, stride), std::move(ins));
    add(p + ".bn", "BatchNorm2d", {{"num_features", cout}}, {p + ".conv"});
    return add(p + ".relu", "ReLU", json::object(), {p + ".bn"});
  }
};

// ---- blocks ----

enum class Kind { kConv, kResidual, kBranch, kPool, kDropout };

struct BlockSpec {
  Kind kind = Kind::kConv;
  int width = 0;
  int width2 = 0;      // Concat branch: the second path's width
  int k1 = 3, k2 = 3;  // kernels (branch: of each path)
  int stride = 1;      // conv block; pool blocks always halve
  bool concat = false;
  bool pool_path = false;  // branch: the second path is MaxPool2d + 1x1 Conv2d
  bool avg = false;        // pool block: AvgPool2d
  double p = 0.0;          // dropout block
  int reps = 1;
};

inline int block_out(const BlockSpec& s, int in_ch) {
  switch (s.kind) {
    case Kind::kConv:
    case Kind::kResidual:
      return s.width;
    case Kind::kBranch:
      return s.concat ? s.width + s.width2 : s.width;
    default:
      return in_ch;
  }
}

// Layers one repetition emits.
inline size_t rep_layers(const BlockSpec& s, int in_ch) {
  switch (s.kind) {
    case Kind::kConv:
      return 3;
    case Kind::kResidual:
      return in_ch == s.width ? 7 : 9;
    case Kind::kBranch:
      return s.pool_path ? 8 : 7;
    default:
      return 1;
  }
}
inline size_t block_layers(const BlockSpec& s, int in_ch) {
  return rep_layers(s, in_ch) + static_cast<size_t>(s.reps - 1) * rep_layers(s, block_out(s, in_ch));
}

inline std::vector<int> big_kernels(const NasSpace& sp) {
  std::vector<int> k;
  for (int x : sp.kernels)
    if (x > 1) k.push_back(x);
  if (k.empty()) k.push_back(3);
  return k;
}

inline BlockSpec random_block(std::mt19937_64& rng, const NasSpace& sp, int downsamples_left) {
  double w[5] = {sp.w_conv, sp.w_residual, sp.w_branch, downsamples_left > 0 ? sp.w_pool : 0.0, sp.w_dropout};
  double total = w[0] + w[1] + w[2] + w[3] + w[4], r = uniform(rng) * total;
  int kind = 0;
  while (kind < 4 && r >= w[kind]) r -= w[kind++];
  BlockSpec s;
  s.kind = static_cast<Kind>(kind);
  s.width = pick(rng, sp.widths);
  switch (s.kind) {
    case Kind::kConv:
      s.k1 = pick(rng, sp.kernels);
      s.stride = downsamples_left > 0 && chance(rng, 0.2) ? 2 : 1;
      break;
    case Kind::kResidual:
      s.k1 = pick(rng, big_kernels(sp));  // a 1x1 body would duplicate the projection's signature
      break;
    case Kind::kBranch:
      s.concat = chance(rng, sp.p_concat);
      s.k1 = pick(rng, big_kernels(sp));
      s.pool_path = s.concat && chance(rng, 0.5);
      s.k2 = s.pool_path ? 1 : pick_other(rng, sp.kernels, s.k1);  // the two paths differ
      s.width2 = s.concat ? pick(rng, sp.widths) : s.width;
      break;
    case Kind::kPool:
      s.avg = chance(rng, 0.3);
      break;
    case Kind::kDropout:
      s.p = pick(rng, sp.dropouts);
      break;
  }
  if ((s.kind == Kind::kConv || s.kind == Kind::kResidual || s.kind == Kind::kBranch) && chance(rng, sp.p_repeat))
    s.reps = 2 + static_cast<int>(below(rng, 3));
  if (s.kind == Kind::kConv && s.stride == 2) s.reps = 1;
  return s;
}

// Emits one repetition of a block on `in` (in_ch channels); returns its output layer.
inline std::string emit_rep(Emitter& e, const BlockSpec& s, const std::string& p, const std::string& in, int in_ch) {
  switch (s.kind) {
    case Kind::kConv:
      return e.conv_bn_relu(p, in, in_ch, s.width, s.k1, s.stride);
    case Kind::kResidual: {
      e.add(p + ".conv1", "Conv2d", conv_config(in_ch, s.width, s.k1, 1), {in});
      e.add(p + ".bn1", "BatchNorm2d", {{"num_features", s.width}}, {p + ".conv1"});
      e.add(p + ".relu1", "ReLU", json::object(), {p + ".bn1"});
      e.add(p + ".conv2", "Conv2d", conv_config(s.width, s.width, s.k1, 1), {p + ".relu1"});
      e.add(p + ".bn2", "BatchNorm2d", {{"num_features", s.width}}, {p + ".conv2"});
      std::string skip = in;
      if (in_ch != s.width) {
        e.add(p + ".downsample.0", "Conv2d", conv_config(in_ch, s.width, 1, 1), {in});
        skip = e.add(p + ".downsample.1", "BatchNorm2d", {{"num_features", s.width}}, {p + ".downsample.0"});
      }
      e.add(p + ".add", "Add", json::object(), {skip, p + ".bn2"});  // the skip first: see repair()
      return e.add(p + ".relu", "ReLU", json::object(), {p + ".add"});
    }
    case Kind::kBranch: {
      std::string a = e.conv_bn_relu(p + ".a", in, in_ch, s.width, s.k1, 1);
      std::string b_in = in;
      if (s.pool_path)
        b_in = e.add(p + ".b.pool", "MaxPool2d", {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, {in});
      std::string b = e.conv_bn_relu(p + ".b", b_in, in_ch, s.width2, s.k2, 1);
      if (s.concat) return e.add(p + ".cat", "Concat", {{"dim", 1}}, {a, b});
      return e.add(p + ".add", "Add", json::object(), {a, b});
    }
    case Kind::kPool:
      return e.add(p + ".pool", s.avg ? "AvgPool2d" : "MaxPool2d", {{"kernel_size", 2}, {"stride", 2}, {"padding", 0}},
                   {in});
    case Kind::kDropout:
      return e.add(p + ".drop", "Dropout", {{"p", s.p}}, {in});
  }
  return in;
}

inline std::pair<std::string, int> emit_block(Emitter& e, const BlockSpec& s, const std::string& p, std::string in,
                                              int in_ch) {
  for (int r = 0; r < s.reps; ++r) {
    in = emit_rep(e, s, s.reps > 1 ? p + "." + std::to_string(r) : p, in, in_ch);
    in_ch = block_out(s, in_ch);
  }
  return {in, in_ch};
}

// ---- head ----

struct HeadSpec {
  int hidden = 0;
  double p = 0.0;  // 0: no Dropout
};
inline size_t head_layers(const HeadSpec& h) { return 3 + (h.p > 0 ? 1 : 0) + (h.hidden > 0 ? 2 : 0); }
inline HeadSpec random_head(std::mt19937_64& rng, const NasSpace& sp) {
  HeadSpec h;
  h.hidden = pick(rng, sp.head_hidden);
  if (chance(rng, 0.5)) h.p = pick(rng, sp.dropouts);
  return h;
}
inline void emit_head(Emitter& e, const HeadSpec& h, const std::string& p, const std::string& in, int in_ch,
                      int classes) {
  std::string x = e.add(p + ".avgpool", "AdaptiveAvgPool2d", {{"output_size", 1}}, {in});
  x = e.add(p + ".flatten", "Flatten", {{"start_dim", 1}}, {x});
  if (h.p > 0) x = e.add(p + ".dropout", "Dropout", {{"p", h.p}}, {x});
  if (h.hidden > 0) {
    x = e.add(p + ".fc1", "Linear", {{"in_features", in_ch}, {"out_features", h.hidden}, {"bias", true}}, {x});
    x = e.add(p + ".relu", "ReLU", json::object(), {x});
    in_ch = h.hidden;
  }
  e.add(p + ".fc", "Linear", {{"in_features", in_ch}, {"out_features", classes}, {"bias", true}}, {x});
}

// ---- analysis of a layer list in topological order ----

inline bool keeps_channels(const std::string& type) {
  return type == "BatchNorm2d" || type == "ReLU" || type == "Dropout" || type == "MaxPool2d" || type == "AvgPool2d" ||
         type == "AdaptiveAvgPool2d" || type == "Flatten";
}
inline bool is_downsample(const Layer& l) {
  if (l.type == "MaxPool2d" || l.type == "AvgPool2d") return l.config.value("stride", 1) == 2;
  return l.type == "Conv2d" && l.config.value("stride", 1) == 2;
}

struct Shape {
  std::unordered_map<std::string, size_t> index;
  std::vector<int> channels;  // output channels (features, after Flatten) of each layer
  std::vector<char> cut;      // no edge passes over this layer: everything before it reaches the rest through it
  size_t body = 0;            // first layer after the stem's Conv2d, BatchNorm2d, ReLU
  size_t head = 0;            // the head's AdaptiveAvgPool2d, or size() when there is none
  int downsamples = 0;
};

inline Shape analyse(const std::vector<Layer>& L, const NasSpace& sp) {
  Shape s;
  const size_t n = L.size();
  s.index.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) s.index.emplace(L[i].name, i);
  s.channels.assign(n, 0);
  std::vector<size_t> last_use(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Layer& l = L[i];
    int in0 = l.inputs.empty() ? sp.in_channels : s.channels[s.index.at(l.inputs[0])];
    for (const auto& in : l.inputs) last_use[s.index.at(in)] = i;
    if (l.type == "Conv2d")
      s.channels[i] = l.config.value("out_channels", in0);
    else if (l.type == "Linear")
      s.channels[i] = l.config.value("out_features", in0);
    else if (l.type == "Concat") {
      int sum = 0;
      for (const auto& in : l.inputs) sum += s.channels[s.index.at(in)];
      s.channels[i] = sum;
    } else
      s.channels[i] = in0;  // Add, and every layer that keeps channels
    if (is_downsample(l)) ++s.downsamples;
  }
  s.cut.assign(n, 0);
  size_t reach = 0;  // the furthest consumer of any layer before i
  for (size_t i = 0; i < n; ++i) {
    s.cut[i] = reach <= i;
    reach = std::max(reach, last_use[i]);
  }
  s.body =
      n >= 3 && L[0].type == "Conv2d" && L[1].type == "BatchNorm2d" && L[2].type == "ReLU" ? 3 : std::min<size_t>(1, n);
  s.head = n;
  for (size_t i = 0; i < n; ++i)
    if (L[i].type == "AdaptiveAvgPool2d") {
      s.head = i;
      break;
    }
  return s;
}

// Makes channel counts consistent again after a change: every Conv2d's in_channels, BatchNorm2d's
// num_features and Linear's in_features follow their input; an Add whose inputs differ gets its last
// input's convolution resized to the first input's width (the skip, in a residual block).
inline void repair(std::vector<Layer>& L, const NasSpace& sp) {
  for (int pass = 0; pass < 16; ++pass) {
    Shape s = analyse(L, sp);
    bool resized = false;
    for (size_t i = 0; i < L.size(); ++i) {
      Layer& l = L[i];
      int in0 = l.inputs.empty() ? sp.in_channels : s.channels[s.index.at(l.inputs[0])];
      if (l.type == "Conv2d" && !l.inputs.empty())
        l.config["in_channels"] = in0;
      else if (l.type == "BatchNorm2d")
        l.config["num_features"] = in0;
      else if (l.type == "Linear")
        l.config["in_features"] = in0;
      else if (l.type == "Add") {
        for (size_t k = 1; k < l.inputs.size(); ++k) {
          size_t j = s.index.at(l.inputs[k]);
          if (s.channels[j] == in0) continue;
          while (keeps_channels(L[j].type) && !L[j].inputs.empty()) j = s.index.at(L[j].inputs[0]);
          if (L[j].type == "Conv2d") {
            L[j].config["out_channels"] = in0;
            resized = true;
          }
        }
      }
      // Channels downstream of a resized convolution are recomputed by the next pass.
    }
    if (!resized) return;
  }
}

// Whether two layer lists describe the same graph, names aside.
inline bool same_structure(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)  // the cheap differences first
    if (a[i].type != b[i].type || a[i].inputs.size() != b[i].inputs.size() || a[i].config != b[i].config) return false;
  std::unordered_map<std::string, size_t> ia, ib;
  for (size_t i = 0; i < a.size(); ++i) {
    ia.emplace(a[i].name, i);
    ib.emplace(b[i].name, i);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].type != b[i].type || a[i].config != b[i].config || a[i].inputs.size() != b[i].inputs.size()) return false;
    for (size_t k = 0; k < a[i].inputs.size(); ++k)
      if (ia.at(a[i].inputs[k]) != ib.at(b[i].inputs[k])) return false;
  }
  return true;
}

// Layers consuming `from` at positions >= begin take `to` instead.
inline void redirect(std::vector<Layer>& L, size_t begin, const std::string& from, const std::string& to) {
  for (size_t i = begin; i < L.size(); ++i)
    for (auto& in : L[i].inputs)
      if (in == from) in = to;
}

// A name prefix no layer of L starts with.
inline std::string fresh_prefix(std::mt19937_64& rng, const std::vector<Layer>& L, const char* stem) {
  for (;;) {
    std::string p = std::string(stem) + "_" + hex_tag(rng);
    bool used = false;
    for (const auto& l : L)
      if (l.name.compare(0, p.size(), p) == 0) used = true;
    if (!used) return p;
  }
}

inline bool same_layers(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].type != b[i].type || a[i].config != b[i].config || a[i].inputs != b[i].inputs)
      return false;
  return true;
}

// The graph exactly as parse_graph gives it: validated, in parse_graph's topological order (Kahn's
// algorithm, layers that are ready together in their given order, as core/graph.cpp sorts). Going
// through JSON and parse_graph costs three times as much as the rest of a mutation, so it is done for
// every `verify_every`-th graph only, which must come out identical (else std::logic_error).
inline Graph finish(std::vector<Layer> layers, const NasSpace& sp) {
  static thread_local uint64_t finished = 0;
  const bool verify = sp.verify_every > 0 && finished++ % sp.verify_every == 0;
  std::vector<Layer> copy;
  if (verify) copy = layers;

  const size_t n = layers.size();
  std::unordered_map<std::string, uint32_t> index;
  index.reserve(n * 2);
  for (size_t i = 0; i < n; ++i)
    if (layers[i].name.empty() || layers[i].type.empty() || !index.emplace(layers[i].name, i).second)
      throw std::logic_error("nas_graphs: layer name '" + layers[i].name + "' is empty or used twice");
  std::vector<uint32_t> pending(n, 0);
  std::vector<std::vector<uint32_t>> consumers(n);
  for (size_t i = 0; i < n; ++i)
    for (const auto& in : layers[i].inputs) {
      auto it = index.find(in);
      if (it == index.end())
        throw std::logic_error("nas_graphs: layer '" + layers[i].name + "': unknown input '" + in + "'");
      ++pending[i];
      consumers[it->second].push_back(static_cast<uint32_t>(i));
    }
  std::vector<uint32_t> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) order.push_back(static_cast<uint32_t>(i));
  for (size_t k = 0; k < order.size(); ++k)
    for (uint32_t c : consumers[order[k]])
      if (--pending[c] == 0) order.push_back(c);
  if (order.size() != n) throw std::logic_error("nas_graphs: the graph has a cycle");
  Graph g;
  g.layers.reserve(n);
  for (uint32_t i : order) g.layers.push_back(std::move(layers[i]));

  if (verify) {
    Graph plain;
    plain.layers = std::move(copy);
    auto parsed = parse_graph(plain.to_json());
    if (!parsed.ok()) throw std::logic_error("nas_graphs produced an invalid graph: " + parsed.status().to_string());
    if (!same_layers(parsed->layers, g.layers) || !parsed->tensors.empty())
      throw std::logic_error("nas_graphs: parse_graph orders or reads this graph differently: " +
                             plain.to_json().dump());
  }
  return g;
}

// ---- mutations ----

// One change to L, left consistent. False if this kind of change does not apply to L.
inline bool mutate_once(std::vector<Layer>& L, std::mt19937_64& rng, const NasSpace& sp) {
  Shape s = analyse(L, sp);
  const size_t n = L.size();
  double r = uniform(rng);
  if (r < 0.40) {  // a convolution's kernel or width
    std::vector<size_t> convs;
    for (size_t i = s.body; i < s.head; ++i)
      if (L[i].type == "Conv2d") convs.push_back(i);
    if (convs.empty()) return false;
    size_t i = pick_late(rng, convs, sp.position_draws);
    json c = L[i].config;
    if (chance(rng, 0.5)) {
      int k = pick_other(rng, sp.kernels, c.value("kernel_size", 3));
      c["kernel_size"] = k;
      c["padding"] = k / 2;
    } else {
      c["out_channels"] = pick_other(rng, sp.widths, c.value("out_channels", 0));
    }
    // Not into a copy of a sibling (the other path of a branch, the projection of a residual
    // block): twin layers would share a signature, which NAS spaces avoid.
    for (size_t j = s.body; j < s.head; ++j)
      if (j != i && L[j].type == "Conv2d" && L[j].inputs == L[i].inputs && L[j].config == c) return false;
    L[i].config = std::move(c);
  } else if (r < 0.62) {  // insert a block after a cut point of the body
    // Only after a block's output: not inside a Conv2d, BatchNorm2d, ReLU chain, nor between a
    // residual block's Add and its ReLU.
    std::vector<size_t> at;
    for (size_t i = s.body == 0 ? 0 : s.body - 1; i < s.head && i < n; ++i) {
      if (!s.cut[i] || L[i].type == "Conv2d" || L[i].type == "BatchNorm2d") continue;
      if (L[i].type == "Add" && i + 1 < n && L[i + 1].type == "ReLU" && L[i + 1].inputs.size() == 1 &&
          L[i + 1].inputs[0] == L[i].name)
        continue;
      at.push_back(i);
    }
    if (at.empty()) return false;
    size_t c = pick_late(rng, at, sp.position_draws);
    BlockSpec b = random_block(rng, sp, sp.max_downsamples - s.downsamples);
    b.reps = 1;
    if (n + block_layers(b, s.channels[c]) > sp.max_layers) return false;
    std::vector<Layer> block;
    Emitter e{block};
    std::string out = emit_block(e, b, fresh_prefix(rng, L, "blocks"), L[c].name, s.channels[c]).first;
    std::string from = L[c].name;
    redirect(L, c + 1, from, out);
    L.insert(L.begin() + static_cast<std::ptrdiff_t>(c + 1), std::make_move_iterator(block.begin()),
             std::make_move_iterator(block.end()));
  } else if (r < 0.82) {  // drop a block of the body
    // Units: the stretches between cut points. A lone BatchNorm2d or ReLU is part of a chain, not a
    // block: a Conv2d unit is dropped with the BatchNorm2d and ReLU after it, a residual unit (it
    // ends with its Add) with its ReLU.
    std::vector<std::pair<size_t, size_t>> units;  // [first, last]
    size_t first = 0;
    for (size_t i = 0; i < s.head; ++i)
      if (s.cut[i]) {
        if (first >= s.body && first > 0 && L[first].type != "BatchNorm2d" && L[first].type != "ReLU")
          units.emplace_back(first, i);
        first = i + 1;
      }
    if (units.empty()) return false;
    auto [b, e] = pick_late(rng, units, sp.position_draws);
    if (b == e && L[b].type == "Conv2d") {
      if (!(e + 2 < s.head && s.cut[e + 1] && s.cut[e + 2] && L[e + 1].type == "BatchNorm2d" &&
            L[e + 2].type == "ReLU"))
        return false;
      e += 2;
    } else if (L[e].type == "Add" && e + 1 < s.head && s.cut[e + 1] && L[e + 1].type == "ReLU")
      e += 1;
    if (n - (e - b + 1) < sp.min_layers) return false;
    redirect(L, e + 1, L[e].name, L[b - 1].name);
    L.erase(L.begin() + static_cast<std::ptrdiff_t>(b), L.begin() + static_cast<std::ptrdiff_t>(e + 1));
  } else if (r < 0.92) {  // a new head
    if (s.head == n || s.head == 0) return false;
    HeadSpec h = random_head(rng, sp);
    size_t size = s.head + head_layers(h);
    if (size < sp.min_layers || size > sp.max_layers) return false;
    std::string in = L[s.head - 1].name;
    int ch = s.channels[s.head - 1];
    L.resize(s.head);
    std::vector<Layer> head;
    Emitter e{head};
    emit_head(e, h, fresh_prefix(rng, L, "head"), in, ch, sp.classes);
    for (auto& l : head) L.push_back(std::move(l));
  } else {  // a dropout rate
    std::vector<size_t> drops;
    for (size_t i = 0; i < n; ++i)
      if (L[i].type == "Dropout") drops.push_back(i);
    if (drops.empty()) return false;
    json& c = L[pick(rng, drops)].config;
    c["p"] = pick_other(rng, sp.dropouts, c.value("p", 0.0));
  }
  repair(L, sp);
  return true;
}

// Renames every layer in one of a few naming styles (names do not count in signatures).
inline void rename_all(std::vector<Layer>& L, std::mt19937_64& rng) {
  int style = static_cast<int>(below(rng, 4));
  std::string tag = hex_tag(rng);
  std::unordered_map<std::string, std::string> to;
  to.reserve(L.size() * 2);
  for (size_t i = 0; i < L.size(); ++i) {
    std::string type = L[i].type;
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char ch) { return std::tolower(ch); });
    std::string name;
    switch (style) {
      case 0:
        name = type + "_" + std::to_string(i);
        break;
      case 1:
        name = "features." + std::to_string(i);
        break;
      case 2:
        name = "net." + tag + ".layer" + std::to_string(i) + "." + type;
        break;
      default:
        name = "n" + tag + "_" + std::to_string(i);
        break;
    }
    to.emplace(L[i].name, std::move(name));
  }
  for (auto& l : L) {
    l.name = to.at(l.name);
    for (auto& in : l.inputs) in = to.at(in);
  }
}

}  // namespace nas_detail

// A random graph of the space: stem, blocks, head; between min_layers and max_layers layers.
inline Graph random_graph(std::mt19937_64& rng, const NasSpace& sp) {
  using namespace nas_detail;
  std::vector<Layer> L;
  L.reserve(sp.max_layers + 8);
  Emitter e{L};
  size_t target = sp.max_layers >= sp.min_layers + 2 ? sp.min_layers + 2 + below(rng, sp.max_layers - sp.min_layers - 1)
                                                     : sp.max_layers;
  HeadSpec head = random_head(rng, sp);
  int ch = pick(rng, sp.stem_widths);
  int k = chance(rng, 0.5) ? 3 : 7;
  int downsamples = 0;
  std::string x = e.conv_bn_relu("stem", "", sp.in_channels, ch, k, k == 7 ? 2 : 1);
  if (k == 7) {
    x = e.add("stem.pool", "MaxPool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, {x});
    downsamples = 2;
  }
  for (int b = 0;; ++b) {
    size_t used = L.size() + head_layers(head);
    if (used + 3 > target) break;
    size_t room = target - used;
    BlockSpec s = random_block(rng, sp, sp.max_downsamples - downsamples);
    while (s.reps > 1 && block_layers(s, ch) > room) --s.reps;
    if (block_layers(s, ch) > room) {  // the smallest multi-layer block fits: room >= 3
      s = BlockSpec{};
      s.width = pick(rng, sp.widths);
      s.k1 = pick(rng, sp.kernels);
    }
    if (s.kind == Kind::kPool || (s.kind == Kind::kConv && s.stride == 2)) ++downsamples;
    std::tie(x, ch) = emit_block(e, s, "blocks." + std::to_string(b), x, ch);
  }
  emit_head(e, head, "head", x, ch, sp.classes);
  return finish(std::move(L), sp);
}

// A child of parent: one change (sometimes two) somewhere after the stem, everything upstream of it
// kept; sometimes renamed throughout. Never identical to the parent, names aside.
inline Graph mutate(const Graph& parent, std::mt19937_64& rng, const NasSpace& sp) {
  using namespace nas_detail;
  std::vector<Layer> L;
  for (int attempt = 0; attempt < 16; ++attempt) {
    L = parent.layers;
    int changes = chance(rng, sp.p_second_mutation) ? 2 : 1;
    for (int c = 0; c < changes;)
      if (mutate_once(L, rng, sp))
        ++c;
      else if (uniform(rng) < 0.05)
        break;  // nothing applies to this graph: give up this attempt
    if (!same_structure(L, parent.layers)) break;
    if (attempt == 15) {  // every change was undone by repair(): insert a Dropout before the head
      Shape s = analyse(L, sp);
      size_t at = s.head == 0 ? 0 : s.head - 1;
      std::string name = fresh_prefix(rng, L, "drop");
      redirect(L, at + 1, L[at].name, name);
      L.insert(L.begin() + static_cast<std::ptrdiff_t>(at + 1),
               Layer{name, "Dropout", {{"p", pick(rng, sp.dropouts)}}, {L[at].name}});
    }
  }
  if (chance(rng, sp.p_rename)) rename_all(L, rng);
  return finish(std::move(L), sp);
}

// Regularized evolution, one model at a time: the first `population` models are random; each later
// one is, with probability 1 - p_fresh, a mutation of the best of `sample` random members of the
// population (the last `population` models), else a fresh random graph. Scores are synthetic: they
// grow with depth and width, with noise, so selection behaves as in a real search.
class NasEvolution {
 public:
  struct Model {
    std::shared_ptr<const Graph> graph;
    int parent = -1;  // index of an earlier model; -1 for a random one
    double score = 0;
  };

  NasEvolution(uint64_t seed, NasSpace space) : rng_(seed), space_(std::move(space)) {}

  Model next() {
    Model m;
    if (produced_ < space_.population || nas_detail::chance(rng_, space_.p_fresh)) {
      m.graph = std::make_shared<const Graph>(random_graph(rng_, space_));
    } else {
      const Member* best = nullptr;
      for (size_t k = 0; k < space_.sample; ++k) {
        const Member& c = population_[nas_detail::below(rng_, population_.size())];
        if (!best || c.score > best->score) best = &c;
      }
      m.parent = static_cast<int>(best->index);
      m.graph = std::make_shared<const Graph>(mutate(*best->graph, rng_, space_));
    }
    m.score = fitness(*m.graph);
    population_.push_back(Member{produced_, m.score, m.graph});
    if (population_.size() > space_.population) population_.pop_front();
    ++produced_;
    return m;
  }
  size_t produced() const { return produced_; }

 private:
  struct Member {
    size_t index;
    double score;
    std::shared_ptr<const Graph> graph;
  };

  double fitness(const Graph& g) {
    double convs = 0, width = 0;
    for (const auto& l : g.layers)
      if (l.type == "Conv2d") {
        ++convs;
        width += l.config.value("out_channels", 0);
      }
    double f =
        0.45 + 0.3 * std::tanh(convs / 12.0) + 0.15 * std::tanh(width / 2000.0) + 0.02 * nas_detail::normal(rng_);
    return std::clamp(f, 0.01, 0.99);
  }

  std::mt19937_64 rng_;
  NasSpace space_;
  std::deque<Member> population_;
  size_t produced_ = 0;
};

// A whole run kept in memory: graphs[i] came from graphs[parent[i]] (or is random when -1).
struct NasRun {
  std::vector<Graph> graphs;
  std::vector<int> parent;
  std::vector<double> score;
};

inline NasRun evolution(size_t n_models, uint64_t seed, const NasSpace& space) {
  NasRun run;
  run.graphs.reserve(n_models);
  run.parent.reserve(n_models);
  run.score.reserve(n_models);
  NasEvolution evo(seed, space);
  for (size_t i = 0; i < n_models; ++i) {
    auto m = evo.next();
    run.graphs.push_back(*m.graph);
    run.parent.push_back(m.parent);
    run.score.push_back(m.score);
  }
  return run;
}

}  // namespace cairn::bench
