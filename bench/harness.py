"""The evidence harness behind bench/run.

Runs each benchmark of bench/ (each measures cairn and its baselines in the same run, on the same
data, and takes medians over repeats), turns their JSON into one list of ratios (cairn / baseline),
prints the table, writes the results file, draws one plot per group with matplotlib, and renders
docs/benchmarks.md from the results. No figure in the generated document is typed by hand: every
number comes from the results file of the run that wrote it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
BIN = BUILD / "bin"
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


# ---- the machine ----------------------------------------------------------------------------

def machine() -> Dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    # findmnt names ext4 as ext4 (statfs's magic number cannot tell ext2/3/4 apart).
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", tempfile.gettempdir()], capture_output=True,
                        text=True).stdout.strip() or \
        subprocess.run(["stat", "-f", "-c", "%T", tempfile.gettempdir()], capture_output=True, text=True).stdout.strip()
    gpu = "none"
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        gpu = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "none"
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "kernel": platform.release(), "os": _os_name(), "tmp_filesystem": fs, "gpu": gpu,
            "root": os.geteuid() == 0, "shmem_thp": _shmem_thp()}


def _update_runs(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The --update runs merged into results, oldest first; a merge written before updated_runs
    existed named one run through updated_parts."""
    if "updated_runs" in results:
        return list(results["updated_runs"])
    if not results.get("updated_parts"):
        return []
    return [{"started": next(iter(results["updated_parts"].values())), "parts": list(results["updated_parts"]),
             "results": results.get("updated_from"), "base": results.get("base_file")}]


def _shmem_thp() -> str:
    """The kernel's transparent-huge-page mode for shared memory, which backs cairn's DRAM arena
    (docs/tiering.md, "Huge pages for the arena"): the 2 MiB size's own setting unless it inherits."""
    base = Path("/sys/kernel/mm/transparent_hugepage")
    for f in (base / "hugepages-2048kB" / "shmem_enabled", base / "shmem_enabled"):
        try:
            word = f.read_text().split("[", 1)[1].split("]", 1)[0]
        except (OSError, IndexError):
            continue
        if word != "inherit":
            return word
    return "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


# ---- one ratio ------------------------------------------------------------------------------

def ratio(group: str, metric: str, cairn: float, baseline: str, baseline_value: float, unit: str, better: str,
          goal: Optional[str] = None, note: str = "") -> Dict[str, Any]:
    """cairn / baseline, and how much better cairn is (>1: better) whichever way the metric points."""
    r = cairn / baseline_value if baseline_value else float("nan")
    adv = (baseline_value / cairn if cairn else float("inf")) if better == "lower" else r
    met = None
    if goal:
        op, val = goal.split()
        val = float(val)
        met = {"<=": r <= val, ">=": r >= val, "<": r < val, ">": r > val, "==": r == val}[op]
    return {"group": group, "metric": metric, "cairn": cairn, "baseline": baseline, "baseline_value": baseline_value,
            "unit": unit, "better": better, "ratio": r, "advantage": adv, "goal": goal, "met": met, "note": note}


# ---- the components: how to run each, and how to read its JSON --------------------------------

class Skipped(Exception):
    """A part that cannot run on this machine (an optional dependency is missing): reported, not a failure."""


def run_tiers(quick: bool, work: Path) -> List[Dict[str, Any]]:
    out = work / "tiers.json"
    _run([str(BIN / "cairn_bench_tiers"), *(["--quick"] if quick else []), "--json", str(out)], work / "tiers.log")
    d = json.loads(out.read_text())
    rows = []
    c = d.get("commit")
    if c:
        mib = c['bytes'] >> 20
        if "commit_own_buffer_s" in c:
            rows.append(ratio("tiers", f"commit {mib} MiB at memory from the caller's buffers (add_tensor): blocking time",
                              c["commit_own_buffer_s"], "memcpy", c["memcpy_s"], "s", "lower", "<= 1.2"))
            rows.append(ratio("tiers", "the same, first commit on a new connection: blocking time",
                              c["first_commit_own_buffer_s"], "memcpy", c["memcpy_s"], "s", "lower", "<= 1.2",
                              f"median of {c['first_commit_own_buffer_connections']} connections, each one commit"
                              if "first_commit_own_buffer_connections" in c else ""))
        if "commit_sealed_s" in c:
            rows.append(ratio("tiers", f"commit {mib} MiB at memory: blocking time", c["commit_sealed_s"],
                              "memcpy", c["memcpy_s"], "s", "lower", "<= 1.2",
                              "written into arena space (add_tensor_space) by the caller's memcpy, tensor by tensor, "
                              "each sealed once written (seal_tensor: hashed while the next is written)"))
            if "memcpy_per_tensor_s" in c:
                rows.append(ratio("tiers", f"commit {mib} MiB at memory: blocking time", c["commit_sealed_s"],
                                  "memcpy, one call per tensor", c["memcpy_per_tensor_s"], "s", "lower", None,
                                  "the same sealed arena-space commit, against the caller's own copies done "
                                  "the same way into a private buffer (glibc copies one 1 GiB call faster than "
                                  "8 calls of 128 MiB)"))
        rows.append(ratio("tiers", f"commit {c['bytes'] >> 20} MiB at memory: blocking time", c["commit_memory_s"],
                          "memcpy", c["memcpy_s"], "s", "lower", None if "commit_sealed_s" in c else "<= 1.2",
                          "written into arena space (add_tensor_space) by the caller's memcpy, tensor by tensor, never "
                          "sealed: the daemon hashes the bytes at commit, one more pass over them"))
        rows.append(ratio("tiers", f"commit {c['bytes'] >> 20} MiB at memory: blocking time", c["commit_memory_s"],
                          "write+fsync", c["write_fsync_s"], "s", "lower"))
    n = d.get("nvme")
    if n:
        base = n.get("odirect_read_GBps")
        for key, label in (("read_GBps", "read into a buffer"), ("map_GBps", "zero-copy map")):
            if key in n and base:
                rows.append(ratio("tiers", f"reads from the NVMe tier: {label}", n[key], "O_DIRECT read", base, "GB/s",
                                  "higher", ">= 0.9"))
    m = d.get("dram")
    if m:
        for key, label in (("read_GBps", "DRAM hit, read into a buffer"), ("map_copy_GBps", "DRAM hit, map + copy out")):
            if key in m and m.get("memcpy_GBps"):
                rows.append(ratio("tiers", label, m[key], "memcpy", m["memcpy_GBps"], "GB/s", "higher", ">= 0.9"))
        if "map_copy_GBps" in m and m.get("memcpy_per_tensor_GBps"):
            rows.append(ratio("tiers", "DRAM hit, map + copy out (against the same copies from a private buffer: "
                              "glibc copies one call of the whole size faster than one call per tensor)",
                              m["map_copy_GBps"], "memcpy, one call per tensor", m["memcpy_per_tensor_GBps"], "GB/s",
                              "higher"))
    return rows


def run_read(quick: bool, work: Path) -> List[Dict[str, Any]]:
    log = work / "read.log"
    args = [str(BIN / "cairn_bench_read"), "--mib", "64" if quick else "256", "--repeats", "2" if quick else "5", "--json"]
    out = _run(args, log, capture=True)
    d = json.loads(out)
    mib = d["bytes"] >> 20
    note = f"page cache dropped with {d.get('cache_drop')}"
    return [ratio("reads", f"{mib} MiB DRAM hit into a buffer", d["dram_read_GBps"], "memcpy", d["memcpy_GBps"], "GB/s", "higher"),
            ratio("reads", f"{mib} MiB cold from the repository", d["cold_read_GBps"], "plain read", d["plain_pack_read_GBps"],
                  "GB/s", "higher", ">= 0.9", f"{note}; packs read with direct I/O"),
            ratio("reads", f"{mib} MiB cold from the repository", d["cold_read_GBps"], "the same through the page cache",
                  d["cold_read_buffered_GBps"], "GB/s", "higher", None, "repository_direct_reads: true vs false")]


