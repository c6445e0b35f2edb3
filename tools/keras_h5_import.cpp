// Keras HDF5 import (`cairn import` of .h5): a Keras 2 weights file as a model, with the file's
// HDF5 layout recorded for export (docs/import-export.md).
#include <unistd.h>

#include <cerrno>
#include <map>
#include <optional>
#include <set>

#include "core/dtype.hpp"
#include "core/wire.hpp"
#include "tools/keras_h5.hpp"
#include "tools/keras_h5_internal.hpp"

namespace cairn::tool {

using nlohmann::json;

#ifndef CAIRN_HAVE_HDF5

Status import_keras_h5(v1::Client&, const std::string&, const std::string& file, const std::string&, const json&,
                       Durability) {
  return require_hdf5(file);
}

#else  // CAIRN_HAVE_HDF5

using namespace h5;

namespace {

// Tensors up to this size are read into a buffer and sent with the request (as libcairn sends any
// tensor of up to 64 KiB); larger ones are read straight into arena space.
constexpr uint64_t kSmallTensor = 64 * 1024;

// ---- attributes ----

struct AttrRead {
  json record;                                    // what export replays
  std::optional<std::vector<std::string> > text;  // the values, when the attribute holds strings
};

Result<AttrRead> read_attr(hid_t obj, const std::string& name, const std::string& where) {
  std::string what = "attribute '" + name + "' of '" + where + "'";
  Hid a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return h5_error("cannot open " + what);
  Hid type(H5Aget_type(a.get()), H5Tclose);
  Hid space(H5Aget_space(a.get()), H5Sclose);
  if (!type.ok() || !space.ok()) return h5_error("cannot read " + what);
  H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_STRING && cls != H5T_ENUM && cls != H5T_BITFIELD &&
      cls != H5T_OPAQUE)
    return invalid_argument(what + ": compound, array, variable-length and reference attributes are not supported");
  CAIRN_ASSIGN_OR_RETURN(auto shape, space_shape(space.get(), what));
  CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), what));
  AttrRead out;
  out.record = json{{"name", name}, {"h5t", h5t}, {"shape", shape ? json(*shape) : json()}};
  uint64_t n = shape ? elements(*shape) : 0;
  if (cls == H5T_STRING && H5Tis_variable_str(type.get()) > 0) {
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    std::vector<char*> ptrs(n, nullptr);
    std::vector<std::string> values;
    if (n > 0) {
      if (H5Aread(a.get(), mem.get(), ptrs.data()) < 0) return h5_error("cannot read " + what);
      for (char* p : ptrs) values.emplace_back(p ? p : "");
      H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
    }
    for (const auto& v : values)
      if (!valid_utf8(v)) return invalid_argument(what + ": a string is not valid UTF-8");
    out.record["strings"] = values;
    out.text = std::move(values);
    return out;
  }
  size_t esize = H5Tget_size(type.get());
  std::vector<uint8_t> raw(n * esize);
  if (n > 0 && H5Aread(a.get(), type.get(), raw.data()) < 0) return h5_error("cannot read " + what);
  out.record["data"] = hex(raw.data(), raw.size());
  if (cls == H5T_STRING) {
    std::vector<std::string> values;
    for (uint64_t i = 0; i < n; ++i) {
      std::string s(reinterpret_cast<const char*>(raw.data() + i * esize), esize);
      while (!s.empty() && (s.back() == '\0' || (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD && s.back() == ' ')))
        s.pop_back();
      values.push_back(std::move(s));
    }
    out.text = std::move(values);
  } else if (n == 0) {
    out.text = std::vector<std::string>{};  // Keras writes an empty float64 array for "no weights"
  }
  return out;
}

