#!/usr/bin/env python3
"""How long a NAS candidate task waits for its parent's tensors, with and without the driver's hints.

A chain of candidates c0 -> c1 -> ... is stored first (each child rewrites a fraction of its parent's
tensors and inherits the rest, as regularized evolution's mutations do). Then the search is replayed
against a freshly started cairnd with the page cache dropped, twice: task i loads its parent c(i-1)
(the wait measured: the time until every tensor is in hand), then "trains" for --train seconds. In
the hinted run the driver, knowing which parent the next task derives from, sends
`hint will_load [c(i)]` when task i starts, so the daemon can stage c(i)'s new tensors from the
repository while task i trains; unhinted, task i+1 reads them from the repository when it starts.

Usage: bench/workloads/prefetch_bench.py [--quick] [--json FILE] [--trace FILE]
  --trace: the hinted run's chunk-level trace as cairnd records it (policy.trace), for cairn-sim.
Needs a build (scripts/build): it starts build/bin/cairnd itself and stops it by pid.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402

import cairn  # noqa: E402
from bench_daemon import Daemon, drop_caches  # noqa: E402


def daemon(root: Path, trace: str = "") -> Daemon:
    return Daemon(BUILD, root, "1GiB", f"  prefetch: hints\n  trace: \"{trace}\"\n")


def build_chain(client, n: int, tensors: int, tensor_bytes: int, changed: int, rng):
    """Stores c0..c(n-1); returns {id: {name: digest}} to check every load against."""
    names = [f"layer{k}.weight" for k in range(tensors)]
    current = {nm: rng.integers(0, 255, tensor_bytes, dtype=np.uint8) for nm in names}
    expect = {}
    for i in range(n):
        if i > 0:
            for nm in rng.choice(names, size=changed, replace=False):
                current[nm] = rng.integers(0, 255, tensor_bytes, dtype=np.uint8)
        cid = f"c{i}"
        client.save_model(cid, current, parent=None if i == 0 else f"c{i - 1}", durability="global")
        expect[cid] = {nm: hash(a.tobytes()) for nm, a in current.items()}
    return expect


def replay(root: Path, n: int, train_s: float, hinted: bool, expect, trace: str = "") -> dict:
    d = daemon(root, trace).start()
    try:
        how = drop_caches([p for p in (root / "repo").rglob("*") if p.is_file()])
        c = cairn.connect(d.socket)
        waits = []
        for i in range(1, n):
            if hinted:
                c.hint("will_load", [f"c{i}"], when=train_s)  # the next task's parent
            t0 = time.perf_counter()
            got = c.load_model(f"c{i - 1}")
            waits.append(time.perf_counter() - t0)
            for nm, a in got.items():
                if hash(a.tobytes()) != expect[f"c{i - 1}"][nm]:
                    raise SystemExit(f"prefetch_bench: c{i - 1}/{nm} read back wrong")
            del got
            time.sleep(train_s)  # the candidate trains
        stats = c._request({"op": "stats"})
        c.close()
        return {"waits_s": waits, "median_wait_s": statistics.median(waits), "mean_wait_s": statistics.mean(waits),
                "prefetch": stats.get("prefetch", {}), "cache_drop": how,
                "dram_misses": stats["tiers"]["dram"]["misses"], "dram_hits": stats["tiers"]["dram"]["hits"]}
    finally:
        d.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--trace", default="", help="record the hinted run's chunk trace (policy.trace) to this file")
    args = ap.parse_args()
    n, tensors, tensor_bytes, changed, train_s = (4, 8, 1 << 20, 4, 0.05) if args.quick else (10, 32, 4 << 20, 16, 0.4)
    root = Path(tempfile.mkdtemp(prefix="cairn-prefetch-bench-"))
    try:
        d = daemon(root).start()
        try:
            c = cairn.connect(d.socket)
            expect = build_chain(c, n, tensors, tensor_bytes, changed, np.random.default_rng(7))
            c.close()
        finally:
            d.stop()
        out = {"candidates": n, "model_bytes": tensors * tensor_bytes, "new_bytes_per_candidate": changed * tensor_bytes,
               "train_s": train_s}
        out["no_hints"] = replay(root, n, train_s, False, expect)
        out["hints"] = replay(root, n, train_s, True, expect, str(Path(args.trace).resolve()) if args.trace else "")
        text = json.dumps(out, indent=2)
        if args.json:
            Path(args.json).write_text(text)
        print(f"parent wait, median over {n - 1} tasks: without hints {out['no_hints']['median_wait_s'] * 1e3:.1f} ms, "
              f"with hints {out['hints']['median_wait_s'] * 1e3:.1f} ms; prefetched chunks used "
              f"{out['hints']['prefetch'].get('chunks_used')}, wasted {out['hints']['prefetch'].get('chunks_wasted')}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
