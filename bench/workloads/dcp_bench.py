"""torch.distributed.checkpoint on cairn (cairn.dcp) beside DCP's own FileSystemWriter/Reader, on
the same node and filesystem, in the same run, on 1 and 2 ranks (gloo).

The state is GPT-2-medium-sized (24 layers, d=1024, vocab 50257, context 1024: 355 M F32
parameters) with its Adam state (exp_avg, exp_avg_sq and a step per parameter): 4.26 GB in all,
1168 tensors. One rank holds all of it as plain tensors; two ranks hold it as FSDP does, every
tensor row-sharded (DTensor, Shard(0)), 2.13 GB each. ``--quick``: 4 layers, d=256, vocab 8192
(66 MB), every part as below.

Measured, each against its baseline in the same run:
- ``dcp.save`` at durability ``memory``: the time the ranks block (until the slowest returns), against
  ``FileSystemWriter(path)`` with its defaults (sync_files=True, one thread), taking turns going first.
  The first save is reported apart: the client then writes arena pages it has never touched, and with
  4 KiB pages mapping them costs it about 0.3 s per GB here. After it, each rank's client maps the
  rest of the arena once (``map_arena``: as a job's client that has checkpointed for a while has),
  then ``--repeats`` (2) more saves, their median the goal's figure. Before each save every 16 MiB
  chunk of the state changes, as a training step changes it, so nothing is deduplicated; after it
  the daemon's flush to the repository and the kernel's writeback finish, outside the timings.
- ``dcp.load`` of the last of those checkpoints, warm, into the state dict in place (one copy into
  each tensor; each rank loads its own shards): cairn with the checkpoint in the daemon's memory,
  FileSystemReader with its files read once (in the page cache); the first load (the client maps the
  arena pages it reads) apart from ``--repeats`` more. One rank also loads with
  ``ZeroCopyLoadPlanner`` (no copy: the state dict's tensors become views of the arena).
- ``dcp.async_save`` with the CairnWriter as its stager, ``--repeats`` times: the time it blocks,
  against a copy of the rank's tensors into buffers allocated and touched beforehand (torch's copy_,
  the same threads), timed just before it in each repeat; FileSystemWriter's own stager once beside it.
- a checkpoint series: 10 saves, between them 0.9% of the parameters (the last block's attention
  input projection, and the final layer norm: a fine-tuning run with the other layers frozen) and
  their Adam state change: bytes the repository grew by (``repository.physical_bytes``) against the
  FileSystemWriter checkpoint directories. FileSystemWriter writes ``--series-fs`` of them (2; in
  ``--quick`` all 10), each measured and deleted (the disk holds one at a time); the others count
  at the size of the last (it stores each whole).
- ``dcp.load`` cold: the driver restarts the daemon on its repository (its memory empty), then the page
  cache is dropped (``drop_caches`` as root, else ``posix_fadvise(DONTNEED)`` on the files; the row
  says which) before each backend's load.
Every load is checked against a digest of what was saved; a mismatch exits non-zero. A rank's
threads: the cores / the ranks.

Usage: dcp_bench.py [--quick] [--ranks 1,2] [--repeats N] [--series N] [--series-fs N] [--dir DIR] --json FILE
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GOALS = {"save": "<= 0.2", "async": "<= 1.2", "series": "<= 0.2", "warm": f"<= {1 / 3:.4f}", "cold": f"<= {1 / 0.9:.4f}"}


# ---- the state ----

def gpt2_shapes(n_layer, d, vocab, ctx=1024):
    s = {"wte.weight": (vocab, d), "wpe.weight": (ctx, d)}
    for i in range(n_layer):
        p = f"h.{i}."
        s.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                  p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                  p + "ln_2.weight": (d,), p + "ln_2.bias": (d,), p + "mlp.c_fc.weight": (d, 4 * d),
                  p + "mlp.c_fc.bias": (4 * d,), p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    s.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return s


def trainable(shapes, n_layer):
    """The tensors a fine-tuning run with frozen layers updates: the last block's attention input
    projection and the final layer norm (0.9% of GPT-2 medium's parameters)."""
    last = f"h.{n_layer - 1}.attn.c_attn."
    return [n for n in shapes if n.startswith(last) or n.startswith("ln_f.")]


def rows_of(shape, rank, world):
    """The rows of a dim-0 shard as DTensor's Shard(0) deals them (torch.chunk: ceil-sized first)."""
    n = shape[0]
    step = -(-n // world)
    lo = min(n, rank * step)
    return lo, min(n, lo + step)


def build_state(shapes, rank, world, mesh, fill=True):
    """{"model": name -> tensor, "optim": {"state": name -> {step, exp_avg, exp_avg_sq}, "param_groups"}},
    row-sharded DTensors over ``mesh`` on several ranks, filled with seeded uniform noise (with
    ``fill``; else left as allocated, to be loaded into)."""
    import torch
    g = torch.Generator().manual_seed(1234 + rank)

    def tensor(shape, scale):
        rows = shape if world == 1 else (rows_of(shape, rank, world)[1] - rows_of(shape, rank, world)[0],) + \
            tuple(shape[1:])
        local = torch.empty(rows)
        if fill:
            local.uniform_(-scale, scale, generator=g)
        if world == 1:
            return local
        from torch.distributed.tensor import DTensor, Shard
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride())

    model = {n: tensor(s, 0.02) for n, s in shapes.items()}
    state = {n: {"step": torch.tensor(1000.0), "exp_avg": tensor(s, 1e-3), "exp_avg_sq": tensor(s, 1e-6)}
             for n, s in shapes.items()}
    groups = [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
               "params": list(shapes)}]
    return {"model": model, "optim": {"state": state, "param_groups": groups}}