def run_catalog(quick: bool, work: Path) -> List[Dict[str, Any]]:
    out = work / "catalog.json"
    _run([str(BIN / "cairn_bench_catalog"), *(["--quick"] if quick else []), "--json", str(out)], work / "catalog.log",
         timeout=2400)
    d = json.loads(out.read_text())
    rows = []
    for s in d["sizes"]:
        n = s["models"]
        rows.append(ratio("catalog", f"best_ancestor at {n:,} models (median)", s["index"]["median_us"], "linear scan",
                          s["scan"]["median_us"], "us", "lower"))
        if "redis" in s and isinstance(s["redis"], dict) and "median_us" in s["redis"]:
            rows.append(ratio("catalog", f"best_ancestor at {n:,} models (median)", s["index"]["median_us"],
                              "Redis (EvoStore)", s["redis"]["median_us"], "us", "lower"))
    return rows


def run_metadata(quick: bool, work: Path) -> List[Dict[str, Any]]:
    out = work / "metadata.json"
    _run([str(BIN / "cairn_bench_metadata"), *(["--quick"] if quick else []), "--json", str(out)], work / "metadata.log")
    d = json.loads(out.read_text())
    return [ratio("metadata", "metadata-only commits per second (memory, blocking)", d["commits_per_s_memory"],
                  "bare request round trip", d["round_trips_per_s"], "1/s", "higher"),
            ratio("metadata", "metadata-only commits per second from C, blocking (memory)", d["commits_per_s_memory_c"],
                  "bare request round trip", d["round_trips_per_s"], "1/s", "higher",
                  note="cairn_model_commit with no ticket; issue goal: >= 20,000/s from one client"),
            ratio("metadata", "metadata-only commits per second (memory, pipelined)",
                  d["commits_per_s_memory_pipelined"], "bare request round trip", d["round_trips_per_s"], "1/s",
                  "higher", note="issue goal: >= 20,000/s from one client"),
            ratio("metadata", "metadata-only commits per second (global, blocking)", d["commits_per_s_global"],
                  "write+fsync of one file", d["file_fsync_per_s"], "1/s", "higher",
                  note="issue goal: >= 5,000/s; each commit waits for its own fsync"),
            ratio("metadata", "metadata-only commits per second (global, pipelined)",
                  d["commits_per_s_global_pipelined"], "write+fsync of one file", d["file_fsync_per_s"], "1/s",
                  "higher", note="issue goal: >= 5,000/s; one fsync per batch of commits"),
            ratio("metadata", "opening a model (client cache)", d["open_cached_us"], "first open", d["open_first_us"],
                  "us", "lower")] + run_metadata_python(quick, work, d)


