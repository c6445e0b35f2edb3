"""The trainer side of the coupled example (docs/coupled.md): polls the fields the heat simulation
(heat.c) publishes as named tensors heat/<step>/<rank>, learns online a surrogate that predicts the
field `every` steps ahead (one 5x5 convolution), and every few new pairs commits it as model
surrogate-v<n> with parent surrogate-v<n-1> (only its two tensors; the lineage is the training
history) and sets the named tensor surrogate/latest = n for the simulation to load. After each field
(and the commit it completes, if any) it sets trainer/seen = that field's step, which the simulation
waits for when run with --lockstep 1.

With --backend redis the same runs over redis-server through redis-py, as SmartRedis users do
today: tensors are Redis hashes (dtype, shape, data; the layout of redis_tensors.h), polled with
EXISTS every --poll-ms, and the surrogate is stored as the tensors surrogate-v<n>/conv.weight and
surrogate-v<n>/conv.bias with surrogate/latest as its version key: Redis has no models, so no
lineage is kept.

Fields larger than --crop (default 128) on a side are trained on their central crop (the
convolution is the same everywhere), so training time does not grow with the field.

    python3 trainer.py --ranks 2 [--every 5] [--commit-every 2] [--timeout 120]
        [--backend cairn|redis] [--redis SOCKET] [--poll-ms 1] [--crop 128] [--stats FILE]

--stats FILE: a JSON object with the time of each field's reads (get, all ranks' slabs), the bytes
read and each surrogate commit's time, in seconds (bench/workloads/coupled_bench.py reads it).
"""
import argparse
import json
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


class RedisTensors:
    """The named-tensor calls of cairn.Client the trainer uses (put, poll, get, delete), over Redis
    as SmartRedis does: one hash per tensor, polled with EXISTS every poll_ms."""

    def __init__(self, socket_path, poll_ms):
        import redis
        self.r = redis.Redis(unix_socket_path=socket_path)
        self.poll_s = poll_ms / 1000.0

    def put_tensor(self, key, array):
        a = np.ascontiguousarray(array)
        self.r.hset(key, mapping={"dtype": {"float32": "f32", "int64": "i64"}[a.dtype.name],
                                  "shape": ",".join(str(d) for d in a.shape), "data": a.tobytes()})

    def tensor_poll(self, key, timeout=0.0):
        deadline = time.monotonic() + timeout
        while not self.r.exists(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return True

    def get_tensor(self, key):
        dtype, shape, data = self.r.hmget(key, "dtype", "shape", "data")
        if data is None:
            raise KeyError("redis: no tensor %r" % key)
        dims = tuple(int(d) for d in shape.decode().split(",") if d)
        return np.frombuffer(data, {b"f32": np.float32, b"i64": np.int64}[dtype]).reshape(dims)

    def tensor_delete(self, key):
        self.r.delete(key)


def commit(c, backend, model, prefix, version, parent, meta):
    """Stores surrogate version `version` and points <prefix>/latest at it; returns its id."""
    mid = "%s-v%d" % (prefix, version)
    if backend == "cairn":
        cairn.torch.save(model, mid, parent=parent, meta=meta, client=c, durability="memory", wait=True)
    else:  # Redis: the tensors under <id>/<name>; no model, no parent
        for name, t in model.state_dict().items():
            c.put_tensor("%s/%s" % (mid, name), t.detach().numpy())
    c.put_tensor("%s/latest" % prefix, np.array(version, dtype=np.int64))
    return mid


def crop_pair(x, y, size, margin):
    """The central crop of a field pair, x with `margin` more on each side (the convolution's
    reach), so the loss on y's crop sees no made-up border. Fields within `size` stay whole."""
    h, w = y.shape[-2:]
    if h <= size and w <= size:
        return x, y, 0
    r0, c0 = max(0, (h - size) // 2 - margin), max(0, (w - size) // 2 - margin)
    win = (slice(None), slice(None), slice(r0, r0 + size + 2 * margin), slice(c0, c0 + size + 2 * margin))
    return x[win].contiguous(), y[win].contiguous(), margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--commit-every", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--prefix", default="surrogate")
    ap.add_argument("--backend", choices=("cairn", "redis"), default="cairn")
    ap.add_argument("--redis", help="redis-server's Unix socket (--backend redis)")
    ap.add_argument("--poll-ms", type=float, default=1, help="Redis: sleep between EXISTS checks")
    ap.add_argument("--crop", type=int, default=128, help="train on the central crop of larger fields")
    ap.add_argument("--stats", help="write timings as JSON to this file")
    a = ap.parse_args()
    if a.backend == "redis":
        if not a.redis:
            ap.error("--backend redis needs --redis SOCKET (redis-server's Unix socket)")
        c = RedisTensors(a.redis, a.poll_ms)
    else:
        c = cairn.connect()
    torch.manual_seed(0)
    model = Surrogate()
    margin = model.conv.kernel_size[0] // 2
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    pairs = []
    prev = None
    version, parent = 0, None
    stats = {"backend": a.backend, "get_s": [], "bytes_read": 0, "commit_s": []}
    step, deadline = 0, time.monotonic() + a.timeout
    c.put_tensor("trainer/ready", np.array(1, dtype=np.int64))
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        keys = ["heat/%d/%d" % (step, r) for r in range(a.ranks)]
        if not c.tensor_poll(keys[-1], timeout=0.2):
            if c.tensor_poll("heat/done", timeout=0) and not c.tensor_poll(keys[0], timeout=0):
                break  # the simulation ended and every field it published was read
            continue
        parts, get_s = [], 0.0
        for k in keys:
            c.tensor_poll(k, timeout=10)
            g0 = time.perf_counter()
            parts.append(c.get_tensor(k))
            get_s += time.perf_counter() - g0
            c.tensor_delete(k)
        stats["get_s"].append(get_s)
        stats["bytes_read"] += sum(p.nbytes for p in parts)
        field = torch.from_numpy(np.concatenate(parts)).float()[None, None]
        if prev is not None:
            pairs.append(crop_pair(prev, field, a.crop, margin))
            x = torch.cat([p[0] for p in pairs[-16:]])
            y = torch.cat([p[1] for p in pairs[-16:]])
            m = pairs[-1][2]
            if m:
                y = y[..., m:-m, m:-m]
            for _ in range(20):
                opt.zero_grad()
                out = model(x)
                loss = torch.nn.functional.mse_loss(out[..., m:-m, m:-m] if m else out, y)
                loss.backward()
                opt.step()
            if len(pairs) % a.commit_every == 0:
                version += 1
                c0 = time.perf_counter()
                parent = commit(c, a.backend, model, a.prefix, version, parent,
                                {"pairs": len(pairs), "loss": float(loss)})
                stats["commit_s"].append(time.perf_counter() - c0)
        prev = field
        c.put_tensor("trainer/seen", np.array(step, dtype=np.int64))  # for coupled_heat --lockstep 1
        step += a.every
    wall = time.monotonic() - t0
    print("trainer: %d fields read, %d surrogate versions committed (last %s) in %.1f s" %
          (len(pairs) + (prev is not None), version, parent, wall))
    if a.stats:
        stats.update(fields=len(stats["get_s"]), versions=version, wall_s=wall)
        with open(a.stats, "w") as f:
            json.dump(stats, f)


if __name__ == "__main__":
    main()