// Every attribute of obj, in the order HDF5 keeps them (creation order when tracked).
Result<json> read_attrs(hid_t obj, unsigned attr_order_flags, const std::string& where) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5_index_t index = (attr_order_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  herr_t r = H5Aiterate2(
      obj, index, H5_ITER_NATIVE, &idx,
      [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->emplace_back(name);
        return 0;
      },
      &names);
  if (r < 0) return h5_error("cannot list the attributes of '" + where + "'");
  json out = json::array();
  for (const auto& n : names) {
    CAIRN_ASSIGN_OR_RETURN(AttrRead a, read_attr(obj, n, where));
    out.push_back(std::move(a.record));
  }
  return out;
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

// A Keras string-list attribute: `name`, or its chunks name0, name1, ... (Keras splits lists over
// 64 KiB). nullopt when there is none.
Result<std::optional<std::vector<std::string> > > read_string_list(hid_t obj, const std::string& name,
                                                                   const std::string& where) {
  std::vector<std::string> out;
  std::vector<std::string> parts;
  if (has_attr(obj, name)) {
    parts.push_back(name);
  } else {
    for (int i = 0; has_attr(obj, name + std::to_string(i)); ++i) parts.push_back(name + std::to_string(i));
    if (parts.empty()) return std::optional<std::vector<std::string> >();
  }
  for (const auto& p : parts) {
    CAIRN_ASSIGN_OR_RETURN(AttrRead a, read_attr(obj, p, where));
    if (!a.text) return invalid_argument("attribute '" + p + "' of '" + where + "' is not a list of strings");
    out.insert(out.end(), a.text->begin(), a.text->end());
  }
  return std::optional<std::vector<std::string> >(std::move(out));
}

// ---- datasets ----

struct DatasetPlan {
  std::string path, tensor;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

Result<json> dataset_layout(hid_t dcpl, const std::string& what) {
  json out = json::object();
  H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_COMPACT) out["layout"] = "compact";
  if (layout == H5D_CHUNKED) {
    hsize_t dims[32];
    int nd = H5Pget_chunk(dcpl, 32, dims);
    if (nd < 0) return h5_error(what + ": cannot read its chunking");
    out["chunks"] = std::vector<hsize_t>(dims, dims + nd);
  }
  int nf = H5Pget_nfilters(dcpl);
  if (nf > 0) {
    json filters = json::array();
    for (int i = 0; i < nf; ++i) {
      unsigned flags = 0, conf = 0;
      unsigned cd[16];
      size_t ncd = 16;
      char name[256];
      H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &ncd, cd, sizeof name, name, &conf);
      if (id < 0) return h5_error(what + ": cannot read its filters");
      filters.push_back(json{{"id", id},
                             {"flags", flags},
                             {"values", std::vector<unsigned>(cd, cd + std::min<size_t>(ncd, 16))},
                             {"name", std::string(name)}});
    }
    out["filters"] = filters;
  }
  return out;
}

// ---- the import walk ----

struct Walk {
  hid_t file = -1;
  std::map<std::string, std::string> tensor_of_path;  // datasets Keras lists, by path
  std::vector<DatasetPlan> other;                     // datasets it does not list, in walk order
  std::map<std::string, DatasetPlan> listed;          // by path
  std::set<std::string> names;
};

Result<json> walk_group(Walk& w, hid_t group, const std::string& path);

