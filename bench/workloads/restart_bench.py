"""A daemon restart on a big shared repository, as a user meets it: N metadata-only models (children
inheriting all 62 tensors of a base, pipelined commits at `memory`, then `cairn flush`), the daemon
stopped, then started again: the time until it answers its first request, and until `cairn ls`
has listed every model; the files under the repository. Baselines: the issue's goal (2 s) and, for
the files, one manifest file per model (format 1).

Usage: restart_bench.py [--models N] [--quick] [--json FILE]
"""
import argparse
import json
import os
import subprocess
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
    ap.add_argument("--models", type=int, default=100000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = 10000 if a.quick else a.models
    with tempfile.TemporaryDirectory(prefix="cairn-restart-") as tmp:
        root = Path(tmp)
        d = Daemon(BUILD, root, "512MiB").start()
        env = dict(os.environ, CAIRN_SOCKET=d.socket)
        c = cairn.connect(d.socket)
        rng = np.random.default_rng(0)
        c.save_model("base", {f"layer{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(62)},
                     wait=True)
        t0 = time.time()
        prev = "base"
        for i in range(n):
            mid = f"cand{i}"
            c.save_model(mid, {}, parent="base" if i % 100 == 0 else prev, inherit_all=True, durability="memory",
                         meta={"score": i})
            prev = mid
        c.pipeline_flush()
        commit_s = time.time() - t0
        subprocess.run([str(BUILD / "bin" / "cairn"), "flush"], env=env, check=True, capture_output=True)
        flushed_s = time.time() - t0
        del c
        d.stop()
        files = sum(len(fs) for _, _, fs in os.walk(root / "repo"))
        t0 = time.time()
        d.start(backed=False)  # the start itself is timed
        first_s = time.time() - t0
        out = subprocess.run([str(BUILD / "bin" / "cairn"), "ls"], env=env, check=True, capture_output=True, text=True)
        listed_s = time.time() - t0
        listed = len(out.stdout.splitlines())
        d.stop()
        # The daemon's own account of its start (logged at info: CAIRN_BENCH_LOG_LEVEL=info).
        log = root / "cairnd.log"
        parts = [ln.split("] ", 1)[-1] for ln in (log.read_text().splitlines() if log.exists() else [])
                 if "start: repository opened" in ln]
        breakdown = parts[-1].strip() if parts else ""
    res = {"models": n + 1, "commits_per_s_pipelined": n / commit_s, "seconds_to_repository": flushed_s,
           "files": files, "restart_first_answer_s": first_s, "restart_listed_all_s": listed_s, "listed": listed,
           "start_breakdown": breakdown}
    print(f"restart on a repository of {n + 1:,} models ({files} files): first answer {first_s:.2f} s, "
          f"every model listed {listed_s:.2f} s (goal: 2 s); commits {n / commit_s:,.0f}/s pipelined")
    if breakdown:
        print(f"  the daemon: {breakdown}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if listed == n + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
