#!/usr/bin/env python3
"""Regularized-evolution NAS in Parsl (HighThroughputExecutor) over cairn, compared in the same run
with the same workflow passing models as torch.save files in a directory.

    eval "$(scripts/env)"; cairnd &                  # a daemon (docs/python.md), or --start-daemon
    python3 workflow/examples/nas_parsl.py           # 24 candidates, 2 workers: well under a minute
    python3 workflow/examples/nas_parsl.py --large   # 96 candidates of wider MLPs

Each candidate is a Parsl app on a worker. A child asks cairn (``cairn.torch.transfer``, through the
worker node's daemon) for the stored model of this run whose architecture shares the longest prefix
with its own, copies those layers in and freezes them, trains the rest for a few steps on a small
synthetic classification task, and commits itself with that ancestor as parent (``cairn.torch.save``,
durability ``global``): only the layers it trained are stored. The file baseline does the same with
``torch.save`` files in a directory: the ancestor is found by scanning the run's (genome, score)
list, its file is loaded with ``torch.load``, and every candidate is written whole (+ fsync).

Search space: an MLP of ``--layers`` hidden layers, each of a width from WIDTHS; a mutation changes one
layer's width, so the layers before it keep their signatures (and weights) from the parent. Evolution
(Real et al., 2019): a population of the latest P finished candidates, tournaments of S, the oldest
dies; candidates run asynchronously, ``--workers`` at a time. In cairn mode the driver sends hints
(``cairn.parsl.hint``): the population with its scores and the tournament size whenever it
changes, and ``will_load`` for a child's parent
before the child is submitted (``--no-hints``: none).

The run ends with both modes' bytes stored and times, every candidate's stored model read back
and compared (per-tensor SHA-256 against what the app saved), and one line ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "api" / "python"))  # the in-tree package

Genome = Tuple[int, ...]


# ---- what runs on the workers (imports inside: the apps are shipped to other processes) ----

def _net(genome: Genome, d_in: int, classes: int) -> Any:
    from torch import nn

    layers: List[Any] = []
    c = d_in
    for w in genome:
        layers += [nn.Linear(c, w), nn.ReLU()]
        c = w
    layers.append(nn.Linear(c, classes))
    return nn.Sequential(*layers)


def _task(d_in: int, classes: int, seed: int) -> Tuple[Any, Any, Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(d_in, classes, generator=g)
    x = torch.randn(1024, d_in, generator=g)
    y = (x @ w_true + 0.3 * torch.randn(1024, classes, generator=g)).argmax(1)
    return x[:768], y[:768], x[768:], y[768:]


def _train(net: Any, steps: int, d_in: int, classes: int, seed: int) -> float:
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(1)
    xtr, ytr, xte, yte = _task(d_in, classes, 1234)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3) if params else None
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps if opt else 0):
        idx = torch.randint(0, xtr.shape[0], (128,), generator=g)
        loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((net(xte).argmax(1) == yte).float().mean())


def _digests(sd: Dict[str, Any]) -> Dict[str, str]:
    return {k: hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest() for k, v in sd.items()}


def _freeze(net: Any, transferred: Any) -> None:
    for name, p in net.named_parameters():
        if name in transferred:
            p.requires_grad_(False)


def candidate_cairn(mid: str, genome: Genome, run: str, steps: int, d_in: int, classes: int, seed: int) -> Dict[str, Any]:
    """A candidate whose ancestor comes from cairn and which is committed to cairn."""
    import time

    import torch

    import cairn.torch as ct

    torch.manual_seed(seed)
    net = _net(genome, d_in, classes)
    t0 = time.perf_counter()
    got = ct.transfer(net, where={"run": run})  # the worker node's daemon ($CAIRN_SOCKET)
    t_load = time.perf_counter() - t0
    parent = got["model"]
    if parent:
        _freeze(net, got["tensors"])
    acc = _train(net, steps, d_in, classes, seed)
    t0 = time.perf_counter()
    ct.save(net, mid, parent=parent, meta={"run": run, "score": acc, "genome": list(genome)})  # waits for "global"
    t_save = time.perf_counter() - t0
    return {"id": mid, "parent": parent, "score": acc, "load_s": t_load, "save_s": t_save,
            "transferred": len(got["tensors"]), "digests": _digests(net.state_dict())}


def candidate_files(mid: str, genome: Genome, run: str, steps: int, d_in: int, classes: int, seed: int,
                    directory: str, ancestor: Optional[Tuple[str, Genome]]) -> Dict[str, Any]:
    """The same candidate, with models as torch.save files in ``directory``."""
    import os
    import time

    import torch

    torch.manual_seed(seed)
    net = _net(genome, d_in, classes)
    t0 = time.perf_counter()
    transferred: List[str] = []
    if ancestor is not None:
        aid, agenome = ancestor
        sd = torch.load(os.path.join(directory, aid.replace("/", "_") + ".pt"), weights_only=True)
        own = net.state_dict()
        # Linear layer i sits at index 2*i; it matches while every width up to it matches.
        k = 0
        while k < min(len(genome), len(agenome)) and genome[k] == agenome[k]:
            k += 1
        for i in range(k):
            for s in ("weight", "bias"):
                name = f"{2 * i}.{s}"
                own[name] = sd[name]
                transferred.append(name)
        net.load_state_dict(own)
        _freeze(net, transferred)
    t_load = time.perf_counter() - t0
    acc = _train(net, steps, d_in, classes, seed)
    t0 = time.perf_counter()
    path = os.path.join(directory, mid.replace("/", "_") + ".pt")
    torch.save(net.state_dict(), path + ".tmp")
    with open(path + ".tmp", "rb+") as f:
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    t_save = time.perf_counter() - t0
    return {"id": mid, "parent": ancestor[0] if ancestor else None, "score": acc, "load_s": t_load, "save_s": t_save,
            "transferred": len(transferred), "digests": _digests(net.state_dict()), "bytes": os.path.getsize(path)}


# ---- the search (submit side) ----

def mutate(g: Genome, widths: Tuple[int, ...], rng: random.Random) -> Genome:
    s = list(g)
    i = rng.randrange(len(s))
    s[i] = rng.choice([w for w in widths if w != s[i]])
    return tuple(s)


def best_ancestor_scan(genome: Genome, archive: List[Tuple[str, Genome, float]]) -> Optional[Tuple[str, Genome]]:
    """The files baseline's ancestor: scan every finished candidate for the longest matching prefix."""
    best, best_key = None, (0, -1.0)
    for mid, g, score in archive:
        k = 0
        while k < min(len(g), len(genome)) and g[k] == genome[k]:
            k += 1
        if k > 0 and (k, score) > best_key:
            best, best_key = (mid, g), (k, score)
    return best