Result<json> walk_dataset(Walk& w, hid_t ds, const std::string& path) {
  std::string what = "dataset '" + path + "'";
  Hid type(H5Dget_type(ds), H5Tclose), space(H5Dget_space(ds), H5Sclose), dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!type.ok() || !space.ok() || !dcpl.ok()) return h5_error("cannot read " + what);
  CAIRN_ASSIGN_OR_RETURN(DType dt, cairn_dtype(type.get(), what));
  CAIRN_ASSIGN_OR_RETURN(auto shape, space_shape(space.get(), what));
  if (!shape) return invalid_argument(what + ": empty (null dataspace) datasets are not supported");
  if (shape->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(what + ": " + std::to_string(shape->size()) + " dimensions (cairn stores at most " +
                            std::to_string(kMaxDims) + ")");
  unsigned attr_flags = 0;
  H5Pget_attr_creation_order(dcpl.get(), &attr_flags);
  CAIRN_ASSIGN_OR_RETURN(json attrs, read_attrs(ds, attr_flags, path));
  CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), what));
  CAIRN_ASSIGN_OR_RETURN(json layout, dataset_layout(dcpl.get(), what));
  DatasetPlan plan{path, "", dt, *shape};
  auto it = w.tensor_of_path.find(path);
  if (it != w.tensor_of_path.end()) {
    plan.tensor = it->second;
    w.listed[path] = plan;
  } else {
    plan.tensor = path.substr(1);
    if (!w.names.insert(plan.tensor).second)
      return invalid_argument(what + ": its tensor name '" + plan.tensor + "' is already taken by a Keras weight");
    if (!valid_name(plan.tensor)) return invalid_argument(what + ": its path is not a valid cairn tensor name");
    w.other.push_back(plan);
  }
  json rec{{"tensor", plan.tensor}, {"dtype", std::string(dtype_name(dt))}, {"shape", *shape}, {"h5t", h5t}};
  if (!attrs.empty()) rec["attrs"] = attrs;
  if (attr_flags) rec["attr_order"] = attr_flags;
  for (auto& [k, v] : layout.items()) rec[k] = v;
  return rec;
}

Result<json> walk_group(Walk& w, hid_t group, const std::string& path) {
  const std::string where = path.empty() ? "/" : path;
  Hid gcpl(H5Gget_create_plist(group), H5Pclose);
  if (!gcpl.ok()) return h5_error("cannot read group '" + where + "'");
  unsigned link_flags = 0, attr_flags = 0;
  H5Pget_link_creation_order(gcpl.get(), &link_flags);
  H5Pget_attr_creation_order(gcpl.get(), &attr_flags);
  json rec = json::object();
  CAIRN_ASSIGN_OR_RETURN(json attrs, read_attrs(group, attr_flags, where));
  rec["attrs"] = std::move(attrs);
  if (link_flags) rec["link_order"] = link_flags;
  if (attr_flags) rec["attr_order"] = attr_flags;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) return h5_error("cannot list group '" + where + "'");
  H5_index_t index = (link_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  json links = json::array();
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len = H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) return h5_error("cannot list group '" + where + "'");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    std::string child = path + "/" + name;
    H5L_info_t li;
    if (H5Lget_info(group, name.c_str(), &li, H5P_DEFAULT) < 0) return h5_error("cannot read link '" + child + "'");
    if (li.type != H5L_TYPE_HARD) return invalid_argument("'" + child + "': soft and external links are not supported");
    Hid obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.ok()) return h5_error("cannot open '" + child + "'");
    H5I_type_t t = H5Iget_type(obj.get());
    if (t == H5I_GROUP) {
      CAIRN_ASSIGN_OR_RETURN(json g, walk_group(w, obj.get(), child));
      links.push_back(json{{"name", name}, {"group", std::move(g)}});
    } else if (t == H5I_DATASET) {
      CAIRN_ASSIGN_OR_RETURN(json d, walk_dataset(w, obj.get(), child));
      links.push_back(json{{"name", name}, {"dataset", std::move(d)}});
    } else {
      return invalid_argument("'" + child + "': named datatypes are not supported");
    }
  }
  rec["links"] = std::move(links);
  return rec;
}

// Keras 2's weight name "dense/kernel:0" of layer "dense" as the tensor "dense.kernel".
std::string tensor_name(const std::string& layer, const std::string& weight) {
  std::string w = weight;
  if (w.size() > layer.size() + 1 && w.compare(0, layer.size(), layer) == 0 && w[layer.size()] == '/')
    w = w.substr(layer.size() + 1);
  if (w.size() > 2 && w.compare(w.size() - 2, 2, ":0") == 0) w.resize(w.size() - 2);
  return layer + "." + w;
}