def locals_of(state):
    """(path, local tensor) of every tensor of the state, in a fixed order."""
    import torch
    out = []

    def walk(obj, path):
        if isinstance(obj, dict):
            for k in obj:
                walk(obj[k], f"{path}.{k}" if path else k)
        elif hasattr(obj, "to_local"):
            out.append((path, obj.to_local()))
        elif isinstance(obj, torch.Tensor):
            out.append((path, obj))
    walk(state, "")
    return out


def digest(state):
    """Per tensor, the sum of its 32-bit words (wrapping): equal states, equal digests."""
    import torch
    out = []
    for _, t in locals_of(state):
        b = t.detach().reshape(-1).view(torch.uint8)
        words = b.view(torch.int32) if b.numel() % 4 == 0 else b
        out.append(int(words.sum(dtype=torch.int64)))
    return out


def perturb(state, names=None):
    """Changes every 16 MiB chunk of the named tensors (all when None) and their Adam state, in place:
    what a training step does to the bytes, at a fraction of its cost; with ``names``, every element."""
    import torch
    with torch.no_grad():
        for path, t in locals_of(state):
            if path.startswith("optim.state."):
                fqn = path[len("optim.state."):].rsplit(".", 1)[0]  # the parameter of an Adam tensor
            else:
                fqn = path[len("model."):]
            if names is None:
                t.view(-1)[::1 << 22].add_(1.0)
            elif fqn in names:
                t.mul_(0.999).add_(1e-6)


# ---- one rank ----

