#!/usr/bin/env python3
"""Loading a model into PyTorch: cairn against safetensors, torch.load, Run:ai Model Streamer and
Tensorizer, same weights, same run, warm and cold, and against the kernel's page mapping alone.

Models (models.py, built on the CPU with torch.manual_seed(0)): BERT-base (12 layers, width 768,
417.6 MiB of float32 in 151 tensors) and GPT-2 small (124M parameters, 474.7 MiB in 148 tensors), both
from torch.nn modules with the published dimensions; --quick: torchvision's ResNet-50 (97.7 MiB).

Module loads: the time from the stored model to a module that is ready, into a module built once
beforehand (the build is outside the time for every way; before each load the module's own
parameters and buffers are put back in place, Model.fresh):
  cairn.torch.load                 ct.load(id, module): the module's parameters become copy-on-write
                                   views of the daemon's shared arena (no copy)
  cairn.torch.load copy=True       one copy straight into the module's own parameters
  safetensors load_file            load_file + load_state_dict (PyPI safetensors)
  torch.load                       of a torch.save file (weights_only, map_location cpu) + load_state_dict
  Run:ai Model Streamer, Tensorizer  from their own formats, two ways each (loaders_cpu.py)
Warm: every file in the page cache and the model in the daemon's arena; the ways take turns, the
median of --repeats loads each. Cold: the page cache dropped before each load (as root:
/proc/sys/vm/drop_caches; otherwise, and with --quick, posix_fadvise(DONTNEED) on every file, which
the output says) and, for cairn, a freshly started daemon on the same repository, so its bytes come
from the repository's pack files; one load each.

Shared-memory huge pages (/sys/kernel/mm/transparent_hugepage/shmem_enabled, which decides whether
cairnd's arena gets 2 MiB pages): the warm module loads run with the machine's setting; then, as
root and without --quick or --no-thp-switch, with the other one (advise where the machine has
never or another mode without huge pages, else never) for a daemon started under it: cairn's module
load, safetensors' again, and the page-mapping baselines; the machine's setting is put back after
(loaders_cpu.ShmemThp). The page-mapping baseline (loaders_cpu.ShmFile): the same number of bytes of
a memfd backed beforehand, mapped privately and populated (MADV_POPULATE_READ), or one byte read
per 4 KiB page; the faster of the two is the rows' baseline. Each mode's rows say how many MiB of
cairn's views and of the baseline's mapping the kernel mapped with 2 MiB entries, and how many MiB
the daemon copied to give a tensor whose chunks are not adjacent in its arena one contiguous view
(stats' leases.owned_bytes while the views live: a copy on every load).

State-dict loads (load only, no module): cairn zero-copy (read-only views of the arena through
torch.from_numpy), cairn.torch.load (copy-on-write views), torch.load and safetensors load_file,
warm, median of --repeats.

The first (warm-up) load of each way and every cold load are compared with the model's tensors,
into a module whose memory was overwritten first (a mismatch exits 1). The JSON's "rows" give each
comparison: cairn's figure, the baseline's, cairn / baseline and the goal on it.

Usage: bench/workloads/torch_load.py [--repeats 7] [--quick] [--no-thp-switch] [--models A,B] [--json FILE]
  --quick: ResNet-50 only, 1 repeat, the machine's setting only, cold loads after evicting only the
  benchmark's files (posix_fadvise): a correctness run of every way (~30 s on 2 idle cores).
  --models: "BERT-base", "GPT-2 small", "ResNet-50" (the goals are on the first two).
Needs a build (scripts/build): it starts build/bin/cairnd itself and stops it by pid.
"""
import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402
import loaders_cpu as lc  # noqa: E402
import models  # noqa: E402
from bench_daemon import Daemon, drop_caches  # noqa: E402

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

SAFETENSORS = "safetensors load_file + load_state_dict"
TORCH_LOAD = "torch.load + load_state_dict"
MAP_POPULATE = "page mapping: mmap + MADV_POPULATE_READ"
MAP_TOUCH = "page mapping: mmap + a read per 4 KiB page"


def resnet50():
    import torchvision
    return torchvision.models.resnet50()


BUILDERS = {"BERT-base": lambda: models.BertBase("cpu"), "GPT-2 small": lambda: models.Gpt2Small("cpu"),
            "ResNet-50": resnet50}