def evolve(mode: str, args: argparse.Namespace, run: str, apps: Dict[str, Any], directory: str,
           hint: Optional[Any] = None) -> Dict[str, Any]:
    """Runs the search. ``hint(kind, models)`` (cairn mode, unless --no-hints) tells cairn the live
    population whenever it changes and, before a child is submitted, that its parent will be read
    next, so the daemon stages the parent while the task is shipped and keeps the population's
    chunks ahead of the rest when it evicts."""
    rng = random.Random(args.seed)  # same genomes and seeds in both modes
    widths = tuple(args.widths)
    population: List[Tuple[str, Genome, float]] = []  # the latest P finished
    archive: List[Tuple[str, Genome, float]] = []
    results: List[Dict[str, Any]] = []
    running: Dict[cf.Future, Tuple[str, Genome]] = {}
    submitted = 0
    t0 = time.perf_counter()

    def submit(genome: Genome) -> None:
        nonlocal submitted
        mid = f"nas-parsl/{run}/{mode}/c{submitted:03d}"
        seed = args.seed * 1000 + submitted
        common = (mid, genome, run, args.steps, args.inputs, args.classes, seed)
        if mode == "cairn":
            fut = apps["cairn"](*common)
        else:
            fut = apps["files"](*common, directory, best_ancestor_scan(genome, archive))
        running[fut] = (mid, genome)
        submitted += 1

    while submitted < min(args.population, args.candidates):
        submit(tuple(rng.choice(widths) for _ in range(args.layers)))
    while running:
        done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
        for fut in done:
            mid, genome = running.pop(fut)
            r = fut.result()
            results.append(r)
            population.append((mid, genome, r["score"]))
            archive.append((mid, genome, r["score"]))
            if len(population) > args.population:
                population.pop(0)  # the oldest dies
            if submitted < args.candidates:
                contenders = rng.sample(population, min(args.sample, len(population)))
                parent = max(contenders, key=lambda c: c[2])
                if hint is not None:
                    # With each member's score and the tournament size, the daemon weighs each
                    # member's chunks by its chance to win the next tournament.
                    hint("population", [c[0] for c in population], scores=[c[2] for c in population],
                         tournament=args.sample)
                    hint("will_load", [parent[0]])
                submit(mutate(parent[1], widths, rng))
    return {"results": results, "seconds": time.perf_counter() - t0}


