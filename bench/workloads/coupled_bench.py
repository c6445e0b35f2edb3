"""The coupled example over cairn and over Redis (docs/coupled.md, bench part `coupled`): the MPI
heat simulation (coupled_heat) on 2 ranks publishes its field every 5 steps, the PyTorch trainer
(trainer.py) reads the fields and commits surrogate versions, the simulation loads the newest one
at each publication. Both backends run with the same arguments, a fresh cairnd or redis-server
(Unix socket, --save "" --appendonly no) per run, started here and stopped by pid; the runs
alternate between the backends. Both programs write --stats JSON; from it, per backend:

  publish    the time a rank spends in one publication's put (every rank, every publication of
             every run pooled): median and p90
  bandwidth  field bytes put and read / time spent putting and reading them (the simulation's
             puts over all ranks plus the trainer's gets), MB/s, median over runs
  load       the time rank 0 takes to load the newest surrogate (poll of surrogate/latest through
             the last weight read), all loads pooled: median
  wall       from the trainer's start until both programs ended, median over runs

at the example's default field (64 x 64) and at one of 2048 x 2048 (16 MiB, 8 MiB per rank).

Usage: coupled_bench.py [--quick] [--repeats 3] [--json FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
HEAT = BUILD / "bin" / "coupled_heat"
TRAINER = ROOT / "workflow" / "examples" / "coupled" / "trainer.py"
sys.path.insert(0, str(HERE))

from bench_daemon import Daemon  # noqa: E402
from workloads import RedisServer  # noqa: E402

# name, field, steps; every 5 steps, 40 ms of pacing on rank 0 per publication (the docs' run).
FULL = [("64x64", 64, 64, 300), ("2048x2048", 2048, 2048, 100)]
QUICK = [("64x64", 64, 64, 60), ("512x512", 512, 512, 30)]
EVERY, PACE_MS = 5, 40


def percentile(xs, q):
    xs = sorted(xs)
    i = (len(xs) - 1) * q
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def wait_idle(pid, timeout=30.0):
    """Waits until process pid stops using CPU (cairnd pre-faults its DRAM arena after its socket
    opens, which a job's prolog hides; the runs start on a settled server, whichever it is)."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu():
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tick

    deadline, last = time.time() + timeout, cpu()
    while time.time() < deadline:
        time.sleep(0.2)
        now = cpu()
        if now - last < 0.01:
            return
        last = now


def one_run(backend, nx, ny, steps, root):
    """Runs the example once over a fresh server; returns the two --stats objects and the wall time."""
    root.mkdir(parents=True)
    server = Daemon(BUILD, root, "1GiB") if backend == "cairn" else RedisServer(root)
    server.start()
    try:
        wait_idle(server.proc.pid)
        env = dict(os.environ, CAIRN_SOCKET=server.socket, OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
                   OMPI_MCA_mpi_yield_when_idle="1")
        where = ["--backend", backend] + (["--redis", server.socket] if backend == "redis" else [])
        t0 = time.perf_counter()
        trainer = subprocess.Popen([sys.executable, str(TRAINER), "--ranks", "2", "--every", str(EVERY), "--timeout",
                                    "600", "--stats", str(root / "trainer.json"), *where], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            sim = subprocess.run(["mpirun", "-np", "2", str(HEAT), *where, "--nx", str(nx), "--ny", str(ny), "--steps",
                                  str(steps), "--every", str(EVERY), "--pace-ms", str(PACE_MS), "--stats",
                                  str(root / "heat.json")], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=600)
            out, _ = trainer.communicate(timeout=600)
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
        wall = time.perf_counter() - t0
        if sim.returncode or trainer.returncode:
            raise RuntimeError(f"coupled {backend} {nx}x{ny}: simulation exit {sim.returncode}, trainer exit "
                               f"{trainer.returncode}:\n{sim.stdout[-1500:]}\n{out[-1500:]}")
        heat = json.loads((root / "heat.json").read_text())
        tr = json.loads((root / "trainer.json").read_text())
        if tr["fields"] != heat["publications"]:
            raise RuntimeError(f"coupled {backend} {nx}x{ny}: the trainer read {tr['fields']} fields of "
                               f"{heat['publications']} published")
        if tr["bytes_read"] != heat["publications"] * heat["ranks"] * heat["slab_bytes"]:
            raise RuntimeError(f"coupled {backend} {nx}x{ny}: the trainer read {tr['bytes_read']} bytes")
        return heat, tr, wall
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def summarize(runs):
    publish = [t for heat, _, _ in runs for rank in heat["publish_s"] for t in rank]
    loads = [t for heat, _, _ in runs for t in heat["surrogate_load_s"]]
    bandwidth = []
    for heat, tr, _ in runs:
        put_bytes = heat["publications"] * heat["ranks"] * heat["slab_bytes"]
        busy = sum(sum(rank) for rank in heat["publish_s"]) + sum(tr["get_s"])
        bandwidth.append((put_bytes + tr["bytes_read"]) / busy / 1e6)
    # No loads: the run ended before the trainer committed a surrogate (a short run on busy cores);
    # the load figures are then None and the harness leaves their row out, saying so.
    return {"publish_s_median": statistics.median(publish), "publish_s_p90": percentile(publish, 0.9),
            "publications": len(publish), "bandwidth_MBps_median": statistics.median(bandwidth),
            "bandwidth_MBps": bandwidth, "surrogate_load_s_median": statistics.median(loads) if loads else None,
            "loads": len(loads),
            "wall_s_median": statistics.median(w for _, _, w in runs), "wall_s": [w for _, _, w in runs],
            "loop_s": [h["loop_s"] for h, _, _ in runs], "versions_used": [h["versions_used"] for h, _, _ in runs],
            "versions_committed": [t["versions"] for _, t, _ in runs],
            "commit_s_median": statistics.median(c for _, t, _ in runs for c in t["commit_s"])
            if any(t["commit_s"] for _, t, _ in runs) else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if not HEAT.exists():
        sys.exit(f"coupled_bench: {HEAT} is missing (built when MPI is found: CAIRN_WITH_MPI)")
    configs, repeats = (QUICK, 1) if a.quick else (FULL, a.repeats)
    results = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-coupled-") as tmp:
        for name, nx, ny, steps in configs:
            runs = {"cairn": [], "redis": []}
            for rep in range(repeats):
                for backend in runs:
                    runs[backend].append(one_run(backend, nx, ny, steps, Path(tmp) / f"{name}-{backend}-{rep}"))
            r = {"name": name, "nx": nx, "ny": ny, "steps": steps, "every": EVERY, "pace_ms": PACE_MS, "ranks": 2,
                 "repeats": repeats, "slab_bytes": runs["cairn"][0][0]["slab_bytes"],
                 "backends": {b: summarize(v) for b, v in runs.items()}}
            results.append(r)
            for b, s in r["backends"].items():
                load = ("%.3f ms" % (s["surrogate_load_s_median"] * 1e3) if s["surrogate_load_s_median"] is not None
                        else "none loaded")
                print("%s %s: publish %.3f ms median, %.3f ms p90; %.0f MB/s; surrogate load %s; wall %.1f s" %
                      (name, b, s["publish_s_median"] * 1e3, s["publish_s_p90"] * 1e3, s["bandwidth_MBps_median"],
                       load, s["wall_s_median"]), flush=True)
    Path(a.json).write_text(json.dumps({"configs": results, "cores": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
