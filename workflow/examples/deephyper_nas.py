#!/usr/bin/env python3
"""A DeepHyper architecture search whose candidates start from their best stored ancestor in cairn.

DeepHyper's regularized evolution proposes MLP architectures (depth and widths); each evaluation,
in one of DeepHyper's worker processes, builds its candidate, asks cairn for the stored model that
shares the longest upstream prefix of its architecture graph (cairn.torch.transfer), tells the
daemon it will load that ancestor (a will_load hint), copies the matching layers in and freezes
them, trains the rest briefly on a fixed synthetic task, and saves the candidate with that ancestor
as its parent and its score in the metadata, so only the layers it trained are stored. After each
evaluation the driver sends the daemon the live population with its objectives and the tournament
size (a population hint with scores).

    eval "$(scripts/env)"; cairnd &                         # a daemon (docs/python.md)
    python3 workflow/examples/deephyper_nas.py              # 16 evaluations, 4 workers, < 2 min on 2 cores
    python3 workflow/examples/deephyper_nas.py --evals 8 --workers 4 --socket /path/cairnd.sock

Every architecture has the same stem (Linear(20, 32)), so once the seed candidate (the problem's
default configuration, evaluated before the search) is stored, every candidate has an ancestor.
Prints one line per candidate (id, parent, score, layers transferred, time to first batch) and,
last, DeepHyper's results table.
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "api" / "python"))  # the in-tree package

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402

FEATURES, STEM, CLASSES, MAX_LAYERS = 20, 32, 4, 4
WIDTHS = [16, 32, 48, 64]
SAMPLES, SEED = 400, 0

_client: Optional[cairn.Client] = None  # one connection per worker process (never shared across a fork)
_client_pid = 0
_data: Optional[tuple] = None


def problem() -> Any:
    """The search space: the number of hidden layers after the stem and each one's width."""
    from deephyper.hpo import HpProblem
    p = HpProblem()
    p.add_hyperparameter((1, MAX_LAYERS), "layers", default_value=2)
    for i in range(MAX_LAYERS):
        p.add_hyperparameter(WIDTHS, f"units_{i}", default_value=32)
    return p


def build(config: Dict[str, Any]) -> nn.Sequential:
    """The candidate: the fixed stem, config["layers"] hidden Linear+ReLU layers, a linear head."""
    mods: List[nn.Module] = [nn.Linear(FEATURES, STEM), nn.ReLU()]
    width = STEM
    for i in range(int(config["layers"])):
        w = int(config[f"units_{i}"])
        mods += [nn.Linear(width, w), nn.ReLU()]
        width = w
    mods.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*mods)


