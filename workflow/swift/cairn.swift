// cairn leaf functions for Swift/T (docs/workflows.md). Each call is a task on a worker rank that
// talks to that node's cairnd ($CAIRN_SOCKET) through the Tcl package `cairn` (libtclcairn.so over
// libcairn.so). Compile with `swift-t -I <dir> -r <dir>`, <dir> = <prefix>/lib/tcl/cairn (or
// <build>/lib/tcl/cairn), and `import cairn;`.
//
// Models move node-locally through the daemon: a leaf that puts a file reads it straight into the
// daemon's arena; nothing passes through Turbine's data store but ids, paths and small values.
// Blobs are stored as named tensors (a flat key space shared by the job's daemons).

// Stores the safetensors file `path` as model `id`, derived from `parent` ("" for none: tensors equal
// to the parent's are stored once), at `durability` (memory, local, global). Returns `id` once done.
@dispatch=WORKER
(string o) cairn_put(string id, string path, string parent, string durability) "cairn" "0.1" [
  "set <<o>> [ cairn::put_file <<id>> <<path>> <<parent>> <<durability>> ]"
];

// The same with metadata: a JSON object, e.g. {"score": 0.93}.
@dispatch=WORKER
(string o) cairn_put_meta(string id, string path, string parent, string durability, string meta) "cairn" "0.1" [
  "set <<o>> [ cairn::put_file <<id>> <<path>> <<parent>> <<durability>> <<meta>> ]"
];

// Writes model `id` as the safetensors file `path`; returns `path` once it is there.
@dispatch=WORKER
(string o) cairn_get(string id, string path) "cairn" "0.1" [
  "set <<o>> [ cairn::get_file <<id>> <<path>> ]"
];

// The stored model sharing the most layers with the architecture graph in `graph_path`
// (docs/graph-format.md); "" when none shares any.
@dispatch=WORKER
(string o) cairn_best_ancestor(string graph_path) "cairn" "0.1" [
  "set <<o>> [ cairn::best_ancestor <<graph_path>> ]"
];

// The ancestors of `id`, parent first, separated by spaces.
@dispatch=WORKER
(string o) cairn_lineage(string id) "cairn" "0.1" [
  "set <<o>> [ join [ cairn::lineage <<id>> ] \" \" ]"
];

// The metadata of `id` as JSON, and its numeric "score".
@dispatch=WORKER
(string o) cairn_metadata(string id) "cairn" "0.1" [
  "set <<o>> [ cairn::metadata <<id>> ]"
];
@dispatch=WORKER
(float o) cairn_score(string id) "cairn" "0.1" [
  "set <<o>> [ cairn::score <<id>> ]"
];

// Of the models in `ids` (comma- or space-separated), the one with the highest metadata score.
@dispatch=WORKER
(string o) cairn_best_of(string ids) "cairn" "0.1" [
  "set <<o>> [ cairn::best_of <<ids>> ]"
];

// Named tensors as blobs: put (returns the byte count), get, poll (1 once `key` exists, waiting up
// to timeout_ms), delete.
@dispatch=WORKER
(int o) cairn_put_blob(string key, blob b) "cairn" "0.1" [
  "set <<o>> [ cairn::put_blob <<key>> [ lindex <<b>> 0 ] [ lindex <<b>> 1 ] ]"
];
@dispatch=WORKER
(blob o) cairn_get_blob(string key) "cairn" "0.1" [
  "set <<o>> [ cairn::get_blob <<key>> ]"
];
@dispatch=WORKER
(int o) cairn_poll(string key, int timeout_ms) "cairn" "0.1" [
  "set <<o>> [ cairn::poll <<key>> <<timeout_ms>> ]"
];

// Tells the node's daemon what the workflow will read next (docs/policy.md): `kind` is will_load,
// population, sequence or done; `models_json` a JSON array of ids (["a","b"]) or ids separated by
// commas or spaces. Returns the daemon's answer (JSON; "unknown" lists ids that do not exist).
// Advice: it changes what is staged and evicted, never what is read.
@dispatch=WORKER
(string o) cairn_hint(string kind, string models_json) "cairn" "0.1" [
  "set <<o>> [ cairn::hint <<kind>> <<models_json>> ]"
];

// The same with the kind's other fields as a JSON object, e.g. {"when": 2.5} or {"ahead": 1}.
@dispatch=WORKER
(string o) cairn_hint_fields(string kind, string models_json, string fields_json) "cairn" "0.1" [
  "set <<o>> [ cairn::hint <<kind>> <<models_json>> <<fields_json>> ]"
];
