// The Tcl package `cairn` (Swift/T leaf functions, workflow/swift/cairn.swift): Tcl commands over
// the C API (cairn.h), loaded through Tcl stubs by each Turbine worker. One connection per process
// to the node's daemon ($CAIRN_SOCKET), made on first use; a failure raises a Tcl error naming the
// socket, at once. JSON answers are read with nlohmann-json (header-only); nothing else of cairn's
// internals is used.
//
//   cairn::put_file ID PATH ?PARENT? ?DURABILITY? ?META_JSON?   -> ID
//   cairn::get_file ID PATH                                      -> PATH
//   cairn::best_ancestor GRAPH_FILE ?WHERE_JSON?                 -> model id, "" when none matches
//   cairn::lineage ID                                            -> list of ancestors, parent first
//   cairn::metadata ID                                           -> the metadata as JSON
//   cairn::score ID                                              -> metadata "score" (a double)
//   cairn::best_of IDS                                           -> the id with the highest score
//   cairn::put_blob KEY PTR LENGTH                               -> LENGTH (a named tensor, U8)
//   cairn::get_blob KEY                                          -> {PTR LENGTH} (malloc'd: Turbine frees it)
//   cairn::poll KEY TIMEOUT_MS                                   -> 1 if KEY exists, else 0
//   cairn::delete KEY                                            -> ""
//   cairn::hint KIND MODELS ?FIELDS_JSON?                        -> the daemon's answer (JSON)
#include <tcl.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cairn/cairn.h"

namespace {

using nlohmann::json;

cairn_client* g_client = nullptr;

int error(Tcl_Interp* interp, const std::string& msg) {
  Tcl_SetObjResult(interp, Tcl_NewStringObj(("cairn: " + msg).c_str(), -1));
  return TCL_ERROR;
}

int cairn_error(Tcl_Interp* interp, const std::string& what) { return error(interp, what + ": " + cairn_last_error()); }

// The process's connection; nullptr (and the Tcl error set) when there is no daemon.
cairn_client* client(Tcl_Interp* interp) {
  if (g_client) return g_client;
  if (cairn_connect(nullptr, &g_client) != CAIRN_OK) {
    g_client = nullptr;
    cairn_error(interp, "no daemon");
  }
  return g_client;
}

std::string arg(Tcl_Obj* const objv[], int i) { return Tcl_GetString(objv[i]); }

// Model ids given as a Tcl list, or separated by commas (Swift strings). False if not a list.
bool split_ids(Tcl_Interp* interp, std::string text, std::vector<std::string>* ids) {
  for (auto& ch : text)
    if (ch == ',') ch = ' ';
  Tcl_Obj* list = Tcl_NewStringObj(text.c_str(), -1);
  Tcl_IncrRefCount(list);
  int n = 0;
  Tcl_Obj** items = nullptr;
  const bool ok = Tcl_ListObjGetElements(interp, list, &n, &items) == TCL_OK;
  for (int i = 0; ok && i < n; ++i) ids->push_back(Tcl_GetString(items[i]));
  Tcl_DecrRefCount(list);
  return ok;
}

bool parse_durability(const std::string& s, cairn_durability* d) {
  if (s == "memory")
    *d = CAIRN_DURABILITY_MEMORY;
  else if (s == "local")
    *d = CAIRN_DURABILITY_LOCAL;
  else if (s == "global" || s.empty())
    *d = CAIRN_DURABILITY_GLOBAL;
  else
    return false;
  return true;
}

// Runs a request or query and parses its JSON answer.
int call(Tcl_Interp* interp, const json& request, bool query, json* out) {
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  char* text = nullptr;
  std::string req = request.dump();
  cairn_status st = query ? cairn_query(c, req.c_str(), &text) : cairn_request(c, req.c_str(), &text);
  if (st != CAIRN_OK) return cairn_error(interp, request.value("op", std::string(query ? "query" : "request")));
  *out = json::parse(text ? text : "null", nullptr, false);
  cairn_free(text);
  if (out->is_discarded()) return error(interp, "the daemon's answer is not JSON");
  return TCL_OK;
}

int PutFile(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc < 3 || objc > 6) {
    Tcl_WrongNumArgs(interp, 1, objv, "id path ?parent? ?durability? ?meta_json?");
    return TCL_ERROR;
  }
  cairn_durability d;
  std::string parent = objc > 3 ? arg(objv, 3) : "";
  std::string dur = objc > 4 ? arg(objv, 4) : "global";
  std::string meta = objc > 5 ? arg(objv, 5) : "";
  if (!parse_durability(dur, &d)) return error(interp, "durability '" + dur + "' is not one of memory, local, global");
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  if (cairn_model_put_file(c, Tcl_GetString(objv[1]), Tcl_GetString(objv[2]), parent.c_str(), d,
                           meta.empty() ? nullptr : meta.c_str()) != CAIRN_OK)
    return cairn_error(interp, "put_file " + arg(objv, 1));
  Tcl_SetObjResult(interp, objv[1]);
  return TCL_OK;
}