def dataset() -> tuple:
    """A fixed learnable task: labels from a random teacher network over Gaussian inputs."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 16, generator=g), torch.randn(16, CLASSES, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(1)
    split = SAMPLES * 4 // 5
    return x[:split], y[:split], x[split:], y[split:]


def evaluate(job: Any, socket: Optional[str] = None, prefix: str = "deephyper/", epochs: int = 4,
             freeze: bool = True) -> Dict[str, Any]:
    """DeepHyper's run function: one candidate, from ancestor lookup to save. Returns the objective
    (validation accuracy) and, as DeepHyper metadata, the model id, its parent, the layers
    transferred and the time to first batch (seconds from the start of the evaluation to the end of
    the first training step, ancestor lookup and layer transfer included)."""
    try:
        return _evaluate(job, socket, prefix, epochs, freeze)
    except Exception as e:  # crosses the process pool as text: cairn.CairnError does not pickle
        raise RuntimeError(f"candidate {job.id}: {type(e).__name__}: {e}") from None


def _evaluate(job: Any, socket: Optional[str], prefix: str, epochs: int, freeze: bool) -> Dict[str, Any]:
    global _client, _client_pid, _data
    t_start = time.perf_counter()
    if _client is None or _client_pid != os.getpid():
        torch.set_num_threads(1)
        _client, _client_pid = cairn.connect(socket), os.getpid()
    if _data is None:
        _data = dataset()
    c = _client
    config = dict(job.parameters)
    model_id = f"{prefix}c{str(job.id).replace('.', '-')}"
    torch.manual_seed(SEED)
    model = build(config)

    where = {"search": prefix}
    parent = None
    transferred: Dict[str, str] = {}
    ans = c.best_ancestor(ct.architecture(model), where)
    if ans.get("model"):
        c.hint("will_load", [ans["model"]], when="next")  # the policy keeps or stages its chunks
        got = ct.transfer(model, client=c, where=where)
        if got["model"]:
            parent, transferred = got["model"], got["tensors"]
    if freeze:
        for key, p in model.named_parameters():
            if key in transferred:
                p.requires_grad_(False)

    xtr, ytr, xte, yte = _data
    params = [p for p in model.parameters() if p.requires_grad]
    ttfb = None
    if params:
        opt = torch.optim.Adam(params, lr=1e-2)
        g = torch.Generator().manual_seed(SEED)
        for _ in range(epochs):
            model.train()
            perm = torch.randperm(len(xtr), generator=g)
            for i in range(0, len(xtr), 64):
                idx = perm[i:i + 64]
                opt.zero_grad()
                F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                opt.step()
                if ttfb is None:
                    ttfb = time.perf_counter() - t_start
    if ttfb is None:
        ttfb = time.perf_counter() - t_start
    model.eval()
    with torch.no_grad():
        score = float((model(xte).argmax(1) == yte).float().mean())

    ct.save(model, model_id, parent=parent, client=c,
            meta={"search": prefix, "score": score, "config": {k: int(v) for k, v in config.items()}})
    layers = sorted({k.rsplit(".", 1)[0] for k in transferred})
    return {"objective": score,
            "metadata": {"model": model_id, "parent": parent or "", "transferred": ",".join(layers),
                         "ttfb_s": ttfb}}


class _Seed:
    """The job DeepHyper would pass, for the seed candidate evaluated before the search."""

    def __init__(self, parameters: Dict[str, Any]) -> None:
        self.id, self.parameters = "seed", parameters


def report(out: Dict[str, Any], score: float) -> None:
    m = out["metadata"] if "metadata" in out else out
    print(f"  {m['model']:32} parent {m['parent'] or '-':32} score {score:.3f}  "
          f"transferred [{m['transferred']}]  first batch {m['ttfb_s'] * 1e3:6.1f} ms", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evals", type=int, default=16, help="evaluations of the search (after the seed)")
    ap.add_argument("--workers", type=int, default=4, help="DeepHyper worker processes")
    ap.add_argument("--socket", help="cairnd's socket (default: $CAIRN_SOCKET, else the per-user default)")
    ap.add_argument("--prefix", help="model id prefix of this search (default: deephyper/<time>-<pid>/)")
    ap.add_argument("--epochs", type=int, default=4, help="training epochs per candidate")
    ap.add_argument("--population", type=int, default=8, help="regularized evolution's population size")
    ap.add_argument("--no-freeze", action="store_true", help="also train the transferred layers")
    ap.add_argument("--log-dir", default=None, help="DeepHyper's log directory (default: a temporary one)")
    args = ap.parse_args()
    try:
        from deephyper.evaluator import Evaluator
        from deephyper.evaluator.callback import Callback
        from deephyper.hpo import RegularizedEvolution
    except ImportError as e:
        print(f"deephyper is not installed ({e}): pip install -r requirements.txt", file=sys.stderr)
        return 2
    import tempfile

    prefix = args.prefix or f"deephyper/{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}/"
    kwargs = {"socket": args.socket, "prefix": prefix, "epochs": args.epochs, "freeze": not args.no_freeze}
    client = cairn.connect(args.socket)
    physical0 = client.stats()["repository"]["physical_bytes"]
    t0 = time.perf_counter()
    print(f"search {prefix}: {args.evals} evaluations, {args.workers} worker processes, "
          f"regularized evolution (population {args.population})", flush=True)

    # The seed: the default configuration, stored first, so that every candidate has an ancestor.
    seed = evaluate(_Seed(dict(problem().default_configuration)), **kwargs)
    report(seed, seed["objective"])

    class Population(Callback):
        """Sends the daemon the latest population (regularized evolution draws parents from it)."""

        def __init__(self) -> None:
            # (model, objective): the latest `population` models and their scores.
            self.live: "collections.deque[tuple]" = collections.deque(
                [(seed["metadata"]["model"], seed["objective"])], maxlen=args.population)

        def on_done(self, job: Any) -> None:
            if job.metadata.get("model"):
                report(job.metadata, job.objective)
                self.live.append((job.metadata["model"], job.objective))
                ids = [m for m, _ in self.live]
                scores = [o for _, o in self.live]
                if all(isinstance(o, (int, float)) and math.isfinite(o) for o in scores):
                    # Each member's chance to win a tournament of 3 (the search's sample_size)
                    # weighs its chunks in the daemon's eviction order.
                    client.hint("population", ids, scores=[float(o) for o in scores], tournament=3)
                else:  # a failed evaluation's objective is not a number: no scores
                    client.hint("population", ids)

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="deephyper-")
    evaluator = Evaluator.create(evaluate, method="process",
                                 method_kwargs={"num_workers": args.workers, "run_function_kwargs": kwargs,
                                                "callbacks": [Population()]})
    search = RegularizedEvolution(problem(), random_state=SEED, log_dir=log_dir,
                                  population_size=args.population, sample_size=3)
    results = search.search(evaluator, max_evals=args.evals, max_evals_strict=True)  # closes the evaluator

    cols = [c for c in ("p:layers", "objective", "m:model", "m:parent", "m:transferred", "m:ttfb_s")
            if c in results.columns]
    print("\nDeepHyper results:")
    print(results[cols].to_string(index=False))
    best = results.loc[results["objective"].astype(float).idxmax()]
    physical = client.stats()["repository"]["physical_bytes"] - physical0
    print(f"\n{len(results) + 1} candidates in {time.perf_counter() - t0:.1f} s; best {best['m:model']} "
          f"score {float(best['objective']):.3f}; repository grew {physical / 2**10:.1f} KiB; "
          f"results in {log_dir}/results.csv")
    lineage = client.lineage(best["m:model"])
    print("lineage of the best: " + " <- ".join([best["m:model"]] + lineage["ancestors"]))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
