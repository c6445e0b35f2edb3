// Keras HDF5 export (`cairn export` to .h5): a model as a Keras weights file, in the layout recorded
// at import or a Keras 2 weights-only one (docs/import-export.md).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>

#include "core/dtype.hpp"
#include "tools/keras_h5.hpp"
#include "tools/keras_h5_internal.hpp"

namespace cairn::tool {

using nlohmann::json;

#ifndef CAIRN_HAVE_HDF5

Status export_keras_h5(v1::Client&, const std::string&, const std::string& file) { return require_hdf5(file); }

#else  // CAIRN_HAVE_HDF5

using namespace h5;

// ---- export ----

namespace {

// A tensor of the model being exported, as cairn::DType.
struct Tensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

struct Writer {
  hid_t file = -1;
  v1::Client* client = nullptr;
  std::string model;
  std::vector<Tensor> tensors;
  const Tensor* find(const std::string& name) const {
    for (const Tensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

Status write_attrs(hid_t obj, const json& attrs, const std::string& where) {
  if (!attrs.is_array()) return invalid_argument("'" + where + "': the recorded attributes are not a list");
  for (const auto& a : attrs) {
    if (!a.is_object() || !a.value("name", json()).is_string())
      return invalid_argument("'" + where + "': a recorded attribute has no name");
    std::string name = a["name"].get<std::string>();
    std::string what = "attribute '" + name + "' of '" + where + "'";
    CAIRN_ASSIGN_OR_RETURN(Hid type, decode_type(a.value("h5t", json()), what));
    CAIRN_ASSIGN_OR_RETURN(Hid space, make_space(a.value("shape", json()), what));
    Hid at(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!at.ok()) return h5_error("cannot create " + what);
    hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (a.contains("strings")) {
      const json& s = a["strings"];
      if (!s.is_array() || static_cast<hssize_t>(s.size()) != n)
        return invalid_argument(what + ": the recorded strings do not match its shape");
      std::vector<std::string> values;
      for (const auto& v : s) values.push_back(v.is_string() ? v.get<std::string>() : std::string());
      std::vector<const char*> ptrs;
      for (const auto& v : values) ptrs.push_back(v.c_str());
      Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      if (n > 0 && H5Awrite(at.get(), mem.get(), ptrs.data()) < 0) return h5_error("cannot write " + what);
    } else if (a.contains("data")) {
      auto raw = a["data"].is_string() ? unhex(a["data"].get<std::string>()) : std::nullopt;
      if (!raw || raw->size() != static_cast<size_t>(n) * H5Tget_size(type.get()))
        return invalid_argument(what + ": the recorded value does not match its type and shape");
      if (n > 0 && H5Awrite(at.get(), type.get(), raw->data()) < 0) return h5_error("cannot write " + what);
    }
  }
  return Status::OK();
}

Status write_dataset(Writer& w, hid_t parent, const std::string& name, const json& rec, const std::string& path) {
  std::string what = "dataset '" + path + "'";
  if (!rec.is_object() || !rec.value("tensor", json()).is_string())
    return invalid_argument(what + ": the recorded layout names no tensor");
  std::string tensor = rec["tensor"].get<std::string>();
  const Tensor* t = w.find(tensor);
  if (!t) return not_found(what + ": model '" + w.model + "' has no tensor '" + tensor + "'");
  CAIRN_ASSIGN_OR_RETURN(Hid type, decode_type(rec.value("h5t", json()), what));
  CAIRN_ASSIGN_OR_RETURN(DType dt, cairn_dtype(type.get(), what));
  if (dt != t->dtype || json(t->shape) != rec.value("shape", json()))
    return invalid_argument(what + ": tensor '" + tensor + "' is " + std::string(dtype_name(t->dtype)) + " " +
                            json(t->shape).dump() + ", not the recorded " + std::string(dtype_name(dt)) + " " +
                            rec.value("shape", json()).dump());
  CAIRN_ASSIGN_OR_RETURN(Hid space, make_space(json(t->shape), what));
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (rec.contains("attr_order")) H5Pset_attr_creation_order(dcpl.get(), rec["attr_order"].get<unsigned>());
  if (rec.value("layout", "") == "compact") H5Pset_layout(dcpl.get(), H5D_COMPACT);
  if (rec.contains("chunks")) {
    std::vector<hsize_t> chunks = rec["chunks"].get<std::vector<hsize_t> >();
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunks.size()), chunks.data()) < 0)
      return h5_error(what + ": cannot set its chunking");
  }
  if (rec.contains("filters")) {
    for (const auto& fl : rec["filters"]) {
      std::vector<unsigned> cd = fl.value("values", std::vector<unsigned>{});
      if (H5Pset_filter(dcpl.get(), fl["id"].get<H5Z_filter_t>(), fl.value("flags", 0u), cd.size(), cd.data()) < 0)
        return h5_error(what + ": cannot apply its filter '" + fl.value("name", std::string("?")) + "'");
    }
  }
  Hid ds(H5Dcreate2(parent, name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return h5_error("cannot create " + what);
  if (t->nbytes > 0) {
    // A reader of its own per tensor, closed after the write: one tensor pinned at a time, so models
    // larger than the arena export too (the model's description is cached: no request to open it).
    auto reader = w.client->model_open(w.model);
    if (!reader) return to_status(reader.status());
    auto view = reader->map({tensor});
    if (!view) return to_status(view.status());
    CAIRN_ASSIGN_OR_RETURN(Hid mem, memory_type(type.get(), what));
    herr_t wr = H5Dwrite(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, (*view)[0].data);
    reader->close();
    if (wr < 0) return h5_error("cannot write " + what);
  }
  return write_attrs(ds.get(), rec.value("attrs", json::array()), path);
}

Status write_group(Writer& w, hid_t group, const json& rec, const std::string& path) {
  const std::string where = path.empty() ? "/" : path;
  if (!rec.is_object()) return invalid_argument("'" + where + "': the recorded group is not an object");
  CAIRN_RETURN_IF_ERROR(write_attrs(group, rec.value("attrs", json::array()), where));
  for (const auto& l : rec.value("links", json::array())) {
    std::string name = l.value("name", std::string());
    std::string child = path + "/" + name;
    if (name.empty() || name.find('/') != std::string::npos)
      return invalid_argument("'" + where + "': a recorded link has no valid name");
    if (l.contains("group")) {
      const json& g = l["group"];
      Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
      if (g.contains("link_order")) H5Pset_link_creation_order(gcpl.get(), g["link_order"].get<unsigned>());
      if (g.contains("attr_order")) H5Pset_attr_creation_order(gcpl.get(), g["attr_order"].get<unsigned>());
      Hid sub(H5Gcreate2(group, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
      if (!sub.ok()) return h5_error("cannot create group '" + child + "'");
      CAIRN_RETURN_IF_ERROR(write_group(w, sub.get(), g, child));
    } else if (l.contains("dataset")) {
      CAIRN_RETURN_IF_ERROR(write_dataset(w, group, name, l["dataset"], child));
    } else {
      return invalid_argument("'" + child + "': the recorded link is neither a group nor a dataset");
    }
  }
  return Status::OK();
}

// A Keras 2 weights-only layout for a model that was not imported from HDF5: one layer per
// tensor-name prefix (up to the last dot), weight "<layer>/<suffix>:0".
Result<json> synthesize_tree(const std::vector<Tensor>& tensors) {
  auto string_attr = [](const std::string& name, const std::vector<std::string>& values, bool scalar) -> Result<json> {
    Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), H5T_VARIABLE);
    H5Tset_cset(t.get(), scalar ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(t.get(), "attribute '" + name + "'"));
    return json{{"name", name},
                {"h5t", h5t},
                {"shape", scalar ? json::array() : json::array({values.size()})},
                {"strings", values}};
  };
  auto empty_attr = [](const std::string& name) -> Result<json> {
    CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(H5T_IEEE_F64LE, "attribute '" + name + "'"));
    return json{{"name", name}, {"h5t", h5t}, {"shape", json::array({0})}, {"data", ""}};
  };
  std::vector<std::string> layer_order;
  std::map<std::string, std::vector<const Tensor*> > by_layer;
  for (const auto& t : tensors) {
    auto dot = t.name.rfind('.');
    std::string layer = dot == std::string::npos || dot == 0 ? t.name : t.name.substr(0, dot);
    if (layer.find('/') != std::string::npos)
      return invalid_argument("tensor '" + t.name + "': a '/' in a layer name cannot be written as an HDF5 group");
    if (!by_layer.count(layer)) layer_order.push_back(layer);
    by_layer[layer].push_back(&t);
  }
  json links = json::array();
  for (const auto& layer : layer_order) {
    std::vector<std::string> wnames;
    json inner = json::array();
    for (const Tensor* t : by_layer[layer]) {
      std::string suffix = t->name.size() > layer.size() ? t->name.substr(layer.size() + 1) : t->name;
      wnames.push_back(layer + "/" + suffix + ":0");
      Hid type;
      switch (t->dtype) {
        case DType::kF64:
          type = Hid(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
          break;
        case DType::kF32:
          type = Hid(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
          break;
        case DType::kF16:  // as h5py makes it
          type = Hid(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
          H5Tset_fields(type.get(), 15, 10, 5, 0, 10);
          H5Tset_size(type.get(), 2);
          H5Tset_ebias(type.get(), 15);
          break;
        case DType::kI64:
          type = Hid(H5Tcopy(H5T_STD_I64LE), H5Tclose);
          break;
        case DType::kI32:
          type = Hid(H5Tcopy(H5T_STD_I32LE), H5Tclose);
          break;
        case DType::kI16:
          type = Hid(H5Tcopy(H5T_STD_I16LE), H5Tclose);
          break;
        case DType::kI8:
          type = Hid(H5Tcopy(H5T_STD_I8LE), H5Tclose);
          break;
        case DType::kU64:
          type = Hid(H5Tcopy(H5T_STD_U64LE), H5Tclose);
          break;
        case DType::kU32:
          type = Hid(H5Tcopy(H5T_STD_U32LE), H5Tclose);
          break;
        case DType::kU16:
          type = Hid(H5Tcopy(H5T_STD_U16LE), H5Tclose);
          break;
        case DType::kU8:
          type = Hid(H5Tcopy(H5T_STD_U8LE), H5Tclose);
          break;
        case DType::kBool: {  // as h5py makes it
          type = Hid(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose);
          int8_t f = 0, t1 = 1;
          H5Tenum_insert(type.get(), "FALSE", &f);
          H5Tenum_insert(type.get(), "TRUE", &t1);
          break;
        }
        default:
          return invalid_argument("tensor '" + t->name + "': " + std::string(dtype_name(t->dtype)) +
                                  " has no HDF5 equivalent (export it as .safetensors or .pt)");
      }
      CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), "tensor '" + t->name + "'"));
      json ds{{"tensor", t->name}, {"dtype", std::string(dtype_name(t->dtype))}, {"shape", t->shape}, {"h5t", h5t}};
      inner.push_back(json{{"name", suffix + ":0"}, {"dataset", ds}});
    }
    json group_attrs = json::array();
    CAIRN_ASSIGN_OR_RETURN(json wn,
                           wnames.empty() ? empty_attr("weight_names") : string_attr("weight_names", wnames, false));
    group_attrs.push_back(wn);
    json layer_group{
        {"attrs", group_attrs},
        {"links", json::array({json{{"name", layer}, {"group", json{{"attrs", json::array()}, {"links", inner}}}}})}};
    links.push_back(json{{"name", layer}, {"group", layer_group}});
  }
  json root_attrs = json::array();
  CAIRN_ASSIGN_OR_RETURN(
      json ln, layer_order.empty() ? empty_attr("layer_names") : string_attr("layer_names", layer_order, false));
  root_attrs.push_back(ln);
  return json{{"attrs", root_attrs}, {"links", links}};
}

}  // namespace

Status export_keras_h5(v1::Client& client, const std::string& id, const std::string& file) {
  silence_hdf5();
  std::vector<Tensor> tensors;
  json meta;
  {
    auto reader = client.model_open(id);
    if (!reader) return to_status(reader.status());
    auto described = reader->describe();
    if (!described) return to_status(described.status());
    meta = json::parse(described->metadata_json, nullptr, false);
    auto infos = reader->tensors();
    if (!infos) return to_status(infos.status());
    for (const v1::TensorInfo& t : *infos) tensors.push_back(Tensor{t.name, from_c(t.dtype), t.shape, t.nbytes});
  }
  json tree;
  if (meta.is_object() && meta.contains("cairn.import") && meta["cairn.import"].is_object() &&
      meta["cairn.import"].value("format", "") == "keras-h5") {
    tree = meta["cairn.import"].value("tree", json());
  } else {
    auto t = synthesize_tree(tensors);
    if (!t.ok()) return t.status().with_context("model '" + id + "'");
    tree = std::move(t).value();
  }
  std::string tmp = file + ".cairn-tmp";
  Status st;
  {
    Hid fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    if (tree.is_object() && tree.contains("link_order"))
      H5Pset_link_creation_order(fcpl.get(), tree["link_order"].get<unsigned>());
    if (tree.is_object() && tree.contains("attr_order"))
      H5Pset_attr_creation_order(fcpl.get(), tree["attr_order"].get<unsigned>());
    Hid f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
    if (!f.ok()) return h5_error("cannot create '" + tmp + "'");
    Hid root(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    Writer w{f.get(), &client, id, std::move(tensors)};
    try {
      st = write_group(w, root.get(), tree, "");
    } catch (const json::exception& e) {
      st = invalid_argument(std::string("the recorded HDF5 layout is malformed: ") + e.what());
    }
    root.reset();
    if (st.ok() && H5Fflush(f.get(), H5F_SCOPE_GLOBAL) < 0) st = h5_error("cannot write '" + tmp + "'");
    f.reset();
  }
  if (st.ok() && std::rename(tmp.c_str(), file.c_str()) != 0) st = errno_status("renaming to '" + file + "'", errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st.with_context("exporting model '" + id + "' to '" + file + "'");
  }
  return Status::OK();
}

#endif  // CAIRN_HAVE_HDF5

}  // namespace cairn::tool