def worker(a):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import warnings
    from datetime import timedelta
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    import cairn
    from bench_daemon import drop_caches
    from cairn.dcp import CairnReader, CairnWriter, ZeroCopyLoadPlanner

    warnings.simplefilter("ignore")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=1800))
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
    shapes = gpt2_shapes(a.layers, a.d, a.vocab)
    state = build_state(shapes, rank, world, mesh)
    mine = sum(t.numel() * t.element_size() for _, t in locals_of(state))
    work = Path(a.dir)
    c = cairn.connect()
    out = {"ranks": world, "params": sum(int(torch.Size(s).numel()) for s in shapes.values()),
           "bytes_per_rank": dist_max(mine), "bytes": dist_sum(mine), "tensors": len(locals_of(state))}

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        r = fn()
        return dist_max(time.perf_counter() - t0), r

    def fs_dir(name):
        return work / "fs" / name

    def check(name, want):
        got = digest(state)
        if got != want:
            bad = [p for (p, _), x, y in zip(locals_of(state), got, want) if x != y]
            raise SystemExit(f"rank {rank}: {name}: the loaded state differs from the saved one in {len(bad)} "
                             f"tensors, e.g. {bad[:3]}")

    def scramble():
        with torch.no_grad():
            for _, t in locals_of(state):
                t.zero_()

    def map_arena():
        """Each rank's client maps the daemon's whole arena for writing once (space for 90% of it
        reserved and dropped, one rank after another), as the client of a job that has checkpointed
        for a while has: with 4 KiB pages, a client's first write to arena pages it has not touched
        yet costs it about 0.3 s per GB here (with shared-memory huge pages much less)."""
        cap = c.stats()["tiers"]["dram"]["capacity_bytes"]
        for r in range(world):
            dist.barrier()
            if r == rank:
                t0 = time.perf_counter()
                with c.model_create(f"map-arena-{rank}") as w:  # never committed: dropped at the end
                    w.reserve([64 << 20] * int(0.9 * cap // (64 << 20)))
                c.stats()  # the dropped reservation goes back to the daemon with this client's next request
                out["map_arena_s"] = time.perf_counter() - t0
        out["map_arena_s"] = dist_max(out["map_arena_s"])

    # -- dcp.save, blocking: cairn at memory vs FileSystemWriter (defaults); the client maps the
    #    arena after the first --
    out["save_cairn_s"], out["save_fs_s"] = [], []
    for rep in range(a.repeats + 1):
        if rep == 1:
            map_arena()
        perturb(state)
        saved = digest(state)
        runs = [("save_fs_s", lambda: dcp.save(state, storage_writer=FileSystemWriter(str(fs_dir(f"save{rep}"))))),
                ("save_cairn_s", lambda: dcp.save(state, storage_writer=CairnWriter(f"save{rep}", durability="memory",
                                                                                    client=c)))]
        for key, fn in (runs[::-1] if rep % 2 else runs):
            out[key].append(timed(fn)[0])
            if rank == 0:
                c.flush(timeout=1800)  # the daemon's writes to the repository finish outside the timings
            os.sync()
            dist.barrier()
        if rep < a.repeats and rank == 0:
            shutil.rmtree(fs_dir(f"save{rep}"), ignore_errors=True)
    last, last_digest = f"save{a.repeats}", saved

    # -- loads, warm: the checkpoint in the daemon's memory; the files in the page cache --
    for name in sorted(os.listdir(fs_dir(last))):
        with open(fs_dir(last) / name, "rb") as f:
            while f.read(64 << 20):
                pass
    out["load_warm_cairn_s"], out["load_warm_fs_s"] = [], []
    loads = [("load_warm_fs_s", lambda: dcp.load(state, storage_reader=FileSystemReader(str(fs_dir(last))))),
             ("load_warm_cairn_s", lambda: dcp.load(state, storage_reader=CairnReader(last, client=c)))]
    for rep in range(a.repeats + 1):  # the first apart: the client maps the arena pages it reads
        for key, fn in (loads[::-1] if rep % 2 else loads):
            scramble()
            out[key].append(timed(fn)[0])
            check(key, last_digest)
    if world == 1:
        fresh = {"model": {n: torch.empty(s) for n, s in shapes.items()},
                 "optim": {"state": {n: {"step": torch.tensor(0.0), "exp_avg": torch.empty(s),
                                         "exp_avg_sq": torch.empty(s)} for n, s in shapes.items()},
                           "param_groups": state["optim"]["param_groups"]}}
        t, _ = timed(lambda: dcp.load(fresh, storage_reader=CairnReader(last, client=c), planner=ZeroCopyLoadPlanner()))
        kept, state = state, fresh
        check("ZeroCopyLoadPlanner", last_digest)
        state = kept
        del fresh
        out["load_warm_cairn_zero_copy_s"] = [t]

    # -- dcp.async_save: blocking time vs a copy of the rank's tensors into buffers touched before,
    #    measured back to back in each repeat --
    buffers = [torch.empty_like(t) for _, t in locals_of(state)]
    for b, (_, t) in zip(buffers, locals_of(state)):
        b.copy_(t)
    out["memcpy_s"], out["async_cairn_s"], out["async_cairn_upload_s"] = [], [], []
    for rep in range(a.repeats):
        perturb(state)
        out["memcpy_s"].append(timed(lambda: [b.copy_(t) for b, (_, t) in zip(buffers, locals_of(state))])[0])
        blocked, fut = timed(lambda: dcp.async_save(state, storage_writer=CairnWriter(
            f"async{rep}", durability="memory", client=c)))
        t0 = time.perf_counter()
        (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
        out["async_cairn_s"].append(blocked)
        out["async_cairn_upload_s"].append(dist_max(time.perf_counter() - t0))
        if rank == 0:
            c.flush(timeout=1800)
        dist.barrier()
    del buffers
    # FileSystemWriter's own stager once (informational): its staging is what is measured, so the
    # files are not synced (they are deleted at once).
    blocked, fut = timed(lambda: dcp.async_save(state, storage_writer=FileSystemWriter(
        str(fs_dir("async")), sync_files=False)))
    (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
    out["async_fs_s"] = [blocked]
    dist.barrier()
    if rank == 0:
        shutil.rmtree(fs_dir("async"), ignore_errors=True)
    os.sync()

    # -- a series of fine-tuning checkpoints --
    names = trainable(shapes, a.layers)
    changed = sum(int(torch.Size(shapes[n]).numel()) for n in names)
    out["series_changed_fraction"] = changed / out["params"]
    out["series_saves"] = a.series
    before = c.stats()["repository"]["physical_bytes"] if rank == 0 else 0
    fs_sizes, parent = [], None
    out["series_cairn_s"], out["series_fs_s"] = [], []
    perturb(state)  # the series starts from new bytes
    for i in range(a.series):
        if i:
            perturb(state, names)
        if i < a.series_fs:
            # Bytes are what the series measures: the files are not synced (they are deleted at once).
            t, _ = timed(lambda: dcp.save(state, storage_writer=FileSystemWriter(str(fs_dir(f"series{i}")),
                                                                               sync_files=False)))
            out["series_fs_s"].append(t)
            dist.barrier()
            if rank == 0:
                fs_sizes.append(sum(p.stat().st_size for p in fs_dir(f"series{i}").rglob("*") if p.is_file()))
                shutil.rmtree(fs_dir(f"series{i}"), ignore_errors=True)
        t, _ = timed(lambda: dcp.save(state, storage_writer=CairnWriter(f"series{i}", parent=parent,
                                                                        durability="memory", client=c)))
        out["series_cairn_s"].append(t)
        parent = f"series{i}"
    if rank == 0:
        c.flush(timeout=1800)
        out["series_cairn_bytes"] = c.stats()["repository"]["physical_bytes"] - before
        # FileSystemWriter stores every checkpoint whole: the ones not written are counted at the
        # size of the last one written (the same tensors, the same sizes).
        out["series_fs_written"] = len(fs_sizes)
        out["series_fs_bytes"] = sum(fs_sizes) + (a.series - len(fs_sizes)) * fs_sizes[-1]

    # -- loads, cold: the driver restarts the daemon on its repository (its memory empty) --
    c.close()
    dist.barrier()
    if rank == 0:
        (work / "restart").write_text("")
    while not (work / "restarted").exists():
        time.sleep(0.05)
    c = cairn.connect()
    fs, repo = fs_dir(last), work / "repo"
    for key, files, fn in (("load_cold_fs_s", [p for p in fs.rglob("*") if p.is_file()],
                            lambda: dcp.load(state, storage_reader=FileSystemReader(str(fs)))),
                           ("load_cold_cairn_s", [p for p in repo.rglob("*") if p.is_file()],
                            lambda: dcp.load(state, storage_reader=CairnReader(last, client=c)))):
        scramble()
        dist.barrier()
        if rank == 0:
            out["cold_method"] = drop_caches(files)
        out[key] = [timed(fn)[0]]
        check(key, last_digest)
    c.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        Path(a.json).write_text(json.dumps(out))


def dist_max(x):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def dist_sum(x):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


# ---- the driver ----

def run_ranks(a, world, daemon, env):
    """Runs ``world`` ranks of this script under a gloo group; restarts ``daemon`` when they ask
    (before the cold loads); stops them by pid on a failure or timeout. Returns rank 0's report."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = Path(a.dir)
    part = work / "report.json"
    procs = []
    for rank in range(world):
        e = dict(env, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, __file__, "--role", "rank", "--dir", a.dir, "--json", str(part),
                                       "--layers", str(a.layers), "--d", str(a.d), "--vocab", str(a.vocab),
                                       "--repeats", str(a.repeats), "--series", str(a.series),
                                       "--series-fs", str(a.series_fs)], env=e))
    try:
        deadline = time.monotonic() + 3600
        restarted = False
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs):
                break
            if not restarted and (work / "restart").exists():
                daemon.stop()
                daemon.start()
                (work / "restarted").write_text("")
                restarted = True
            if time.monotonic() > deadline:
                raise SystemExit("dcp_bench: the ranks did not finish within an hour")
            time.sleep(0.05)
        bad = [p.returncode for p in procs if p.returncode]
        if bad:
            raise SystemExit(f"dcp_bench: a rank exited with {bad[0]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    return json.loads(part.read_text())


def rows(runs):
    def row(what, cairn, baseline_name, baseline, unit, goal):
        r = cairn / baseline if baseline else float("nan")
        met = None
        if goal:
            op, val = goal.split()
            met = r <= float(val) if op == "<=" else r >= float(val)
        return {"name": what, "value": cairn, "baseline": baseline_name, "baseline_value": baseline, "unit": unit,
                "ratio": r, "ratio_is": "cairn / baseline", "goal": goal, "met": met}

    out = []
    for r in runs:
        n = r["ranks"]
        who = f"{n} rank{'s' if n > 1 else ''} ({r['bytes_per_rank'] / 1e9:.2f} GB per rank)"
        med = {k: statistics.median(v) for k, v in r.items() if k.endswith("_s") and isinstance(v, list) and v}
        # The first save and the first load apart: the first time this rank's client writes (reads)
        # arena pages, it maps them (map_arena maps the rest after the first save); later repeats are
        # a run's steady state.
        later = {k: statistics.median(v[1:] or v) for k, v in r.items() if k.endswith("_s") and isinstance(v, list)
                 and v}
        first = "the first on the connection (the client maps the arena pages it touches)"
        fsw = "FileSystemWriter (sync_files=True, 1 thread)"
        out.append(row(f"dcp.save at durability memory, {who}, later saves (median): time the ranks block",
                       later["save_cairn_s"], fsw, later["save_fs_s"], "s", GOALS["save"]))
        out.append(row(f"dcp.save at durability memory, {who}, {first} (informational)", r["save_cairn_s"][0], fsw,
                       r["save_fs_s"][0], "s", None))
        mc = "memcpy of the rank's tensors (copy_ into buffers touched before)"
        out.append(row(f"dcp.async_save with CairnWriter as stager, {who} (median): time it blocks",
                       med["async_cairn_s"], mc, med["memcpy_s"], "s", GOALS["async"]))
        out.append(row(f"dcp.async_save, {who}: time it blocks (informational)", med["async_cairn_s"],
                       "FileSystemWriter's own stager", med["async_fs_s"], "s", None))
        written = r["series_fs_written"]
        fs_name = (f"the {r['series_saves']} FileSystemWriter checkpoint directories" +
                   ("" if written == r["series_saves"] else f" ({written} written, the others counted at the size of "
                                                            "the last: it stores each whole)"))
        out.append(row(f"checkpoint series, {who}: {r['series_saves']} saves, "
                       f"{100 * r['series_changed_fraction']:.1f}% of the parameters changed between saves: bytes "
                       "stored", r["series_cairn_bytes"], fs_name, r["series_fs_bytes"], "bytes", GOALS["series"]))
        fsr = "FileSystemReader (files in the page cache)"
        out.append(row(f"dcp.load warm, {who}, later loads (median)", later["load_warm_cairn_s"], fsr,
                       later["load_warm_fs_s"], "s", GOALS["warm"]))
        out.append(row(f"dcp.load warm, {who}, {first} (informational)", r["load_warm_cairn_s"][0], fsr,
                       r["load_warm_fs_s"][0], "s", None))
        if "load_warm_cairn_zero_copy_s" in med:
            out.append(row(f"dcp.load warm with ZeroCopyLoadPlanner, {who} (informational)",
                           med["load_warm_cairn_zero_copy_s"], fsr, later["load_warm_fs_s"], "s", None))
        if "load_cold_cairn_s" in med:
            out.append(row(f"dcp.load cold, {who}: daemon restarted, page cache dropped ({r['cold_method']})",
                           med["load_cold_cairn_s"], "FileSystemReader, page cache dropped", med["load_cold_fs_s"],
                           "s", GOALS["cold"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["driver", "rank"], default="driver")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--repeats", type=int, default=2, help="repeats of the save, load and async_save timings")
    ap.add_argument("--series", type=int, default=10, help="checkpoints in the fine-tuning series")
    ap.add_argument("--series-fs", type=int, default=2,
                    help="how many of them FileSystemWriter writes (the rest counted at the size of the last)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--dram", default="", help="the daemon's arena (default: 1.3x the state, at least 1 GiB)")
    ap.add_argument("--dir", help="where the repository and the checkpoint directories go (one filesystem)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.role == "rank":
        return worker(a)
    from bench_daemon import Daemon
    if a.quick:
        a.layers, a.d, a.vocab, a.repeats, a.series, a.series_fs = 4, 256, 8192, 2, 10, 10
    state_bytes = 3 * 4 * sum(int(__import__("math").prod(s)) for s in gpt2_shapes(a.layers, a.d, a.vocab).values())
    # The arena holds the checkpoint being written and some slack; the ones before it were flushed
    # to the repository, and their chunks make room as they are evicted.
    dram = a.dram or f"{max(1 << 30, int(1.3 * state_bytes)) >> 20}MiB"
    results = []
    parent = Path(a.dir) if a.dir else None
    for n in [int(x) for x in a.ranks.split(",")]:
        with tempfile.TemporaryDirectory(prefix="cairn-bench-dcp-", dir=parent) as tmp:
            a.dir = tmp
            (Path(tmp) / "fs").mkdir()
            env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // n)))
            d = Daemon(BUILD, Path(tmp), dram).start()
            try:
                env["CAIRN_SOCKET"] = d.socket
                r = run_ranks(a, n, d, env)
            finally:
                d.stop()
            results.append(r)
            print(json.dumps(r), flush=True)
    report = {"runs": results, "cores": os.cpu_count(), "quick": a.quick, "rows": rows(results)}
    Path(a.json).write_text(json.dumps(report, indent=1))
    for row in report["rows"]:
        met = {True: "met", False: "MISSED", None: ""}[row["met"]]
        print(f"{row['name']}: {row['value']:.4g} {row['unit']} vs {row['baseline']} {row['baseline_value']:.4g} "
              f"{row['unit']}: ratio {row['ratio']:.3g} (goal {row['goal'] or '-'}) {met}")


if __name__ == "__main__":
    main()