int GetFile(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 3) {
    Tcl_WrongNumArgs(interp, 1, objv, "id path");
    return TCL_ERROR;
  }
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  if (cairn_model_get_file(c, Tcl_GetString(objv[1]), Tcl_GetString(objv[2])) != CAIRN_OK)
    return cairn_error(interp, "get_file " + arg(objv, 1));
  Tcl_SetObjResult(interp, objv[2]);
  return TCL_OK;
}

int BestAncestor(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2 && objc != 3) {
    Tcl_WrongNumArgs(interp, 1, objv, "graph_file ?where_json?");
    return TCL_ERROR;
  }
  std::ifstream in(arg(objv, 1));
  if (!in) return error(interp, "cannot read the graph file '" + arg(objv, 1) + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json graph = json::parse(ss.str(), nullptr, false);
  if (graph.is_discarded()) return error(interp, "the graph file '" + arg(objv, 1) + "' is not JSON");
  json q{{"op", "best_ancestor"}, {"graph", graph}};
  if (objc == 3 && *Tcl_GetString(objv[2])) {
    json where = json::parse(arg(objv, 2), nullptr, false);
    if (where.is_discarded()) return error(interp, "where is not JSON");
    q["where"] = where;
  }
  json r;
  if (call(interp, q, true, &r) != TCL_OK) return TCL_ERROR;
  std::string model = r.contains("model") && r["model"].is_string() ? r["model"].get<std::string>() : "";
  Tcl_SetObjResult(interp, Tcl_NewStringObj(model.c_str(), -1));
  return TCL_OK;
}

int Lineage(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "id");
    return TCL_ERROR;
  }
  json r;
  if (call(interp, json{{"op", "ancestors"}, {"model", arg(objv, 1)}}, true, &r) != TCL_OK) return TCL_ERROR;
  Tcl_Obj* list = Tcl_NewListObj(0, nullptr);
  if (r.contains("ancestors") && r["ancestors"].is_array())
    for (const auto& a : r["ancestors"])
      if (a.is_string()) Tcl_ListObjAppendElement(interp, list, Tcl_NewStringObj(a.get<std::string>().c_str(), -1));
  Tcl_SetObjResult(interp, list);
  return TCL_OK;
}

int show(Tcl_Interp* interp, const std::string& id, json* out) {
  return call(interp, json{{"op", "show"}, {"id", id}}, false, out);
}

int Metadata(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "id");
    return TCL_ERROR;
  }
  json r;
  if (show(interp, arg(objv, 1), &r) != TCL_OK) return TCL_ERROR;
  std::string m = r.contains("metadata") ? r["metadata"].dump() : "{}";
  Tcl_SetObjResult(interp, Tcl_NewStringObj(m.c_str(), -1));
  return TCL_OK;
}