def build(name):
    """The model `name`, its weights drawn from a seed of its own: models of different names share no
    bytes (one seed for all would give BERT-base's and GPT-2's token embeddings the same first 30,522
    rows, stored once, as no two real models are)."""
    torch.manual_seed(zlib.crc32(name.encode()))
    return BUILDERS[name]().eval()


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).numpy().view(np.uint8)


def same_state(got, ref) -> bool:
    """The same names, dtypes, shapes and bytes (compared through numpy: torch.equal's threads wait
    for each other on a busy 2-core machine, taking seconds per model)."""
    return set(got) == set(ref) and all(
        got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape and np.array_equal(_bytes(got[k]), _bytes(ref[k]))
        for k in ref)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def views_pmd_kib() -> int:
    """KiB of cairn's copy-on-write views (private mappings of the daemon's arena memfd) mapped with
    2 MiB entries in this process."""
    return lc.pmd_mapped_kib(lambda _at, perms, name: "cairn-arena" in name and perms.endswith("p"))


class Model:
    """One model's built module, reference tensors and files (torch.save, safetensors, Tensorizer),
    stored in cairn as `name`."""

    def __init__(self, name: str, root: Path, c):
        self.name = name
        self.template = build(name)
        self.own = [(mod, kind, attr, obj, obj.data) for mod in self.template.modules()
                    for kind in ("_parameters", "_buffers") for attr, obj in getattr(mod, kind).items()
                    if obj is not None]
        self.ref = {k: v.detach().clone().contiguous() for k, v in self.template.state_dict().items()}
        self.nbytes = sum(v.numel() * v.element_size() for v in self.ref.values())
        stem = name.replace(" ", "_")
        self.pt, self.st, self.tz = root / f"{stem}.pt", root / f"{stem}.safetensors", root / f"{stem}.tensors"
        torch.save(self.ref, self.pt)
        save_file(self.ref, str(self.st))
        lc.write_tensorizer(self.template, self.tz)
        ct.save(self.ref, name, client=c)

    def fresh(self, scramble: bool = False):
        """The built module with its own parameters and buffers back in place (their objects and
        memory, as built: a load that assigns replaces them, one that copies writes the same bytes
        into them), so every load starts from the same built module without building it again.
        `scramble`: their memory filled with 7s first, so that a load that is checked must have
        written every byte."""
        with torch.no_grad():
            for mod, kind, attr, obj, data in self.own:
                if scramble:
                    data.numpy()[...] = 7
                obj.data = data
                getattr(mod, kind)[attr] = obj
        return self.template

    def check(self, module, way: str) -> None:
        if not same_state(module.state_dict(), self.ref):
            raise SystemExit(f"{way} loaded different tensors into {self.name}")

    def module_ways(self, c):
        """way -> load into a built module."""
        ways = {
            "cairn.torch.load": lambda m: ct.load(self.name, m, client=c),
            "cairn.torch.load copy=True": lambda m: ct.load(self.name, m, client=c, copy=True),
            SAFETENSORS: lambda m: m.load_state_dict(load_file(str(self.st))),
            TORCH_LOAD: lambda m: m.load_state_dict(torch.load(self.pt, map_location="cpu", weights_only=True)),
        }
        ways.update({w: fn for w, (_, _, fn) in lc.loader_ways(self.st, self.tz).items()})
        return ways

    def state_ways(self, c):
        """way -> a state dict."""
        return {
            "cairn zero-copy": lambda: {k: torch.from_numpy(v) for k, v in c.load_model(self.name).items()},
            "cairn.torch.load": lambda: ct.load(self.name, client=c),
            "torch.load": lambda: torch.load(self.pt, map_location="cpu", weights_only=True),
            "safetensors load_file": lambda: load_file(str(self.st)),
        }


def assembled_bytes(c) -> int:
    """Bytes the daemon holds as contiguous copies it assembled for this client's live views (a
    tensor whose chunks are not adjacent in its arena is copied into one extent for each lease:
    stats' leases.owned_bytes)."""
    return int(c.stats().get("leases", {}).get("owned_bytes", -1))