def read_back(mode: str, results: List[Dict[str, Any]], directory: str, client: Any) -> int:
    """How many candidates' stored models equal, tensor by tensor, what their app saved."""
    import hashlib

    import numpy as np
    import torch

    exact = 0
    for r in results:
        if mode == "cairn":
            arrays = client.load_model(r["id"])  # zero-copy views of the daemon's arena
            got = {k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for k, a in arrays.items()}
            del arrays
        else:
            sd = torch.load(os.path.join(directory, r["id"].replace("/", "_") + ".pt"), weights_only=True)
            got = _digests(sd)
        exact += got == r["digests"]
    return exact


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=24, help="candidates per mode (default 24)")
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--sample", type=int, default=3, help="tournament size")
    ap.add_argument("--layers", type=int, default=4, help="hidden layers")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 192])
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="training steps per candidate")
    ap.add_argument("--workers", type=int, default=2, help="HTEX workers (local provider)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--large", action="store_true", help="96 candidates, widths 128..512, 60 steps, 6 layers")
    ap.add_argument("--socket", help="the daemon's socket (default: $CAIRN_SOCKET, else the default)")
    ap.add_argument("--start-daemon", action="store_true", help="start a per-user daemon if none runs (cairn.parsl.ensure_daemon)")
    ap.add_argument("--dir", help="where the torch.save files go (default: a temporary directory, removed)")
    ap.add_argument("--modes", default="cairn,files", help="comma-separated: cairn, files")
    ap.add_argument("--run-dir", help="Parsl's run directory (default: a temporary directory)")
    ap.add_argument("--no-hints", action="store_true", help="cairn mode without population/will_load hints")
    args = ap.parse_args(argv)
    if args.large:
        args.candidates, args.widths, args.steps, args.layers = 96, [128, 256, 384, 512], 60, 6

    import cairn
    import cairn.parsl

    # Find the daemon now: with none (and no --start-daemon), fail at once naming the socket.
    if args.socket:
        os.environ["CAIRN_SOCKET"] = args.socket
    try:
        if args.start_daemon:
            os.environ["CAIRN_SOCKET"] = cairn.parsl.ensure_daemon()
        client = cairn.connect()
    except (cairn.CairnError, cairn.parsl.CairnStagingError) as e:
        print(f"nas_parsl: {e}", file=sys.stderr)
        return 2
    os.environ["CAIRN_SOCKET"] = client.address  # the workers (local provider) inherit it
    # The workers import cairn and run Parsl's scripts from this interpreter's bin directory.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "api" / "python"), here, os.environ.get("PYTHONPATH")]))
    # The apps are this file's functions imported as the module nas_parsl (pickled by reference;
    # functions of __main__ would be shipped without the helpers they call).
    sys.path.insert(0, here)
    import nas_parsl as me
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

    import parsl
    from parsl.config import Config
    from parsl.data_provider.data_manager import default_staging
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    work = tempfile.mkdtemp(prefix="nas-parsl-")
    directory = args.dir or os.path.join(work, "files")
    os.makedirs(directory, exist_ok=True)
    run = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    config = Config(
        executors=[HighThroughputExecutor(
            label="htex", max_workers_per_node=args.workers, cores_per_worker=1,
            provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
            storage_access=[cairn.parsl.CairnStaging(), *default_staging])],
        run_dir=args.run_dir or os.path.join(work, "runinfo"), strategy="none")
    t_start = time.perf_counter()
    dfk = parsl.load(config)
    out: Dict[str, Any] = {"run": run, "candidates": args.candidates, "workers": args.workers}
    try:
        apps = {"cairn": parsl.python_app(me.candidate_cairn, executors=["htex"]),
                "files": parsl.python_app(me.candidate_files, executors=["htex"])}
        # Warm the workers up (imports) so that neither mode pays for it.
        parsl.python_app(lambda: __import__("torch").zeros(1).sum().item(), executors=["htex"])().result()
        out["startup_s"] = time.perf_counter() - t_start
        for mode in args.modes.split(","):
            before_stats = client.stats()
            before = before_stats["repository"]
            hint = None if mode != "cairn" or args.no_hints else cairn.parsl.hint
            r = evolve(mode, args, run, apps, directory, hint)
            res = r["results"]
            m: Dict[str, Any] = {"seconds": r["seconds"], "save_s": sum(x["save_s"] for x in res),
                                 "load_s": sum(x["load_s"] for x in res),
                                 "transfers": sum(1 for x in res if x["parent"]),
                                 "best_score": max(x["score"] for x in res)}
            if mode == "cairn":
                after_stats = client.stats()
                after = after_stats["repository"]
                # What the hints did on this node's daemon (docs/policy.md, "The prefetcher").
                m["hints"] = {k: after_stats.get("prefetch", {}).get(k, 0) - before_stats.get("prefetch", {}).get(k, 0)
                              for k in ("hints", "unknown_models", "chunks_staged", "chunks_used", "chunks_wasted")}
                m["stored_bytes"] = after["physical_bytes"] - before["physical_bytes"]
                m["logical_bytes"] = after["logical_bytes"] - before["logical_bytes"]
                lineage_ok = all((client.lineage(x["id"], depth=1)["ancestors"] or [None])[0] == x["parent"] for x in res)
                m["lineage_ok"] = lineage_ok
            else:
                m["stored_bytes"] = sum(x["bytes"] for x in res)
            m["read_back_exact"] = read_back(mode, res, directory, client)
            out[mode] = m
    finally:
        dfk.cleanup()
        parsl.clear()
        client.close()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    def mb(n: int) -> str:
        return f"{n / 2**20:.2f} MiB"

    for mode in ("cairn", "files"):
        if mode in out:
            m = out[mode]
            extra = f" (logical {mb(m['logical_bytes'])}, lineage {'ok' if m['lineage_ok'] else 'WRONG'})" if mode == "cairn" else ""
            if mode == "cairn":
                h = m["hints"]
                extra += (f"; {h['hints']} hints ({h['unknown_models']} unknown ids), prefetched chunks "
                          f"{h['chunks_staged']} staged, {h['chunks_used']} used, {h['chunks_wasted']} wasted")
            print(f"{mode:5s}: {args.candidates} candidates in {m['seconds']:.1f} s, stored {mb(m['stored_bytes'])}{extra}; "
                  f"saves {m['save_s']:.2f} s, ancestor loads {m['load_s']:.2f} s in all; {m['transfers']} started from an "
                  f"ancestor; best score {m['best_score']:.3f}; read back exact: {m['read_back_exact']}/{args.candidates}")
    if "cairn" in out and "files" in out:
        c, f = out["cairn"], out["files"]
        print(f"files/cairn: bytes stored {f['stored_bytes'] / max(1, c['stored_bytes']):.2f}x, "
              f"workflow time {f['seconds'] / c['seconds']:.2f}x (Parsl startup {out['startup_s']:.1f} s, not counted)")
    print("RESULT " + json.dumps(out, sort_keys=True))
    ok = all(out[m]["read_back_exact"] == args.candidates for m in ("cairn", "files") if m in out)
    return 0 if ok and out.get("cairn", {}).get("lineage_ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