int score_of(Tcl_Interp* interp, const std::string& id, double* score) {
  json r;
  if (show(interp, id, &r) != TCL_OK) return TCL_ERROR;
  const json* m = r.contains("metadata") ? &r["metadata"] : nullptr;
  if (!m || !m->is_object() || !m->contains("score") || !(*m)["score"].is_number())
    return error(interp, "model '" + id + "' has no numeric metadata 'score'");
  *score = (*m)["score"].get<double>();
  return TCL_OK;
}

int Score(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "id");
    return TCL_ERROR;
  }
  double s = 0;
  if (score_of(interp, arg(objv, 1), &s) != TCL_OK) return TCL_ERROR;
  Tcl_SetObjResult(interp, Tcl_NewDoubleObj(s));
  return TCL_OK;
}

// The id with the highest metadata score among IDS (a Tcl list, or a comma-separated string).
int BestOf(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "ids");
    return TCL_ERROR;
  }
  std::vector<std::string> ids;
  if (!split_ids(interp, arg(objv, 1), &ids) || ids.empty())
    return error(interp, "best_of needs at least one model id");
  std::string best;
  double best_score = 0;
  for (const auto& id : ids) {
    double s = 0;
    if (score_of(interp, id, &s) != TCL_OK) return TCL_ERROR;
    if (best.empty() || s > best_score) best = id, best_score = s;
  }
  Tcl_SetObjResult(interp, Tcl_NewStringObj(best.c_str(), -1));
  return TCL_OK;
}

int PutBlob(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 4) {
    Tcl_WrongNumArgs(interp, 1, objv, "key ptr length");
    return TCL_ERROR;
  }
  Tcl_WideInt ptr = 0, len = 0;
  if (Tcl_GetWideIntFromObj(interp, objv[2], &ptr) != TCL_OK || Tcl_GetWideIntFromObj(interp, objv[3], &len) != TCL_OK)
    return TCL_ERROR;
  if (len < 0 || (len > 0 && ptr == 0)) return error(interp, "put_blob: not a blob {pointer length}");
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  int64_t shape[1] = {static_cast<int64_t>(len)};
  static const unsigned char kEmpty = 0;
  const void* data = len ? reinterpret_cast<const void*>(static_cast<intptr_t>(ptr)) : &kEmpty;
  if (cairn_tensor_put(c, Tcl_GetString(objv[1]), data, CAIRN_DTYPE_U8, 1, shape) != CAIRN_OK)
    return cairn_error(interp, "put_blob " + arg(objv, 1));
  Tcl_SetObjResult(interp, Tcl_NewWideIntObj(len));
  return TCL_OK;
}

int GetBlob(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "key");
    return TCL_ERROR;
  }
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  cairn_dtype dt;
  int ndim = 0;
  int64_t shape[CAIRN_MAX_DIMS];
  size_t nbytes = 0;
  if (cairn_tensor_info(c, Tcl_GetString(objv[1]), &dt, &ndim, shape, &nbytes) != CAIRN_OK)
    return cairn_error(interp, "get_blob " + arg(objv, 1));
  // Turbine copies the blob into its store and then free()s this pointer.
  void* buf = std::malloc(nbytes ? nbytes : 1);
  if (!buf) return error(interp, "out of memory");
  if (cairn_tensor_unpack(c, Tcl_GetString(objv[1]), buf, nbytes) != CAIRN_OK) {
    std::free(buf);
    return cairn_error(interp, "get_blob " + arg(objv, 1));
  }
  Tcl_Obj* l[2] = {Tcl_NewWideIntObj(static_cast<Tcl_WideInt>(reinterpret_cast<intptr_t>(buf))),
                   Tcl_NewWideIntObj(static_cast<Tcl_WideInt>(nbytes))};
  Tcl_SetObjResult(interp, Tcl_NewListObj(2, l));
  return TCL_OK;
}