def warm_module_loads(m: Model, ways, repeats: int, shm: lc.ShmFile = None, c=None) -> dict:
    """Median seconds of each way into the built module (Model.fresh), the ways taking turns after
    one warm-up load each (the one compared with the model); with `shm`, the page-mapping baselines
    take their turns too. Also, after cairn's first load (its views alive), the KiB of them mapped
    with 2 MiB entries and (with the client `c`) the bytes the daemon copied to assemble them."""
    times = {w: [] for w in ways}
    if shm is not None:
        times[MAP_POPULATE], times[MAP_TOUCH] = [], []
    extra = {}
    for r in range(repeats + 1):
        for way, fn in ways.items():
            target = m.fresh(scramble=r == 0)
            gc.collect()
            t, _ = timed(lambda: fn(target))
            if r:
                times[way].append(t)
            else:
                m.check(target, way)
            if way == "cairn.torch.load" and r == 0:
                extra["cairn_views_pmd_kib"] = views_pmd_kib()
                if c is not None:
                    extra["cairn_assembled_bytes"] = assembled_bytes(c)
            del target
        if shm is not None:
            for way, touch in ((MAP_POPULATE, False), (MAP_TOUCH, True)):
                t, mapping = shm.map(touch)
                if r:
                    times[way].append(t)
                if r == 0 and not touch:
                    extra["map_pmd_kib"] = lc.ShmFile.pmd_kib(mapping)
                mapping.close()
    out = {w: statistics.median(ts) for w, ts in times.items()}
    out["_samples"] = times
    out.update({"_" + k: v for k, v in extra.items()})
    return out


def warm_state_loads(m: Model, ways, repeats: int) -> dict:
    """Median seconds of each way to a state dict, taking turns after one warm-up load each (the one
    compared with the model)."""
    times = {w: [] for w in ways}
    for r in range(repeats + 1):
        for way, fn in ways.items():
            gc.collect()
            t, out = timed(fn)
            if r:
                times[way].append(t)
            elif not same_state(out, m.ref):
                raise SystemExit(f"{way} gave different tensors for {m.name}")
            del out
    return {w: statistics.median(ts) for w, ts in times.items()}


def thp_mode_loads(models_, root: Path, dram: str, mode: str, repeats: int) -> dict:
    """Under shmem_enabled = `mode`: a fresh daemon on the same repository (its arena backed under
    the mode), each model loaded once into its arena, then cairn's module loads, safetensors' and the
    page-mapping baselines, warm, taking turns. The machine's setting is back when this returns."""
    out = {"mode": mode}
    with lc.ShmemThp(mode):
        d = Daemon(BUILD, root, dram)
        try:
            d.start()
            c = cairn.connect(d.socket)
            out["arena_pages"] = c.stats()["tiers"]["dram"].get("pages", "")
            for m in models_:
                ways = {w: fn for w, fn in m.module_ways(c).items() if w in ("cairn.torch.load", SAFETENSORS)}
                shm = lc.ShmFile(m.nbytes)
                try:
                    out[m.name] = warm_module_loads(m, ways, repeats, shm, c)
                finally:
                    shm.close()
            c.close()
        finally:
            d.stop()
    return out


def evict(files, files_only: bool) -> str:
    """Drops the page cache (bench_daemon.drop_caches), or with `files_only` only `files`' pages
    (posix_fadvise(DONTNEED): what --quick does, leaving the rest of the machine's cache alone)."""
    if not files_only:
        return drop_caches(files)
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # DONTNEED leaves dirty pages; only these files' are written back (not a global sync)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise(DONTNEED)"


def cold_module_loads(models_, root: Path, d: Daemon, files_only: bool) -> tuple:
    """One load per way into the built module after dropping the page cache (evict); for cairn a
    fresh daemon on the same repository. Returns ({model: {way: s}}, how the cache was dropped)."""
    out, how = {}, "?"
    for m in models_:
        row = out.setdefault(m.name, {})
        files = [m.pt, m.st, m.tz] + list((root / "repo" / "packs").iterdir())
        for way in ("cairn.torch.load", SAFETENSORS, TORCH_LOAD, *lc.loader_ways(m.st, m.tz)):
            d.stop()
            target = m.fresh(scramble=True)
            gc.collect()
            how = evict(files, files_only)
            if way == "cairn.torch.load":
                d.start()
                c = cairn.connect(d.socket)
                t, _ = timed(lambda: ct.load(m.name, target, client=c))
                m.check(target, way)
                del target
                gc.collect()
                c.close()
            else:
                fn = m.module_ways(None)[way]
                t, _ = timed(lambda: fn(target))
                m.check(target, way)
                del target
            row[way] = t
    return out, how


# ---- rows ------------------------------------------------------------------------------------

