"""Metadata-only commits from Python as a new user writes them: `save_model(id, {}, parent=...,
inherit_all=True)` with the defaults (durability global, not waited: the client sends the next commit
at once and the tickets are waited at the end, so the time covers every model reaching the
repository), then the same at `memory`, then `wait=True` (each commit waits for its own fsync).
Baseline in the same run: write + fsync of one manifest-sized file per model, from Python.

Usage: metadata_python.py [--models N] [--quick] [--json FILE]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))
import cairn  # noqa: E402
from bench_daemon import Daemon  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=20000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = 2000 if a.quick else a.models
    blocking_n = min(n, 300)
    with tempfile.TemporaryDirectory(prefix="cairn-meta-py-") as tmp:
        root = Path(tmp)
        d = Daemon(BUILD, root, "256MiB").start()
        c = cairn.connect(d.socket)
        rng = np.random.default_rng(0)
        c.save_model("base", {f"layer{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(62)},
                     wait=True)

        def timed(prefix, count, **kw):
            t0 = time.perf_counter()
            tickets = [c.save_model(f"{prefix}{i}", {}, parent="base", inherit_all=True, meta={"score": i}, **kw)
                       for i in range(count)]
            for t in tickets:
                if t is not None and hasattr(t, "wait"):
                    t.wait()
            return count / (time.perf_counter() - t0)

        res = {"models": n,
               "global_default_per_s": timed("g", n),
               "memory_pipelined_per_s": timed("m", n, durability="memory"),
               "global_blocking_per_s": timed("b", blocking_n, wait=True)}
        del c
        d.stop()
        text = json.dumps({"id": "x", "tensors": [{"name": f"layer{i}.weight", "chunks": ["0" * 32]}
                                                  for i in range(62)]})
        (root / "files").mkdir()
        t0 = time.perf_counter()
        for i in range(blocking_n):
            with open(root / "files" / f"m{i}.json", "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        res["file_fsync_per_s"] = blocking_n / (time.perf_counter() - t0)
    print(f"metadata-only commits from Python ({n:,} models): defaults (global, not waited) "
          f"{res['global_default_per_s']:,.0f}/s; memory {res['memory_pipelined_per_s']:,.0f}/s; global, wait=True "
          f"{res['global_blocking_per_s']:,.0f}/s; write+fsync of a file {res['file_fsync_per_s']:,.0f}/s")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