int Poll(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 3) {
    Tcl_WrongNumArgs(interp, 1, objv, "key timeout_ms");
    return TCL_ERROR;
  }
  int timeout = 0, found = 0;
  if (Tcl_GetIntFromObj(interp, objv[2], &timeout) != TCL_OK) return TCL_ERROR;
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  if (cairn_tensor_poll(c, Tcl_GetString(objv[1]), timeout, &found) != CAIRN_OK)
    return cairn_error(interp, "poll " + arg(objv, 1));
  Tcl_SetObjResult(interp, Tcl_NewIntObj(found ? 1 : 0));
  return TCL_OK;
}

int Delete(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 2) {
    Tcl_WrongNumArgs(interp, 1, objv, "key");
    return TCL_ERROR;
  }
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  if (cairn_tensor_delete(c, Tcl_GetString(objv[1])) != CAIRN_OK) return cairn_error(interp, "delete " + arg(objv, 1));
  Tcl_ResetResult(interp);
  return TCL_OK;
}

// A hint (docs/policy.md): KIND is will_load, population, sequence or done; MODELS a JSON array of
// ids, or a Tcl list / comma-separated ids; FIELDS_JSON an object of the kind's other fields
// ({"when": 2.5}, {"ahead": 1}). A malformed hint is a Tcl error naming the field; unknown ids are
// listed in the answer, not an error.
int Hint(ClientData, Tcl_Interp* interp, int objc, Tcl_Obj* const objv[]) {
  if (objc != 3 && objc != 4) {
    Tcl_WrongNumArgs(interp, 1, objv, "kind models ?fields_json?");
    return TCL_ERROR;
  }
  json h = json::object();
  if (objc == 4 && *Tcl_GetString(objv[3])) {
    h = json::parse(arg(objv, 3), nullptr, false);
    if (!h.is_object()) return error(interp, "hint: fields_json is not a JSON object: " + arg(objv, 3));
  }
  h["kind"] = arg(objv, 1);
  std::string text = arg(objv, 2);
  json models = json::parse(text, nullptr, false);
  if (!models.is_array()) {
    std::vector<std::string> ids;
    const bool ok = split_ids(interp, text, &ids);
    models = ids;
    if (!ok) return error(interp, "hint: models is neither a JSON array nor a list of ids: " + arg(objv, 2));
  }
  h["models"] = models;
  cairn_client* c = client(interp);
  if (!c) return TCL_ERROR;
  char* answer = nullptr;
  if (cairn_hint(c, h.dump().c_str(), &answer) != CAIRN_OK) return cairn_error(interp, "hint " + arg(objv, 1));
  Tcl_SetObjResult(interp, Tcl_NewStringObj(answer ? answer : "{}", -1));
  cairn_free(answer);
  return TCL_OK;
}

}  // namespace

extern "C" int Tclcairn_Init(Tcl_Interp* interp) {
  if (Tcl_InitStubs(interp, "8.6", 0) == nullptr) return TCL_ERROR;
  struct {
    const char* name;
    Tcl_ObjCmdProc* proc;
  } cmds[] = {{"cairn::put_file", PutFile}, {"cairn::get_file", GetFile},  {"cairn::best_ancestor", BestAncestor},
              {"cairn::lineage", Lineage},  {"cairn::metadata", Metadata}, {"cairn::score", Score},
              {"cairn::best_of", BestOf},   {"cairn::put_blob", PutBlob},  {"cairn::get_blob", GetBlob},
              {"cairn::poll", Poll},        {"cairn::delete", Delete},     {"cairn::hint", Hint}};
  Tcl_Eval(interp, "namespace eval ::cairn {}");
  for (const auto& c : cmds) Tcl_CreateObjCommand(interp, c.name, c.proc, nullptr, nullptr);
  return Tcl_PkgProvide(interp, "cairn", "0.1");
}
