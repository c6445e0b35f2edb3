#!/usr/bin/env python3
"""An ensemble in Parsl over cairn:// staging: N members each load one base model through
``cairn://base`` (a safetensors file made by the worker node's daemon), fine-tune its head on their
own synthetic data, and commit ``cairn://<run>/ft-i?parent=<run>/base``: only the head is stored again.

    eval "$(scripts/env)"; cairnd &
    python3 workflow/examples/ensemble_parsl.py                 # 4 members, 2 workers
    python3 workflow/examples/ensemble_parsl.py --members 16 --width 1024
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "api" / "python"))


def member(i: int, steps: int, inputs=(), outputs=()):  # noqa: B006 -- Parsl's signature
    """Runs on a worker: the staged base model in, the fine-tuned model out (as safetensors)."""
    import safetensors.torch as st
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(1)
    sd = st.load_file(inputs[0].filepath)                     # the model staged in from cairn
    body = {k: v for k, v in sd.items() if not k.startswith("head.")}
    head_w = sd["head.weight"].clone().requires_grad_(True)
    head_b = sd["head.bias"].clone().requires_grad_(True)
    g = torch.Generator().manual_seed(i)
    x = torch.randn(256, sd["body.weight"].shape[1], generator=g)
    y = torch.randint(0, head_w.shape[0], (256,), generator=g)
    feats = torch.relu(x @ body["body.weight"].T + body["body.bias"])
    opt = torch.optim.SGD([head_w, head_b], lr=0.1)
    for _ in range(steps):
        loss = F.cross_entropy(feats @ head_w.T + head_b, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd["head.weight"], sd["head.bias"] = head_w.detach(), head_b.detach()
    st.save_file(sd, outputs[0].filepath)                     # committed by the staging after return
    return float(loss)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--width", type=int, default=512, help="the base model's body is width x width")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--durability", default="memory", choices=["memory", "local", "global"])
    args = ap.parse_args(argv)

    import numpy as np

    import cairn
    import cairn.parsl

    try:
        client = cairn.connect()
    except cairn.CairnError as e:
        print(f"ensemble_parsl: {e}", file=sys.stderr)
        return 2
    here = str(Path(__file__).resolve().parent)
    os.environ["CAIRN_SOCKET"] = client.address
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "api" / "python"), here, os.environ.get("PYTHONPATH")]))
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    sys.path.insert(0, here)
    import ensemble_parsl as me  # the app by reference, not __main__

    import parsl
    from parsl.config import Config
    from parsl.data_provider.data_manager import default_staging
    from parsl.data_provider.files import File
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    run = time.strftime("ens-%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    rng = np.random.default_rng(0)
    w, classes = args.width, 10
    client.save_model(f"{run}/base", {"body.weight": rng.standard_normal((w, w), np.float32) / np.sqrt(w),
                                      "body.bias": np.zeros(w, np.float32),
                                      "head.weight": rng.standard_normal((classes, w), np.float32) * 0.01,
                                      "head.bias": np.zeros(classes, np.float32)}, wait=True)
    before = client.stats()["repository"]["physical_bytes"]
    work = tempfile.mkdtemp(prefix="ensemble-parsl-")
    dfk = parsl.load(Config(executors=[HighThroughputExecutor(
        label="htex", max_workers_per_node=args.workers, cores_per_worker=1,
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
        storage_access=[cairn.parsl.CairnStaging(), *default_staging])], run_dir=os.path.join(work, "runinfo"),
        strategy="none"))
    try:
        app = parsl.python_app(me.member, executors=["htex"])
        t0 = time.perf_counter()
        futs = [app(i, args.steps, inputs=[File(f"cairn://{run}/base")],
                    outputs=[File(f"cairn://{run}/ft-{i}?parent={run}/base&durability={args.durability}")])
                for i in range(args.members)]
        losses = [f.result() for f in futs]
        for f in futs:
            f.outputs[0].result()
        seconds = time.perf_counter() - t0
    finally:
        dfk.cleanup()
        parsl.clear()
        shutil.rmtree(work, ignore_errors=True)
    client.flush()
    grown = client.stats()["repository"]["physical_bytes"] - before
    base_bytes = client.show(f"{run}/base").get("logical_bytes", 0)
    ok = all(client.lineage(f"{run}/ft-{i}")["ancestors"] == [f"{run}/base"] for i in range(args.members))
    print(f"{args.members} members fine-tuned {run}/base in {seconds:.1f} s (final losses "
          f"{', '.join(f'{x:.3f}' for x in losses)}); repository grew by {grown} bytes for {args.members} models "
          f"(base {base_bytes} bytes); lineage {'ok' if ok else 'WRONG'}")
    client.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