def row(what: str, value: float, baseline: str, baseline_value: float, goal=None, note: str = "") -> dict:
    """One comparison, in seconds (lower is better): cairn's figure (value), the baseline's, their
    ratio cairn / baseline and the goal on it (None: reported only)."""
    r = value / baseline_value if baseline_value else float("nan")
    met = None
    if goal:
        op, val = goal.split()
        met = {"<=": r <= float(val), ">=": r >= float(val), "<": r < float(val), ">": r > float(val)}[op]
    return {"name": what, "value": value, "baseline": baseline, "baseline_value": baseline_value, "unit": "s",
            "ratio": r, "ratio_is": "cairn / baseline", "goal": goal, "met": met, "note": note}


def fastest(times: dict, loader: str, ways) -> tuple:
    """The fastest of `loader`'s ways in `times`: (its variant, seconds, every variant's figure for a note)."""
    mine = {ways[w][1]: times[w] for w in ways if ways[w][0] == loader and w in times}
    best = min(mine, key=mine.get)
    return best, mine[best], ", ".join(f"{v}: {s * 1e3:.1f} ms" for v, s in mine.items())


def make_rows(res: dict, goal_models) -> list:
    rows = []
    loaders = lc.loader_ways(Path("-"), Path("-"))
    ver = res["versions"]
    label = {"Run:ai Model Streamer": f"Run:ai Model Streamer {ver['runai-model-streamer']}",
             "Tensorizer": f"Tensorizer {ver['tensorizer']}"}
    modes = [res["thp"]] + [x for x in res.get("thp_other", []) if "error" not in x]
    for name, mr in res["models"].items():
        goals = name in goal_models
        w = mr["warm_state_s"]
        rows.append(row(f"{name} warm state dict", w["cairn zero-copy"], "safetensors load_file",
                        w["safetensors load_file"], "<= 0.5"))
        rows.append(row(f"{name} warm state dict", w["cairn zero-copy"], "torch.load", w["torch.load"], "<= 0.2"))
        for mt in modes:
            mode, mw = mt["mode"], mt[name]
            huge = lc.is_huge(mode)
            c = mw["cairn.torch.load"]
            pmd = (f"cairn's views: {mw.get('_cairn_views_pmd_kib', -1) // 1024} MiB mapped with 2 MiB pages, "
                   f"{mw.get('_cairn_assembled_bytes', -1) / 2**20:.0f} MiB copied by the daemon into contiguous views")
            what = f"{name} into nn.Module, warm, shmem THP {mode}"
            rows.append(row(what, c, SAFETENSORS, mw[SAFETENSORS], "<= 0.1" if goals and huge else None, pmd))
            # The faster of the two ways of faulting the same bytes in is the baseline.
            best = min((MAP_POPULATE, MAP_TOUCH), key=lambda k: mw[k])
            rows.append(row(what, c, "the kernel's page mapping alone, same bytes of a backed memfd ("
                            + best.split(": ", 1)[1] + ")", mw[best], "<= 1.2" if goals and not huge else None,
                            f"{pmd}; the memfd's: {mw.get('_map_pmd_kib', -1) // 1024} MiB; "
                            f"MADV_POPULATE_READ {mw[MAP_POPULATE] * 1e3:.1f} ms, a read per 4 KiB page "
                            f"{mw[MAP_TOUCH] * 1e3:.1f} ms"))
            if mt is res["thp"]:
                rows.append(row(what, c, TORCH_LOAD, mw[TORCH_LOAD]))
                rows.append(row(what + " (copy=True)", mw["cairn.torch.load copy=True"], SAFETENSORS, mw[SAFETENSORS]))
                for loader in ("Run:ai Model Streamer", "Tensorizer"):
                    best, s, others = fastest(mw, loader, loaders)
                    rows.append(row(what, c, f"{label[loader]} ({best})", s, "< 1" if goals else None, others))
        cold = mr.get("cold_s")
        if cold:
            what = f"{name} into nn.Module, cold"
            note = f"page cache: {res['cold_method']}; cairn: a fresh daemon, read from the repository"
            c = cold["cairn.torch.load"]
            rows.append(row(what, c, SAFETENSORS, cold[SAFETENSORS], note=note))
            rows.append(row(what, c, TORCH_LOAD, cold[TORCH_LOAD], note=note))
            for loader in ("Run:ai Model Streamer", "Tensorizer"):
                best, s, others = fastest(cold, loader, loaders)
                rows.append(row(what, c, f"{label[loader]} ({best})", s, "< 1" if goals else None, f"{note}; {others}"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-thp-switch", action="store_true",
                    help="measure with the machine's shared-memory huge-page setting only")
    ap.add_argument("--models", help="comma-separated, of: " + ", ".join(BUILDERS)
                    + " (default: BERT-base,GPT-2 small; --quick: ResNet-50)")
    ap.add_argument("--json")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    names = args.models.split(",") if args.models else ["ResNet-50"] if args.quick else ["BERT-base", "GPT-2 small"]
    if any(n not in BUILDERS for n in names):
        ap.error(f"--models: one of {', '.join(BUILDERS)}")
    goal_models = ("BERT-base", "GPT-2 small")

    root = Path(tempfile.mkdtemp(prefix="cairn-bench-torch-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    thp = lc.shmem_thp()
    res = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "torch": torch.__version__},
           "versions": lc.versions(), "repeats": repeats, "models": {},
           "thp": {"mode": thp}, "module_build": "excluded for every way: built once before, its own parameters put back before each load"}
    dram = "512MiB" if args.quick else "2GiB"
    phase = res["phase_s"] = {}
    t0 = time.time()
    d = Daemon(BUILD, root, dram)
    try:
        d.start()
        c = cairn.connect(d.socket)
        res["thp"]["arena_pages"] = c.stats()["tiers"]["dram"].get("pages", "")
        ms = [Model(n, root, c) for n in names]
        gc.collect()
        gc.freeze()  # what exists now is never garbage: the collections between loads skip it
        phase["setup"] = time.time() - t0
        for m in ms:
            res["models"][m.name] = {"bytes": m.nbytes, "tensors": len(m.ref),
                                     "warm_state_s": warm_state_loads(m, m.state_ways(c), repeats)}
            shm = lc.ShmFile(m.nbytes)
            try:
                res["thp"][m.name] = warm_module_loads(m, m.module_ways(c), repeats, shm, c)
            finally:
                shm.close()
        c.close()
        d.stop()
        phase["warm"] = time.time() - t0 - phase["setup"]

        other = "never" if lc.is_huge(thp) else "advise"
        if args.quick or args.no_thp_switch or not thp:
            res["thp_other_skipped"] = "--quick" if args.quick else ("--no-thp-switch" if thp else "no setting")
        elif not lc.can_set_shmem_thp():
            res["thp_other_skipped"] = f"cannot write {lc.shmem_thp_file()} (not root?)"
        else:
            try:
                res["thp_other"] = [thp_mode_loads(ms, root, dram, other, repeats)]
            except OSError as e:
                res["thp_other"] = [{"mode": other, "error": str(e)}]
        if lc.shmem_thp() != thp:
            raise SystemExit(f"shmem_enabled is {lc.shmem_thp()!r}, not the machine's {thp!r}, after the switch")

        phase["other_thp"] = time.time() - t0 - phase["setup"] - phase["warm"]
        cold, res["cold_method"] = cold_module_loads(ms, root, d, args.quick)
        phase["cold"] = time.time() - t0 - sum(phase.values())
        for name, times in cold.items():
            res["models"][name]["cold_s"] = times
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
        gc.unfreeze()

    res["rows"] = make_rows(res, goal_models)
    print(f"loading into PyTorch (torch {torch.__version__}, {os.cpu_count()} CPUs, "
          + ", ".join(f"{k} {v}" for k, v in res["versions"].items())
          + f"); warm: median of {repeats}, the ways taking turns; cold: one load after {res.get('cold_method', '?')}"
          f" (cairn: a fresh cairnd); shmem THP: {thp}"
          + (f", then {res['thp_other'][0]['mode']}" if res.get("thp_other") else f" only ({res.get('thp_other_skipped')})"))
    for name, mr in res["models"].items():
        print(f"\n{name} ({mr['bytes'] / 2**20:.1f} MiB, {mr['tensors']} tensors)")
        for mt in [res["thp"]] + res.get("thp_other", []):
            if "error" in mt:
                print(f"  shmem THP {mt['mode']}: not measured: {mt['error']}")
                continue
            for way, t in mt[name].items():
                if not way.startswith("_"):
                    print(f"  warm into a module, THP {mt['mode']:7s} {way:45.45s} {t * 1e3:8.1f} ms")
        for way, t in mr["warm_state_s"].items():
            print(f"  warm state dict                  {way:45.45s} {t * 1e3:8.1f} ms")
        for way, t in mr.get("cold_s", {}).items():
            print(f"  cold into a module               {way:45.45s} {t * 1e3:8.1f} ms")
    print("\n  cairn / baseline  goal    met  what, vs baseline")
    for r in res["rows"]:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        print(f"  {r['ratio']:16.3g}  {r['goal'] or '-':7s} {met:4s} {r['name']}, vs {r['baseline']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