Status pread_dataset(hid_t file, const DatasetPlan& p, uint8_t* dst) {
  std::string what = "dataset '" + p.path + "'";
  Hid ds(H5Dopen2(file, p.path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return h5_error("cannot open " + what);
  Hid type(H5Dget_type(ds.get()), H5Tclose);
  CAIRN_ASSIGN_OR_RETURN(Hid mem, memory_type(type.get(), what));
  if (H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) return h5_error("cannot read " + what);
  return Status::OK();
}

}  // namespace

Status import_keras_h5(v1::Client& client, const std::string& id, const std::string& file, const std::string& parent,
                       const json& meta, Durability durability) {
  silence_hdf5();
  if (H5Fis_hdf5(file.c_str()) <= 0) {
    if (::access(file.c_str(), R_OK) != 0) return errno_status("opening '" + file + "'", errno);
    return h5_error("'" + file + "' is not an HDF5 file");
  }
  Hid f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) return h5_error("'" + file + "' is not a readable HDF5 file");
  Walk w;
  w.file = f.get();

  // Where the weights are: the root of a weights file, /model_weights of a whole-model file.
  std::string root;
  Hid wroot;
  {
    Hid r(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    if (!r.ok()) return h5_error("'" + file + "': cannot open its root group");
    CAIRN_ASSIGN_OR_RETURN(auto names, read_string_list(r.get(), "layer_names", "/"));
    if (names) {
      wroot = std::move(r);
    } else if (H5Lexists(f.get(), "model_weights", H5P_DEFAULT) > 0) {
      wroot = Hid(H5Gopen2(f.get(), "/model_weights", H5P_DEFAULT), H5Gclose);
      if (!wroot.ok()) return h5_error("'" + file + "': cannot open /model_weights");
      root = "/model_weights";
    } else {
      return invalid_argument("'" + file +
                              "' is not a Keras weights file (no 'layer_names' attribute at / or /model_weights)");
    }
  }
  const std::string where_root = root.empty() ? "/" : root;
  CAIRN_ASSIGN_OR_RETURN(auto layer_names_opt, read_string_list(wroot.get(), "layer_names", where_root));
  if (!layer_names_opt) return invalid_argument("'" + file + "': '" + where_root + "' has no 'layer_names' attribute");
  const std::vector<std::string>& layer_names = *layer_names_opt;

  json weight_names = json::object();
  std::vector<std::pair<std::string, std::string> > order;  // (path, layer) of listed weights
  for (const auto& layer : layer_names) {
    std::string lpath = root + "/" + layer;
    if (layer.empty() || layer.find('/') != std::string::npos ||
        H5Lexists(wroot.get(), layer.c_str(), H5P_DEFAULT) <= 0)
      return invalid_argument("'" + file + "': layer '" + layer + "' in layer_names has no group '" + lpath + "'");
    Hid g(H5Gopen2(wroot.get(), layer.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) return h5_error("'" + file + "': '" + lpath + "' is not a group");
    CAIRN_ASSIGN_OR_RETURN(auto wn, read_string_list(g.get(), "weight_names", lpath));
    std::vector<std::string> weights = wn ? *wn : std::vector<std::string>{};
    weight_names[layer] = weights;
    for (const auto& wt : weights) {
      std::string path = lpath + "/" + wt;
      std::string t = tensor_name(layer, wt);
      if (!valid_name(t)) return invalid_argument("'" + file + "': weight '" + path + "' gives an invalid tensor name");
      if (!w.names.insert(t).second)
        return invalid_argument("'" + file + "': weight '" + path + "' and another weight both map to tensor '" + t +
                                "'");
      if (!w.tensor_of_path.emplace(path, t).second)
        return invalid_argument("'" + file + "': weight '" + path + "' is listed twice");
      order.emplace_back(path, layer);
    }
  }

  auto tree = [&]() -> Result<json> {
    Hid r(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    return walk_group(w, r.get(), "");
  }();
  if (!tree.ok()) return tree.status().with_context("'" + file + "'");
  for (const auto& [path, layer] : order)
    if (!w.listed.count(path))
      return invalid_argument("'" + file + "': layer '" + layer + "' lists weight '" + path +
                              "', which is not a dataset");

  // Layer types from a whole-model file's model_config, when it has one.
  std::map<std::string, std::string> layer_type;
  if (has_attr(f.get(), "model_config")) {
    auto mc = read_attr(f.get(), "model_config", "/");
    if (mc.ok() && mc->text && mc->text->size() == 1) {
      json cfg = json::parse((*mc->text)[0], nullptr, false);
      if (cfg.is_object() && cfg.contains("config")) {
        const json& c = cfg["config"];
        const json* layers = c.is_object() && c.contains("layers") ? &c["layers"] : nullptr;
        if (layers && layers->is_array())
          for (const auto& l : *layers)
            if (l.is_object() && l.value("class_name", json()).is_string() && l.contains("config") &&
                l["config"].is_object() && l["config"].value("name", json()).is_string())
              layer_type[l["config"]["name"].get<std::string>()] = l["class_name"].get<std::string>();
      }
    }
  }

  // The graph: the layers as a chain in layer_names order; each layer's config is its weights.
  json layers = json::array(), tensor_map = json::object();
  std::string prev;
  for (const auto& layer : layer_names) {
    json wl = json::array();
    for (const auto& wt : weight_names[layer]) {
      const DatasetPlan& p = w.listed[root + "/" + layer + "/" + wt.get<std::string>()];
      tensor_map[p.tensor] = layer;
      wl.push_back(json{{"name", p.tensor.substr(layer.size() + 1)},
                        {"dtype", std::string(dtype_name(p.dtype))},
                        {"shape", p.shape}});
    }
    auto t = layer_type.find(layer);
    json l{{"name", layer},
           {"type", t != layer_type.end() ? t->second : std::string("KerasLayer")},
           {"config", json{{"weights", wl}}},
           {"inputs", prev.empty() ? json::array() : json::array({prev})}};
    layers.push_back(std::move(l));
    prev = layer;
  }
  json graph{{"layers", layers}, {"tensors", tensor_map}};

  json record{{"format", "keras-h5"},
              {"file", file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1)},
              {"weights_root", where_root},
              {"layer_names", layer_names},
              {"weight_names", weight_names},
              {"tree", std::move(tree).value()}};
  json metadata = meta.is_object() ? meta : json::object();
  metadata["cairn.import"] = std::move(record);
  if (metadata.dump().size() > wire::kMaxJsonBytes / 2)
    return invalid_argument("'" + file + "': its HDF5 layout is too large to record in the model's metadata");

  std::vector<const DatasetPlan*> plans;
  for (const auto& [path, layer] : order) plans.push_back(&w.listed[path]);
  for (const auto& p : w.other) plans.push_back(&p);

  auto created = client.model_create(id, parent);
  if (!created) return to_status(created.status());
  v1::Writer& writer = *created;
  CAIRN_RETURN_IF_ERROR(to_status(writer.set_metadata(metadata.dump())));
  CAIRN_RETURN_IF_ERROR(to_status(writer.set_architecture(graph.dump())));
  std::vector<uint8_t> small;
  for (const DatasetPlan* p : plans) {
    auto nbytes = tensor_nbytes(p->dtype, p->shape);
    if (!nbytes) return invalid_argument("'" + file + "': dataset '" + p->path + "' is too large");
    if (*nbytes <= kSmallTensor) {
      small.assign(*nbytes, 0);
      if (*nbytes) CAIRN_RETURN_IF_ERROR(pread_dataset(f.get(), *p, small.data()).with_context("'" + file + "'"));
      CAIRN_RETURN_IF_ERROR(to_status(writer.add_tensor(p->tensor, small.data(), to_c(p->dtype), p->shape)));
    } else {
      // Straight from the file into the daemon's arena.
      auto dst = writer.add_tensor_space(p->tensor, to_c(p->dtype), p->shape);
      if (!dst) return to_status(dst.status());
      CAIRN_RETURN_IF_ERROR(pread_dataset(f.get(), *p, static_cast<uint8_t*>(*dst)).with_context("'" + file + "'"));
    }
  }
  return to_status(writer.commit(static_cast<cairn_durability>(durability)));
}

#endif  // CAIRN_HAVE_HDF5

}  // namespace cairn::tool
