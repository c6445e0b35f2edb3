"""The trainer side of the coupled example (docs/coupled.md): polls the fields the heat simulation
(heat.c) publishes as named tensors heat/<step>/<rank>, learns online a surrogate that predicts the
field `every` steps ahead (one 5x5 convolution), and every few new pairs commits it as model
surrogate-v<n> with parent surrogate-v<n-1> (only its two tensors; the lineage is the training
history) and sets the named tensor surrogate/latest = n for the simulation to load.

    python3 trainer.py --ranks 2 [--every 5] [--commit-every 3] [--timeout 120]
"""
import argparse
import time

import numpy as np
import torch

import cairn
import cairn.torch


class Surrogate(torch.nn.Module):
    def __init__(self, k=5):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 1, k, padding=k // 2)

    def forward(self, x):
        return self.conv(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--commit-every", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--prefix", default="surrogate")
    a = ap.parse_args()
    c = cairn.connect()
    torch.manual_seed(0)
    model = Surrogate()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    pairs = []
    prev = None
    version, parent = 0, None
    step, deadline = 0, time.monotonic() + a.timeout
    c.put_tensor("trainer/ready", np.array(1, dtype=np.int64))
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        keys = ["heat/%d/%d" % (step, r) for r in range(a.ranks)]
        if not c.poll_tensor(keys[-1], timeout=0.2):
            if c.poll_tensor("heat/done", timeout=0) and not c.poll_tensor(keys[0], timeout=0):
                break  # the simulation ended and every field it published was read
            continue
        parts = []
        for k in keys:
            c.poll_tensor(k, timeout=10)
            parts.append(c.get_tensor(k))
            c.delete_tensor(k)
        field = torch.from_numpy(np.concatenate(parts)).float()[None, None]
        if prev is not None:
            pairs.append((prev, field))
            x = torch.cat([p[0] for p in pairs[-16:]])
            y = torch.cat([p[1] for p in pairs[-16:]])
            for _ in range(20):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
            if len(pairs) % a.commit_every == 0:
                version += 1
                mid = "%s-v%d" % (a.prefix, version)
                cairn.torch.save(model, mid, parent=parent, meta={"pairs": len(pairs), "loss": float(loss)},
                                 client=c, durability="memory", wait=True)
                c.put_tensor("%s/latest" % a.prefix, np.array(version, dtype=np.int64))
                parent = mid
        prev = field
        step += a.every
    print("trainer: %d fields read, %d surrogate versions committed (last %s) in %.1f s" %
          (len(pairs) + (prev is not None), version, parent, time.monotonic() - t0))


if __name__ == "__main__":
    main()
