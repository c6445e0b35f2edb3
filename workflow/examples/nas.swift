// NAS-style evolution in Swift/T with cairn leaf functions (docs/workflows.md): each generation
// derives CANDIDATES children from the previous generation's best model; the candidates run in a
// `foreach` on worker ranks. A candidate's leaf gets its parent from the node's cairnd as a file, an
// app trains one layer of it (nas_swift_candidate.py), and a leaf commits the child with its parent
// and score, so the layer it did not train is stored once. The best child (by score, asked of
// cairn) seeds the next generation. Hints (docs/policy.md) tell the daemon what comes next: each
// generation is the population the next parent is drawn from, and the chosen parent is staged
// (will_load) before the next generation's candidates ask for it.
//
//   swift-t -I <lib>/tcl/cairn -r <lib>/tcl/cairn -n 3 nas.swift --work=DIR --base=BASE.safetensors \
//       --python=python3 --script=nas_swift_candidate.py [--generations=3] [--candidates=4] [--prefix=nas]
import io;
import files;
import string;
import sys;
import cairn;

app (file o) candidate(string python, string script, string parent_path, string child_path, int seed) {
  python script parent_path child_path seed @stdout=o
}

(string best) generation(string prefix, string parent, int g, int C, string work, string python, string script) {
  string ids[];
  string parent_path = cairn_get(parent, sprintf("%s/%s.safetensors", work, parent));
  foreach c in [0:C-1] {
    string id = sprintf("%s-g%i-c%i", prefix, g, c);
    string path = sprintf("%s/%s.safetensors", work, id);
    file s<sprintf("%s/%s.score", work, id)> = candidate(python, script, parent_path, path, g * 1000 + c);
    string score = trim(read(s));
    ids[c] = cairn_put_meta(id, path, parent, "global", sprintf("{\"score\": %s, \"generation\": %i}", score, g));
  }
  string pop = cairn_hint("population", string_join(ids, ","));
  printf("hint population %i: %s", g, pop);
  best = cairn_best_of(string_join(ids, ","));
}

(string best) evolve(string prefix, string parent, int g, int G, int C, string work, string python, string script) {
  if (g > G) {
    best = parent;
  } else {
    string b = generation(prefix, parent, g, C, work, python, script);
    printf("generation %i: best %s (score %f)", g, b, cairn_score(b));
    if (g < G) {
      string h = cairn_hint("will_load", b);
      printf("hint will_load %i: %s", g, h);
      wait (h) {
        best = evolve(prefix, b, g + 1, G, C, work, python, script);
      }
    } else {
      best = b;
    }
  }
}

main {
  string work = argv("work");
  string python = argv("python", "python3");
  string script = argv("script");
  string prefix = argv("prefix", "nas");
  int G = toint(argv("generations", "3"));
  int C = toint(argv("candidates", "4"));
  string root = cairn_put(prefix + "-g0", argv("base"), "", "global");
  string best = evolve(prefix, root, 1, G, C, work, python, script);
  printf("best: %s lineage: %s", best, cairn_lineage(best));
}