def run_metadata_python(quick: bool, work: Path, cpp: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The issue's commit-rate goals, on the path a new Python user takes (save_model with its
    defaults) and on the C++ client's pipelined path; and the blocking global path beside them."""
    out = work / "metadata_python.json"
    _run([PY, str(ROOT / "bench/workloads/metadata_python.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "metadata_python.log")
    p = json.loads(out.read_text())
    return [ratio("metadata", "metadata-only commits per second from Python, save_model defaults (global, not waited)",
                  p["global_default_per_s"], "the issue's goal", 5000, "1/s", "higher", ">= 1"),
            ratio("metadata", "metadata-only commits per second from Python at memory", p["memory_pipelined_per_s"],
                  "the issue's goal", 20000, "1/s", "higher", ">= 1"),
            ratio("metadata", "metadata-only commits per second from C++, pipelined, at global",
                  cpp["commits_per_s_global_pipelined"], "the issue's goal", 5000, "1/s", "higher", ">= 1"),
            ratio("metadata", "metadata-only commits per second from C++, pipelined, at memory",
                  cpp["commits_per_s_memory_pipelined"], "the issue's goal", 20000, "1/s", "higher", ">= 1"),
            ratio("metadata", "metadata-only commits per second from C, blocking, at memory",
                  cpp["commits_per_s_memory_c"], "the issue's goal", 20000, "1/s", "higher", ">= 1"),
            ratio("metadata", "metadata-only commits per second from Python at global, wait=True (one fsync each)",
                  p["global_blocking_per_s"], "write+fsync of one file, from Python", p["file_fsync_per_s"], "1/s",
                  "higher")]


def run_restart(quick: bool, work: Path) -> List[Dict[str, Any]]:
    out = work / "restart.json"
    _run([PY, str(ROOT / "bench/workloads/restart_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "restart.log", timeout=3600)
    d = json.loads(out.read_text())
    n = d["models"]
    return [ratio("repository", f"daemon restart at {n:,} models: first request answered", d["restart_first_answer_s"],
                  "the issue's goal", 2.0, "s", "lower", "< 1"),
            ratio("repository", f"daemon restart at {n:,} models: every model listed", d["restart_listed_all_s"],
                  "the issue's goal", 2.0, "s", "lower", "< 1"),
            ratio("repository", f"files under the repository after {n:,} models through a daemon", d["files"],
                  "one file per model (format 1)", n, "files", "lower", "<= 0.01")]


def run_repository(quick: bool, work: Path) -> List[Dict[str, Any]]:
    out = work / "repository.json"
    _run([str(BIN / "cairn_bench_repository"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "repository.log", timeout=3600)
    d = json.loads(out.read_text())
    base = d["file_per_model_commits_per_s"]
    fsnote = f"on {d['fs_type']}, {d['chunks_per_model']} chunk references per manifest"
    rows = [ratio("repository", f"metadata-only commits per second, batches of {r['batch']}", r["commits_per_s"],
                  "one manifest file per model (format 1)", base, "1/s", "higher", note=fsnote)
            for r in d["commit_rates"]]
    s = d["scale"]
    n = s["models"]
    capped = " (capped by memory)" if s["capped_by_memory"] else ""
    # Format 1 kept one manifest file per model (metadata-only models wrote no pack); the goal is
    # < 1,000 files at 100,000 models, i.e. a hundredth of that.
    rows.append(ratio("repository", f"files under the repository at {n:,} models{capped}", s["files_after_compact"],
                      "one file per model (format 1)", n + 1, "files", "lower", "<= 0.01",
                      note=f"{s['files_before_compact']} before compact()"))
    rows.append(ratio("repository", f"reopen at {n:,} models after compact(){capped}", s["open_s_after_compact"],
                      "reopen before compact()", s["open_s_before_compact"], "s", "lower",
                      note="goal: < 2 s"))
    rows.append(ratio("repository", f"reopen at {n:,} models before compact(){capped}", s["open_s_before_compact"],
                      "the 2 s goal", 2.0, "s", "lower", "< 1"))
    rows.append(ratio("repository", "catalog memory per model (VmRSS growth)", s["rss_bytes_per_model"],
                      "the goal: 2 GiB per 1,000,000 models", (2 << 30) / 1e6, "bytes", "lower", "< 1",
                      note=f"{s['projected_rss_bytes_1m_models'] / (1 << 30):.1f} GiB projected for 1,000,000 models"))
    return rows


def run_torch(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """Loads into PyTorch (bench/workloads/torch_load.py): state dicts and modules, warm and cold,
    against safetensors, torch.load, Run:ai Model Streamer, Tensorizer and the kernel's page mapping
    alone, under the machine's shared-memory huge-page setting and (as root) the other one."""
    out = work / "torch.json"
    _run([PY, str(ROOT / "bench/workloads/torch_load.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "torch.log", env=_cairn_env())
    d = json.loads(out.read_text())
    # torch_load's rows are times in seconds with the goal on cairn / baseline.
    return [ratio("torch loads", r["name"], r["value"], r["baseline"], r["baseline_value"], r["unit"], "lower",
                  r.get("goal"), r.get("note", "")) for r in d["rows"]]


def run_micro(quick: bool, work: Path) -> List[Dict[str, Any]]:
    exe = BIN / "cairn_bench_micro"
    if not exe.exists():
        raise Skipped(f"{exe.name} is not built (CMake builds it when Google Benchmark, libbenchmark-dev, is found)")
    raw, out = work / "micro-raw.json", work / "micro.json"
    _run([str(exe), "--benchmark_format=console", "--benchmark_out_format=json", f"--benchmark_out={raw}",
          *(["--benchmark_min_time=0.01"] if quick else [])], work / "micro.log", timeout=900)
    _run([PY, str(ROOT / "bench/micro/ratios.py"), str(raw), str(out)], work / "micro-ratios.log")
    d = json.loads(out.read_text())
    notes = {"dram_map": "map + release: time until the tensor is usable, no byte touched",
             "wire_codec": "encode + decode in memory", "wire_roundtrip": "request and answer over a Unix socket pair"}
    return [ratio("micro", r["metric"], r["cairn"], r["baseline"], r["baseline_value"],
                  next((x["unit"] for x in d.get("rows", []) if x["metric"] == r["metric"]), ""),
                  next((x["better"] for x in d.get("rows", []) if x["metric"] == r["metric"]), "higher"),
                  note=next((v for k, v in notes.items() if r["metric"].startswith(k)), ""))
            for r in d["ratios"]]


def run_workloads(quick: bool, work: Path) -> List[Dict[str, Any]]:
    outdir = work / "workloads"
    outdir.mkdir(exist_ok=True)
    _run([PY, str(ROOT / "bench/workloads/workloads.py"), *(["--quick"] if quick else []), "--out", str(outdir)],
         work / "workloads.log", env=_cairn_env(), timeout=3000)
    d = json.loads((outdir / "workloads.json").read_text())
    rows = []
    for r in d["ratios"]:
        better = next((x["better"] for x in d.get("rows", []) if x["workload"] == r["workload"] and x["metric"] == r["metric"]),
                      "lower")
        unit = next((x["unit"] for x in d.get("rows", []) if x["workload"] == r["workload"] and x["metric"] == r["metric"]), "")
        goal = r.get("goal")
        if goal and (not any(goal.startswith(op + " ") for op in ("<=", ">=", "<", ">")) or "[cairn copy]" in r["metric"]):
            goal = None  # the goals are the zero-copy path's; the copy rows are for information
        if not unit and (" s:" in r["metric"] or r["metric"].endswith(" s") or " s " in r["metric"]):
            unit = "s"
        rows.append(ratio(f"workload: {r['workload']}", r["metric"], r["cairn"], r["baseline"], r["baseline_value"], unit,
                          better, goal, r.get("note", "")))
    for r in d.get("rows", []):
        if r.get("error"):
            rows.append({"group": f"workload: {r.get('workload')}", "metric": r.get("metric", "error"), "error": r["error"]})
    return rows


def run_policy(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """cairn-sim on the committed traces (hit ratios beside Belady's) and, with real daemons, a NAS
    candidate's wait for its parent with and without the driver's hints."""
    rows = []
    sim = BIN / "cairn-sim"
    traces = [("", t) for t in sorted((ROOT / "bench" / "traces").glob("*.csv"))]
    # The traces recorded from the real workload drivers (bench/traces/recorded/README.md); the
    # earlier recordings (*-v1.csv) stay beside them for reference and are not measured.
    traces += [("recorded ", t) for t in sorted((ROOT / "bench" / "traces" / "recorded").glob("*.csv"))
               if not t.stem.endswith("-v1")]
    for kind, trace in traces:
        name = f"{kind}{trace.stem}"
        out = work / f"sim-{name.replace(' ', '-')}.json"
        _run([str(sim), str(trace), "--sizes", "0.125,0.25,0.5", "--json", str(out)], work / f"sim-{name.replace(' ', '-')}.log")
        d = json.loads(out.read_text())
        by = {}  # (policy, fraction) -> byte hit ratio
        for r in d["results"]:
            by[(r["policy"], r["fraction"])] = r["byte_hit_ratio"]
        for r in d["results"]:
            if r["policy"] == "belady":
                continue
            f = r["fraction"]
            goal = None
            if r["policy"] == "hints":
                if not kind and trace.stem.startswith("nas") and abs(f - 0.25) < 1e-9:
                    goal = ">= 0.95"
                elif kind and trace.stem in ("ensemble", "checkpoint"):
                    goal = ">= 0.9"
            rows.append(ratio("policy", f"{name} trace, cache {f:g} of the working set: byte hit ratio, {r['policy']}",
                              r["byte_hit_ratio"], "Belady (offline optimum)", by.get(("belady", f), float("nan")), "",
                              "higher", goal))
        if not kind:
            continue
        # The online baselines the hint-aware policy must match on every recorded trace and size, and
        # (NAS) the win-probability bound it is measured against.
        for f in sorted({r["fraction"] for r in d["results"]}):
            hints = by.get(("hints", f))
            online = {p: by[(p, f)] for p in ("lru", "arc", "s3fifo", "lineage") if (p, f) in by}
            if hints is None or not online:
                continue
            best = max(online, key=online.get)
            rows.append(ratio("policy", f"{name} trace, cache {f:g} of the working set: byte hit ratio, hints vs "
                              "the best online baseline", hints, f"{best} (best of {', '.join(online)})",
                              online[best], "", "higher", ">= 1" if online[best] > 0 else None,
                              note="" if online[best] > 0 else "every online baseline got no hit"))
            if trace.stem == "nas" and ("bound", f) in by:
                rows.append(ratio("policy", f"{name} trace, cache {f:g} of the working set: byte hit ratio, hints vs "
                                  "the win-probability bound", hints, "bound (win-probability replay)",
                                  by[("bound", f)], "", "higher", ">= 0.95" if abs(f - 0.25) < 1e-9 else None))
        # NAS: what the population's scores give, against the recording made before the driver sent
        # them (nas-v1.csv, replayed by the same policy).
        v1 = trace.with_name(f"{trace.stem}-v1.csv")
        if trace.stem == "nas" and v1.exists():
            out_v1 = work / "sim-recorded-nas-v1.json"
            _run([str(sim), str(v1), "--sizes", "0.125,0.25,0.5", "--policies", "hints", "--json", str(out_v1)],
                 work / "sim-recorded-nas-v1.log")
            for r in json.loads(out_v1.read_text())["results"]:
                f = r["fraction"]
                rows.append(ratio("policy", f"{name} trace, cache {f:g} of the working set: byte hit ratio, hints vs "
                                  "hints on the recording without scores (nas-v1)", by.get(("hints", f), float("nan")),
                                  "hints on nas-v1", r["byte_hit_ratio"], "", "higher",
                                  ">= 1.5" if abs(f - 0.25) < 1e-9 else None))
    out = work / "prefetch.json"
    _run([PY, str(ROOT / "bench/workloads/prefetch_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "prefetch.log", env=_cairn_env(), timeout=1200)
    d = json.loads(out.read_text())
    p = d["hints"]["prefetch"]
    rows.append(ratio("policy", f"NAS task's wait for its parent ({d['candidates'] - 1} tasks, median; "
                      f"{d['new_bytes_per_candidate'] >> 20} MiB new per candidate, cold repository)",
                      d["hints"]["median_wait_s"], "the same without hints", d["no_hints"]["median_wait_s"], "s", "lower",
                      note=f"prefetched chunks used {p.get('chunks_used')}, wasted {p.get('chunks_wasted')}"))
    return rows


def run_peers(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """Real daemons as one peer group over libfabric (bench/workloads/peers_bench.py): the stream
    between two daemons vs fi_pingpong, an ensemble's repository reads and load times with and
    without peers, and the simulation at 1,024 nodes fed with those measurements."""
    if not shutil.which("fi_info"):
        raise Skipped("libfabric is not installed (fi_info not found; Debian: libfabric1 and libfabric-bin, "
                      "scripts/deps installs them)")
    probe = subprocess.run(["fi_info", "-p", "tcp;ofi_rxm", "-t", "FI_EP_RDM"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise Skipped("libfabric has no tcp;ofi_rxm provider with RDM endpoints (fi_info -p 'tcp;ofi_rxm' -t "
                      "FI_EP_RDM failed)")
    out = work / "peers.json"
    _run([PY, str(ROOT / "bench/workloads/peers_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "peers.log", env=_cairn_env(), timeout=1800)
    d = json.loads(out.read_text())
    # Keep the simulation's plot: the work directory is removed at the end of the run.
    sim_png = Path(d["simulation"].get("plot") or "")
    if sim_png.is_file():
        dest = ROOT / ("bench/results/quick" if quick else "docs/img/benchmarks") / "peers-simulation.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sim_png, dest)
    rows = []
    s = d["stream"]
    b = s["baseline"]
    chunk_mib = d["chunk_bytes"] >> 20
    rows.append(ratio("peers", f"a {s['bytes'] >> 20} MiB model streamed from a peer daemon's DRAM "
                      f"({d['provider']}, {chunk_mib} MiB chunks, median of {s['repeats']})", s["GBps"],
                      f"{b['tool']}, {b['message_bytes'] >> 20} MiB messages", b["GBps"], "GB/s", "higher", ">= 0.8",
                      note="loopback on one machine; " + ("fi_pingpong has one message in flight"
                                                          if b["tool"] == "fi_pingpong" else b["tool"])))
    if "load_model_GBps" in s:
        rows.append(ratio("peers", f"the first load_model() of a {s['bytes'] >> 20} MiB model a peer daemon holds "
                          f"({d['provider']}, zero-copy map, new connection)", s["load_model_GBps"],
                          f"{b['tool']}, {b['message_bytes'] >> 20} MiB messages", b["GBps"], "GB/s", "higher", ">= 0.8",
                          note="a new user's first path; the row above is B's prefetch on the warm connection"))
    if "tcp_stream" in s and not b["tool"].startswith("Python TCP"):
        t = s["tcp_stream"]
        rows.append(ratio("peers", f"a {s['bytes'] >> 20} MiB model streamed from a peer daemon's DRAM",
                          s["GBps"], "a TCP stream between two processes (loopback)", t["GBps"], "GB/s", "higher"))
    sh = d.get("stream_shm") or {}
    if "GBps" in sh:
        m = sh["baseline"]
        rows.append(ratio("peers", f"a {sh['bytes'] >> 20} MiB model streamed from a peer daemon's DRAM (shm, "
                          f"median of {sh['repeats']})", sh["GBps"], m["tool"], m["GBps"], "GB/s", "higher",
                          note="two daemons on one host over libfabric's shm provider"))
        rows.append(ratio("peers", f"the first load_model() of a {sh['bytes'] >> 20} MiB model a peer daemon holds "
                          "(shm, zero-copy map, new connection)", sh["load_model_GBps"], m["tool"], m["GBps"], "GB/s",
                          "higher"))
    pa = d.get("prefetch_all")
    if pa and pa["rows"]:
        two = pa["rows"][0]
        for r in pa["rows"][1:]:
            rows.append(ratio("peers", f"prefetch --all of a {pa['bytes'] >> 20} MiB model to {r['members']} members "
                              "(until all hold it)", r["seconds"], f"the same to {two['members']} members (one transfer)",
                              two["seconds"], "s", "lower",
                              note=f"{r['uploaders']} members uploaded; one machine: all members share its cores"))
    na = d.get("nas")
    if na:
        for key, what in (("handoff_s", "parent handoff (commit + visible + load)"), ("load_s", "parent load")):
            x = na[f"median_{key}"]
            rows.append(ratio("peers", f"NAS over 4 members ({na['model_bytes'] >> 20} MiB models, "
                              f"{na['generations']} generations): {what}, median", x["peers"],
                              "4 daemons without peers (parents committed global, read from the repository)",
                              x["no_peers"], "s", "lower",
                              note="repository pages dropped before each load; the repository is a local disk"))
    e = d["ensemble"]
    mb = e["model_bytes"]
    size = f"{mb / 1e6:.0f} MB model"
    alone = e["alone"]["median_s"]
    for t in e["trials"]:
        n = t["n"]
        p, np_ = t["peers"], t["no_peers"]
        rows.append(ratio("peers", f"ensemble of {n} ({size}): bytes the job read from the repository",
                          p["repository_bytes"], "the model once (1 copy per job)", mb, "bytes", "lower", "<= 1.0",
                          note=f"page cache dropped first: {p['page_cache']}"))
        rows.append(ratio("peers", f"ensemble of {n} ({size}): bytes the job read from the repository",
                          p["repository_bytes"], f"{n} daemons without peers", np_["repository_bytes"], "bytes",
                          "lower"))
        rows.append(ratio("peers", f"ensemble of {n} ({size}), all load at once: slowest member", p["slowest_s"],
                          "one member loading alone (no peers)", alone, "s", "lower", "<= 2.0",
                          note=f"page cache dropped first: {p['page_cache']}"))
        rows.append(ratio("peers", f"ensemble of {n} ({size}), all load at once: slowest member", p["slowest_s"],
                          f"{n} daemons without peers", np_["slowest_s"], "s", "lower",
                          note="one machine: without peers the page cache serves all but the first reader"))
    sim = d["simulation"]
    pr = sim["params"]
    for rule in ("eager", "late"):
        x = sim["dispatch"][rule]["at_1024"]
        if not x:
            continue
        what = ("every waiter answered as soon as a holder exists" if rule == "eager"
                else "waiters queued until a holder has a free upload slot")
        rows.append(ratio("peers", f"1,024 nodes load BERT-base: time until all hold it, directory rule {rule}",
                          x["cairn_s"], "every node reads the PFS", x["baseline_s"], "s", "lower",
                          note=f"simulated, directory rule {rule} ({what}); link {pr['link_Bps'] / 1e9:.2f} GB/s and PFS "
                               f"{pr['pfs_per_client_Bps'] / 1e9:.2f} GB/s per client measured, "
                               f"{pr['pfs_aggregate_Bps'] / 1e9:g} GB/s aggregate assumed"))
    return rows


def _need(program: str = "", module: str = "", debian: str = "") -> None:
    """Raises Skipped unless `program` is on PATH and Python `module` imports in PY."""
    if program and not shutil.which(program):
        raise Skipped(f"{program} is not installed (Debian: {debian}, scripts/deps installs it)")
    if module and subprocess.run([PY, "-c", f"import {module}"], capture_output=True).returncode != 0:
        raise Skipped(f"Python's {module} is not installed (Debian: {debian}, scripts/deps installs it)")


def run_mpi(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """Data-parallel checkpoints of a GPT-2-small-sized state dict over 1, 2 and 4 MPI ranks
    (bench/workloads/mpi_bench.py): cairn.torch.save_sharded vs torch.save from rank 0, and
    load_sharded vs torch.load on every rank."""
    _need("mpirun", debian="openmpi-bin")
    _need(module="mpi4py", debian="python3-mpi4py")
    out = work / "mpi.json"
    _run([PY, str(ROOT / "bench/workloads/mpi_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "mpi.log", env=_cairn_env(), timeout=3600)
    d = json.loads(out.read_text())
    rows = []
    for r in d["runs"]:
        n = r["ranks"]
        size = f"{r['params'] / 1e6:.0f} M parameters, {r['bytes'] / 1e6:.0f} MB"
        ranks = f"{n} rank{'s' if n > 1 else ''}"
        for which, when in (("first", "first checkpoint on a new connection"), ("median", "later checkpoints, median")):
            rows.append(ratio("mpi", f"checkpoint of a GPT-2-small-sized state ({size}) from {ranks}, {when}: "
                              "time the ranks are blocked", r["cairn_block_s_" + which], "torch.save from rank 0, "
                              "others at a barrier", r["torch_save_block_s_" + which], "s", "lower", "<= 0.1",
                              note=f"cairn.torch.save_sharded (pipelined parts); durability local reached after "
                                   f"{r['cairn_local_s_' + which] * 1e3:.0f} ms (behind the training); {d['cores']} "
                                   "cores, ranks oversubscribed"))
        if "cairn_background_block_s_median" in r:
            rows.append(ratio("mpi", f"checkpoint of a GPT-2-small-sized state ({size}) from {ranks}, taken in the "
                              "background during a training step, median: time the ranks are blocked",
                              r["cairn_background_block_s_median"], "torch.save from rank 0, others at a barrier",
                              r["torch_save_block_s_median"], "s", "lower", "<= 0.1",
                              note=f"cairn.torch.save_sharded(background=True), then a step of "
                                   f"{r['step_alone_s_median'] * 1e3:.0f} ms standing in for the next forward and "
                                   "backward pass (single-threaded matrix products: an accelerator's host thread), "
                                   "then wait_copied(); blocked = that minus the step alone; the copy took "
                                   f"{r['background_copy_s_median'] * 1e3:.0f} ms behind it; {d['cores']} cores, "
                                   "ranks oversubscribed"))
        for which, when in (("first", "first restore on a new connection"), ("median", "later restores, median")):
            rows.append(ratio("mpi", f"restart of the same state on {ranks}, {when}", r["cairn_restore_s_" + which],
                              "torch.load of the file on every rank", r["torch_load_s_" + which], "s", "lower", "<= 1",
                              note="cairn.torch.load_sharded: the ranks of a node read straight from its daemon; "
                                   "the file is in the page cache"))
    return rows


def run_dcp(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """torch.distributed.checkpoint on cairn (cairn.dcp) against DCP's own FileSystemWriter/Reader on
    the same filesystem, 1 and 2 gloo ranks (bench/workloads/dcp_bench.py): save and async_save
    blocking time, the bytes of a fine-tuning checkpoint series, warm and cold loads."""
    _need(module="torch.distributed.checkpoint", debian="none; PyPI torch in .venv")
    out = work / "dcp.json"
    _run([PY, str(ROOT / "bench/workloads/dcp_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "dcp.log", env=_cairn_env(), timeout=3600)
    d = json.loads(out.read_text())
    # dcp_bench's rows are cairn / baseline, lower is better (times and bytes), goals on that ratio.
    return [ratio("dcp", r["name"], r["value"], r["baseline"], r["baseline_value"], r["unit"], "lower", r["goal"])
            for r in d["rows"]]


def run_frameworks(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """The framework doors beside each framework's default in the same run
    (bench/workloads/frameworks_bench.py): DeepSpeed's save_checkpoint with CairnCheckpointEngine vs
    its torch.save engine, a Lightning fit with CairnCheckpointIO vs TorchCheckpointIO (bytes and time),
    transformers' from_pretrained from cairn vs a safetensors directory, and a search transferring from
    the best ancestor vs one file per model (time to first batch, bytes)."""
    # Found, not imported: importing DeepSpeed and Lightning takes tens of seconds on 2 cores.
    modules = ("deepspeed", "lightning", "transformers", "safetensors")
    probe = subprocess.run([PY, "-c", "import importlib.util as u, sys; "
                            f"print(' '.join(m for m in {modules!r} if u.find_spec(m) is None))"],
                           capture_output=True, text=True)
    missing = probe.stdout.split() if probe.returncode == 0 else list(modules)
    if missing:
        raise Skipped(f"Python's {', '.join(missing)} not installed (PyPI, in .venv: requirements.txt pins them)")
    out = work / "frameworks.json"
    _run([PY, str(ROOT / "bench/workloads/frameworks_bench.py"), *(["--quick"] if quick else []), "--json", str(out)],
         work / "frameworks.log", env=_cairn_env(), timeout=3600)
    d = json.loads(out.read_text())
    # frameworks_bench's rows are cairn / baseline, lower is better (times and bytes), goals on that ratio.
    return [ratio("frameworks", r["name"], r["value"], r["baseline"], r["baseline_value"], r["unit"], "lower",
                  r.get("goal"), r.get("note", "")) for r in d["rows"]]


def run_compression(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """Lossless chunk coding in the repository (bench/workloads/compression_bench.py): byte planes on
    trained ResNet-50 and ViT-B/16 weights (F32, BF16) against the raw bytes and zstd alone, one
    core's decode throughput, fine-tuning and training checkpoint series against torch.save files
    and an uncoded repository, cold reads against a plain read, the flusher with and without coding."""
    _need(module="torchvision", debian="none; PyPI torchvision in .venv")
    if not (BIN / "cairn_bench_coding").exists():
        raise Skipped(f"{BIN / 'cairn_bench_coding'} is missing (scripts/build builds it)")
    out = work / "compression.json"
    _run([PY, str(ROOT / "bench/workloads/compression_bench.py"), *(["--quick"] if quick else []),
          "--json", str(out)], work / "compression.log", env=_cairn_env(), timeout=3600)
    d = json.loads(out.read_text())
    # compression_bench's rows say which way is better: bytes and seconds lower, throughputs and
    # raw / coded ratios higher; each goal is on value / baseline_value.
    return [ratio("compression", r["name"], r["value"], r["baseline"], r["baseline_value"], r["unit"],
                  r.get("better", "lower"), r.get("goal"), r.get("note", "")) for r in d["rows"]]


def run_coupled(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """The coupled example (docs/coupled.md) over cairn and over Redis on 2 MPI ranks, same
    arguments (bench/workloads/coupled_bench.py): publish time per rank and publication, field
    bandwidth, surrogate load time and the run's wall time."""
    _need("mpirun", debian="openmpi-bin")
    if not (BIN / "coupled_heat").exists():
        raise Skipped(f"{BIN / 'coupled_heat'} is missing (built when MPI is found)")
    _need("redis-server", debian="redis-server")
    _need(module="redis", debian="python3-redis")
    out = work / "coupled.json"
    _run([PY, str(ROOT / "bench/workloads/coupled_bench.py"), *(["--quick"] if quick else ["--repeats", "5"]),
          "--json", str(out)], work / "coupled.log", env=_cairn_env(), timeout=3600)
    d = json.loads(out.read_text())
    rows = []
    for c in d["configs"]:
        cb, rb = c["backends"]["cairn"], c["backends"]["redis"]
        slab = fmt(c["slab_bytes"], "bytes")
        what = f"coupled example, {c['nx']} x {c['ny']} field ({slab} per rank)"
        base = "Redis (hiredis HSET, SmartRedis-style)"
        runs = f"{c['repeats']} run{'s' if c['repeats'] > 1 else ''}"
        note = (f"2 ranks, {c['steps']} steps, a publication every {c['every']}, {runs} per backend; "
                f"{d['cores']} cores shared with the trainer and the server")
        rows.append(ratio("coupled", f"{what}: time a rank spends publishing, median", cb["publish_s_median"] * 1e6,
                          base, rb["publish_s_median"] * 1e6, "us", "lower",
                          note=f"{cb['publications']} publications; {note}"))
        rows.append(ratio("coupled", f"{what}: time a rank spends publishing, p90", cb["publish_s_p90"] * 1e6, base,
                          rb["publish_s_p90"] * 1e6, "us", "lower"))
        rows.append(ratio("coupled", f"{what}: field bandwidth, put and read", cb["bandwidth_MBps_median"],
                          "Redis (HSET / HMGET)", rb["bandwidth_MBps_median"], "MB/s", "higher",
                          note="bytes the simulation put and the trainer read / time in those calls; median of runs"))
        if cb["surrogate_load_s_median"] is None or rb["surrogate_load_s_median"] is None:
            # The simulation loads a surrogate only once the trainer has committed one: a short run on
            # busy cores can end before that. The other rows stand; this one has nothing to compare.
            print(f"   coupled {what}: no surrogate row: loads over cairn {cb['loads']}, over Redis {rb['loads']} "
                  "(the simulation ended before the trainer committed a surrogate)")
        else:
            rows.append(ratio("coupled", f"{what}: loading the newest surrogate, median",
                              cb["surrogate_load_s_median"] * 1e6, "Redis (its tensors as keys)",
                              rb["surrogate_load_s_median"] * 1e6, "us", "lower",
                              note=f"{cb['loads']} loads; cairn: poll, unpack the version, model open and read; "
                                   "Redis: poll, the version key and the two tensors' keys"))
        rows.append(ratio("coupled", f"{what}: wall time of the run, median", cb["wall_s_median"], "Redis",
                          rb["wall_s_median"], "s", "lower", note="trainer start (imports torch) to both ends"))
    return rows


def run_near(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """Near-data feature extraction over a shaped veth link between two network namespaces
    (bench/workloads/near_bench.py): bytes and epoch time against vanilla, the chosen split against
    every split, and a NAS run sharing cached activations."""
    if os.geteuid() != 0:
        raise Skipped("needs root (network namespaces and tc)")
    _need("tc", debian="iproute2")
    out, log = work / "near.json", work / "near.log"
    with open(log, "w") as lf:
        r = subprocess.run([PY, str(ROOT / "bench/workloads/near_bench.py"), *(["--quick"] if quick else []),
                            "--json", str(out)], stdout=lf, stderr=subprocess.STDOUT, env=_cairn_env(),
                           cwd=str(ROOT), timeout=3600)
    if r.returncode == 3:
        raise Skipped(log.read_text().strip().splitlines()[-1])
    if r.returncode != 0:
        raise RuntimeError(f"near_bench.py exited with {r.returncode}:\n" + "\n".join(log.read_text().splitlines()[-15:]))
    sys.path.insert(0, str(ROOT / "bench" / "workloads"))
    from near_bench import harness_rows  # noqa: PLC0415 - the rows live beside the workload
    return harness_rows(json.loads(out.read_text()), ratio, quick)


def run_gpu(quick: bool, work: Path) -> List[Dict[str, Any]]:
    """The GPU tier (bench/workloads/gpu_bench.py, docs/gpu.md): loads into device memory, HBM hits
    and checkpoints from the device against plain CUDA / torch.save. Skipped without a GPU."""
    out = work / "gpu.json"
    log = work / "gpu.log"
    with open(log, "w") as lf:
        r = subprocess.run([PY, str(ROOT / "bench/workloads/gpu_bench.py"), *(["--quick"] if quick else []),
                            "--json", str(out)], stdout=subprocess.PIPE, stderr=lf, text=True, env=_cairn_env(),
                           cwd=str(ROOT), timeout=1800)
    if r.returncode == 3:
        raise Skipped(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "no GPU here")
    if r.returncode != 0:
        raise RuntimeError(f"gpu_bench.py exited with {r.returncode}:\n" + "\n".join(log.read_text().splitlines()[-15:]))
    d = json.loads(out.read_text())
    rows = []
    for r in d.get("rows", []):
        # gpu_bench's rows state their ratio's direction; ratio() takes cairn and the baseline as
        # measured and which way is better.
        lower = r["ratio_is"] == "baseline / cairn" or r.get("unit") == "s"
        goal = r.get("goal")
        if goal and r["ratio_is"] == "baseline / cairn":  # a goal on baseline / cairn, as one on cairn / baseline
            op, val = goal.split()
            goal = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}.get(op, op) + f" {1 / float(val):.4g}"
        rows.append(ratio("gpu", r["name"].split(": ", 1)[-1], r["value"], r["baseline"], r["baseline_value"],
                          r.get("unit", ""), "lower" if lower else "higher", goal=goal))
    return rows


COMPONENTS: List[tuple] = [
    ("micro", run_micro, "Google Benchmark micro benchmarks (bench/micro)"),
    ("tiers", run_tiers, "blocking commits, NVMe reads, DRAM hits (bench/workloads/tiering_bench.cpp)"),
    ("reads", run_read, "DRAM-tier and cold repository reads (bench/workloads/read_bandwidth.cpp)"),
    ("catalog", run_catalog, "best-ancestor queries (bench/workloads/catalog_bench.cpp)"),
    ("metadata", run_metadata, "metadata-only commits and cached opens (bench/workloads/metadata_commits.cpp)"),
    ("repository", run_repository, "the shared repository in-process: group commit vs one file per model, files, "
     "reopen time and memory at 100,000 models (bench/workloads/repository_bench.cpp)"),
    ("restart", run_restart, "a daemon restart on a repository of 100,000 models committed through it "
     "(bench/workloads/restart_bench.py)"),
    ("torch loads", run_torch, "PyTorch loads into a built nn.Module and as state dicts, warm and cold, against "
     "safetensors, torch.load, Run:ai Model Streamer, Tensorizer and the kernel's page mapping alone, with the "
     "machine's shared-memory huge-page setting and the other (bench/workloads/torch_load.py)"),
    ("workloads", run_workloads, "NAS, ensemble, checkpoint, coupled workloads (bench/workloads/workloads.py)"),
    ("policy", run_policy, "eviction policies vs Belady on traces (cairn-sim), prefetch from hints (bench/workloads/prefetch_bench.py)"),
    ("peers", run_peers, "the daemons of a job as one cache over libfabric: peer stream, ensemble loads, "
     "simulated 16 to 4,096 nodes (bench/workloads/peers_bench.py)"),
    ("mpi", run_mpi, "data-parallel checkpoints and restarts over 1, 2, 4 MPI ranks (bench/workloads/mpi_bench.py)"),
    ("dcp", run_dcp, "torch.distributed.checkpoint on cairn vs DCP's FileSystemWriter/Reader on 1 and 2 gloo ranks "
     "(bench/workloads/dcp_bench.py)"),
    ("frameworks", run_frameworks, "the framework doors beside each framework's default: DeepSpeed checkpoint "
     "engine, Lightning CheckpointIO, transformers from_pretrained, a DeepHyper-style search transferring from the best "
     "ancestor (bench/workloads/frameworks_bench.py)"),
    ("compression", run_compression, "lossless chunk coding in the repository (repository_compression): byte "
     "planes on trained weights against raw and zstd, decode throughput, fine-tuning and training checkpoint series, "
     "cold reads, the flusher with and without coding (bench/workloads/compression_bench.py)"),
    ("gpu", run_gpu, "the GPU tier: loads into device memory, HBM hits, checkpoints from the device "
     "(bench/workloads/gpu_bench.py; skipped without a GPU)"),
    ("coupled", run_coupled, "the coupled example (MPI heat simulation + online PyTorch trainer) over cairn and over "
     "Redis on 2 ranks (bench/workloads/coupled_bench.py)"),
    ("near", run_near, "near-data feature extraction: the frozen prefix run by the storage side's worker over a "
     "shaped link, against shipping raw images (bench/workloads/near_bench.py)"),
]


def _cairn_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "api" / "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["CAIRN_LIBRARY"] = str(BUILD / "lib" / "libcairn.so")
    env["CAIRN_BUILD_DIR"] = str(BUILD)
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    return env


def _run(args: List[str], log: Path, capture: bool = False, env: Optional[Dict[str, str]] = None,
         timeout: int = 1800) -> str:
    with open(log, "w") as lf:
        r = subprocess.run(args, stdout=subprocess.PIPE if capture else lf, stderr=lf, env=env, timeout=timeout,
                           cwd=str(ROOT), text=True)
    if r.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"{Path(args[0]).name if not args[0].endswith('python') else args[1]} exited with "
                           f"{r.returncode}:\n{tail}")
    return r.stdout if capture else ""


# ---- output ---------------------------------------------------------------------------------

def fmt(v: float, unit: str) -> str:
    if v != v:  # nan
        return "-"
    if unit == "s":
        return f"{v * 1e3:.1f} ms" if v < 10 else f"{v:.1f} s"
    if unit == "us":
        return f"{v:,.1f} µs" if v < 1e4 else f"{v / 1e3:,.1f} ms"
    if unit == "bytes":
        for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if v >= s:
                return f"{v / s:.1f} {u}"
        return f"{v:.0f} B"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "MB/s":
        return f"{v:,.0f} MB/s" if v >= 10 else f"{v:.2f} MB/s"
    if unit == "1/s":
        return f"{v:,.0f}/s"
    if unit == "ns":
        return f"{v:,.0f} ns"
    if unit == "files":
        return f"{v:,.0f} files"
    return f"{v:.3g} {unit}".strip()


def table(rows: List[Dict[str, Any]]) -> List[str]:
    lines = ["| what | cairn | baseline | baseline's | cairn / baseline | goal |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['metric']} | **failed**: {r['error'].splitlines()[0][:160]} | | | | |")
            continue
        adv = r["advantage"]
        verdict = ((f"{adv:.2f}x better" if adv >= 1 else f"**{1 / adv:.2f}x worse**" if adv > 0 else "**none of it**")
                   if adv == adv else "")
        goal = ""
        if r["goal"]:
            goal = f"{r['goal']}: {'met' if r['met'] else '**not met**'}"
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(f"| {r['metric']}{note} | {fmt(r['cairn'], r['unit'])} | {r['baseline']} | "
                     f"{fmt(r['baseline_value'], r['unit'])} | {r['ratio']:.3g} ({verdict}) | {goal} |")
    return lines


def plot(group: str, rows: List[Dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if "error" not in r and r["advantage"] == r["advantage"] and r["advantage"] > 0]
    if not rows:
        return False
    labels = [f"{r['metric']}\nvs {r['baseline']}" for r in rows]
    vals = [r["advantage"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.2))
    colors = ["#2a9d8f" if v >= 1 else "#e76f51" for v in vals]
    ax.barh(range(len(rows)), vals, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("how many times better cairn is than the baseline (log; < 1: worse)")
    ax.set_title(group)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2g}x", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render_device(doc_dir: Path) -> List[str]:
    """The newest GPU-machine check (scripts/device-check's results.json, kept under
    bench/results/device/): its machine, what ran, and its figures against their goals."""
    files = sorted((ROOT / "bench" / "results" / "device").glob("*.json"))
    if not files:
        return ["## On the GPU machine", "",
                "scripts/device-check has not run on a GPU machine yet (docs/device-check.md).", ""]
    d = json.loads(files[-1].read_text())
    p = d.get("stages", {}).get("probe", {})
    pk = p.get("python_packages", {})
    rel = os.path.relpath(files[-1], ROOT)
    runs = d.get("runs") or [{"started": d.get("started"), "seconds": d.get("seconds"),
                              "stages": list(d.get("stages", {})), "bundle_commit": p.get("bundle_commit")}]
    lines = ["## On the GPU machine", "",
             f"From `{rel}` (`scripts/device-check`; docs/device-check.md): the GPU tier, GPU loads and the "
             "many-core parts, which the machine above cannot show. Medians over few repeats (the check fits a "
             "15-minute lease).", "",
             f"- {p.get('nvidia_smi', '?')} (name, memory, driver, PCIe generation and width); {p.get('cores', '?')} "
             f"cores, {p.get('memory_gib', '?')} GiB memory; Python {p.get('python', '?')}, torch "
             f"{pk.get('torch', '?')} (CUDA {pk.get('torch_cuda', '?')}), numpy {pk.get('numpy', '?')}"]
    for run in runs:
        lines.append(f"- run {run.get('started')} ({run.get('seconds')} s), bundle of commit "
                     f"`{str(run.get('bundle_commit') or '?')[:12]}`: {', '.join(run.get('stages', []))}")
    lines[-1] += ("" if len(runs) == 1 else "; a stage run twice: the later run's figures")
    lines += ["", "| stage | status | seconds | note |", "|---|---|---:|---|"]
    for name, st in d.get("stages", {}).items():
        why = str(st.get("why", ""))
        errors = [ln.strip()[1:].strip() for ln in why.splitlines() if ln.strip().startswith("E ")]
        note = " ".join(errors or why.split())
        note = note.replace("|", "\\|")[:200]
        lines.append(f"| {name} | {st.get('status')} | {st.get('seconds', '')} | {note} |")
    lines.append("")
    rows = d.get("rows", [])
    if rows:
        def f(x: Any) -> str:
            return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else ("" if x is None else str(x))
        lines += ["| figure | cairn | baseline | baseline value | ratio | goal | met |", "|---|---:|---|---:|---:|---|---|"]
        for r in rows:
            met = {True: "yes", False: "**no**"}.get(r.get("met"), "")
            lines.append(f"| {r['figure']} | {f(r.get('value'))} | {r.get('baseline', '')} | {f(r.get('baseline_value'))} "
                         f"| {f(r.get('ratio'))} | {r.get('goal', '')} | {met} |")
        lines.append("")
    return lines


def render_doc(results: Dict[str, Any], img_dir: Path, doc_dir: Path) -> str:
    m = results["machine"]
    lines = ["# Benchmarks", "",
             "Generated by `bench/run` (do not edit by hand: every figure below comes from "
             f"`{results['results_file']}`). Each benchmark measures cairn and its baselines in the same run on the "
             "same machine and data, and reports medians over repeats; CPU timings on a shared 2-core machine are "
             "noisy, so compare figures from one run. How each benchmark works and how to run it alone: "
             "[bench/README.md](../bench/README.md).", "",
             "## Machine", "",
             f"- {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / (1 << 30):.1f} GiB memory, {m['os']}, "
             f"kernel {m['kernel']}; temporary files on {m['tmp_filesystem']}; GPU: {m['gpu']}; "
             f"transparent huge pages for shared memory (the DRAM arena): {m.get('shmem_thp', 'not recorded')}",
             f"- run {results['started']} ({'--quick' if results['quick'] else 'full run'}), "
             f"{results['seconds'] / 60:.1f} minutes", ""]
    runs = _update_runs(results)
    if runs:
        again = []
        for run in runs:
            parts = ", ".join(run["parts"])
            thp = f"; shared-memory huge pages: {run['shmem_thp']}" if run.get("shmem_thp") else ""
            # A part measured again on another machine says which (its results file records it).
            try:
                rm = json.loads((ROOT / run["results"]).read_text())["machine"]
            except (OSError, ValueError, KeyError):
                rm = {}
            if rm and (rm.get("cpu"), rm.get("kernel")) != (m.get("cpu"), m.get("kernel")):
                thp += (f"; on another machine: {rm.get('cpu')}, {rm.get('cores')} cores, "
                        f"{rm.get('memory_bytes', 0) / (1 << 30):.1f} GiB memory, kernel {rm.get('kernel')}")
            again.append(f"- measured again on {run['started']} with `bench/run --only {parts} --update` "
                         f"(results `{run['results']}`{thp}): {parts}")
        again[-1] += "; every other figure is from the full run above (a part measured twice: the later run)"
        lines[-1:-1] = again
    goals = [r for r in results["ratios"] if "error" not in r and r.get("goal")]
    if goals:
        lines += ["## Goals", "", *table(goals), ""]
    for name, _, desc in COMPONENTS:
        rows = [r for r in results["ratios"] if r["group"] == name or r["group"].startswith(name + ":")
                or (name == "workloads" and r["group"].startswith("workload:"))]
        err = results["errors"].get(name)
        skipped = results.get("skipped", {}).get(name)
        if not rows and not err and not skipped:
            continue
        lines += [f"## {name}", "", desc + ".", ""]
        if skipped:
            lines += [f"Not run on this machine: {skipped}.", ""]
        if err:
            lines += [f"This part failed in this run: `{err.splitlines()[0][:300]}`", ""]
        if rows:
            lines += table(rows) + [""]
            stem = name.replace(' ', '-').replace(':', '')
            for img in (img_dir / f"{stem}.png", img_dir / f"{stem}-simulation.png"):  # a part's own plot too
                if img.exists():
                    lines += [f"![{img.stem}]({os.path.relpath(img, doc_dir)})", ""]
    lines += render_device(doc_dir)
    losses = [r for r in results["ratios"] if "error" not in r and r["advantage"] == r["advantage"] and r["advantage"] < 1]
    if losses:
        lines += ["## Where cairn loses", "",
                  "Every row above where cairn is worse than its baseline, so none hides in a table:", ""]
        for r in losses:
            worse = f"{1 / r['advantage']:.2f}x worse" if r["advantage"] > 0 else "none of it"
            lines.append(f"- {r['group']}: {r['metric']} vs {r['baseline']}: {worse}")
        lines += ["", "The analysis of each loss is in [docs/tiering.md](tiering.md) and the issue notes; "
                  "the figures here are only what this run measured.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats (correctness, not timing)")
    ap.add_argument("--only", help="comma-separated components: " + ", ".join(c[0] for c in COMPONENTS))
    ap.add_argument("--no-docs", action="store_true", help="do not regenerate docs/benchmarks.md")
    ap.add_argument("--update", metavar="RESULTS",
                    help="with --only: the parts run now replace theirs in this earlier full run's results, and "
                         "docs/benchmarks.md is written from the merge (it names both runs)")
    ap.add_argument("--render", metavar="RESULTS",
                    help="run nothing: write docs/benchmarks.md again from this full run's results (and the newest "
                         "GPU-machine check under bench/results/device/)")
    a = ap.parse_args()
    if a.render:
        results = json.loads((ROOT / a.render).read_text())
        doc_path = ROOT / "docs" / "benchmarks.md"
        doc_path.write_text(render_doc(results, ROOT / "docs" / "img" / "benchmarks", doc_path.parent))
        print(f"bench/run: {doc_path} written from {a.render}")
        return 0
    if a.update and (not a.only or a.quick):
        print("bench/run: --update needs --only and a full (not --quick) run", file=sys.stderr)
        return 2
    if not (BIN / "cairnd").exists():
        print(f"bench/run: {BIN / 'cairnd'} is missing: run scripts/build first", file=sys.stderr)
        return 2
    only = set(a.only.split(",")) if a.only else None
    started = dt.datetime.now()
    host = socket.gethostname().split(".")[0]
    if a.quick:
        out_dir = ROOT / "bench" / "results" / "quick"
        img_dir = out_dir
        doc_path = out_dir / "benchmarks.md"
    else:
        out_dir = ROOT / "bench" / "results"
        img_dir = ROOT / "docs" / "img" / "benchmarks"
        doc_path = ROOT / "docs" / "benchmarks.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-run-"))
    results: Dict[str, Any] = {"machine": machine(), "quick": a.quick, "started": started.isoformat(timespec="seconds"),
                               "ratios": [], "errors": {}, "component_seconds": {}}
    t0 = time.time()
    for name, fn, desc in COMPONENTS:
        if only and name not in only:
            continue
        print(f"== {name}: {desc}", flush=True)
        c0 = time.time()
        try:
            rows = fn(a.quick, work)
            results["ratios"] += rows
            for line in table(rows):
                print("   " + line)
        except Skipped as e:
            results.setdefault("skipped", {})[name] = str(e)
            print(f"   skipped: {e}")
        except Exception as e:  # one failed part does not stop the others; it is reported
            msg = f"{type(e).__name__}: {e}"
            results["errors"][name] = msg
            print(f"   FAILED: {msg}", file=sys.stderr)
            if os.environ.get("CAIRN_BENCH_DEBUG"):
                traceback.print_exc()
        results["component_seconds"][name] = round(time.time() - c0, 1)
        print(f"   ({results['component_seconds'][name]:.0f} s)", flush=True)
    results["seconds"] = time.time() - t0
    # Each part's own output too (figures the ratio table does not show, e.g. time to reach global).
    results["raw"] = {}
    for f in sorted(work.glob("*.json")) + sorted(work.glob("*/*.json")):
        try:
            results["raw"][str(f.relative_to(work))] = json.loads(f.read_text())
        except (OSError, ValueError):
            pass
    stamp = started.strftime("%Y-%m-%d-%H%M")
    res_path = out_dir / f"{stamp}-{host}.json"
    for n in range(2, 100):  # two runs in one minute (a quick --only --update): keep both
        if not res_path.exists() and not (out_dir / f"{res_path.stem}-merged.json").exists():
            break
        res_path = out_dir / f"{stamp}-{host}-{n}.json"
    results["results_file"] = os.path.relpath(res_path, ROOT)
    res_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    if a.update:
        # The earlier run's figures, with the parts run now replaced by theirs (in a file of its own).
        base = json.loads((ROOT / a.update).read_text() if not Path(a.update).is_absolute()
                          else Path(a.update).read_text())
        def part(r):
            g = r["group"]
            return next((n for n, _, _ in COMPONENTS if g == n or g.startswith(n + ":")
                         or (n == "workloads" and g.startswith("workload:"))), g)
        merged = dict(base)
        merged["ratios"] = [r for r in base["ratios"] if part(r) not in only] + results["ratios"]
        merged["errors"] = {k: v for k, v in base.get("errors", {}).items() if k not in only}
        merged["errors"].update(results["errors"])
        merged["updated_parts"] = {**base.get("updated_parts", {}), **{n: results["started"] for n in sorted(only)}}
        merged["updated_from"] = os.path.relpath(res_path, ROOT)
        merged["base_file"] = base.get("results_file", a.update)
        merged["updated_runs"] = _update_runs(base) + [
            {"started": results["started"], "parts": sorted(only), "results": merged["updated_from"],
             "base": merged["base_file"], "shmem_thp": results["machine"].get("shmem_thp")}]
        merged_path = out_dir / f"{res_path.stem}-merged.json"
        merged["results_file"] = os.path.relpath(merged_path, ROOT)
        merged_path.write_text(json.dumps(merged, indent=1, default=str) + "\n")
        results = merged
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in results["ratios"]:
        key = "workloads" if r["group"].startswith("workload:") else r["group"]
        groups.setdefault(key, []).append(r)
    for g, rows in groups.items():
        plot(g, rows, img_dir / f"{g.replace(' ', '-').replace(':', '')}.png")
    if not a.no_docs:
        doc_path.write_text(render_doc(results, img_dir, doc_path.parent))
    shutil.rmtree(work, ignore_errors=True)
    print(f"bench/run: {len(results['ratios'])} ratios in {results['seconds'] / 60:.1f} min; results {res_path}"
          + ("" if a.no_docs else f"; {doc_path}"))
    if results["errors"]:
        print("bench/run: failed parts: " + ", ".join(results["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
