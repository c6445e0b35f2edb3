"""One torture client process: randomized mixed load against one cairnd, reporting to the controller.

Run by torture.py as `python3 worker.py CONFIG_JSON`; it writes one JSON event per line on stdout
(content.event) and runs until killed or until its `seconds` are up. Each of its `threads` is a
client with its own connection, its own models (ids "<name>.<thread>-<n>") and its own random
generator (seeded from the run's seed, the worker's name and the thread), so a run is replayable up
to the scheduling of threads and faults.

Operations: commits at every durability (with a parent, inherited tensors, metadata-only ones,
waiting on the ticket now or later), reads (copies) and maps (views held for a while: leases), named
tensors, rm, gc, flush, hints (sometimes naming unknown models, sometimes malformed), show and
lineage queries. Every byte read is checked against content.py; a wrong byte is reported at once.

What the worker can judge itself it reports as a `violation`: wrong bytes, a model acknowledged
`local` or `global` (or `memory` with no lost connection since) that is gone, a named tensor gone
without a lost connection. Everything else (errors, lost connections) is reported for the
controller, which knows when it injected which fault.
"""
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from content import check_model, event, first_difference, tensor_bytes  # noqa: E402

import cairn  # noqa: E402  (the package path is set by the controller's environment)

OUT_LOCK = threading.Lock()


def emit(kind, **fields):
    line = event(kind, t=time.monotonic(), **fields)
    with OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# Errors the daemon may legitimately answer under load and faults; the controller counts them.
EXPECTED = (cairn.NoSpace, cairn.IoError, cairn.CorruptData, cairn.Timeout, cairn.Busy)
DISCONNECTED = (cairn.Unavailable, cairn.ProtocolError)
SIZES = [512, 4096, 65536, 200_000, 1 << 20, 3 * (1 << 20) + 4096]
SIZE_WEIGHTS = [10, 20, 20, 15, 4, 2]


class Loop:
    def __init__(self, cfg, thread):
        self.cfg = cfg
        self.me = f"{cfg['name']}.{thread}"
        self.rng = random.Random(f"{cfg['seed']}/{self.me}")
        self.client = None
        self.epoch = 0  # lost connections so far
        self.models = {}  # id -> spec with "epoch" (connection epoch of its ack) and "level"
        self.order = []  # own ids, oldest first
        self.bases = cfg["bases"]  # id -> spec, never removed
        self.named = {}  # key -> (content key, nbytes, epoch)
        self.views = []  # (id, spec, arrays) held: leases
        self.n = 0
        self.max_live = cfg.get("max_live", 40)

    # ---- connection ----
    def connect(self):
        deadline = time.monotonic() + self.cfg.get("reconnect_seconds", 120)
        while True:
            try:
                self.client = cairn.connect(self.cfg["socket"])
                return
            except DISCONNECTED:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def lost(self, op, e):
        emit("disconnected", who=self.me, op=op, msg=str(e)[:200])
        self.epoch += 1
        self.views.clear()
        try:
            self.client.close()
        except Exception:
            pass
        self.connect()

    # ---- operations ----
    def new_spec(self, mid):
        parent = None
        tensors = {}
        inherit = []
        pool = self.parent_pool()
        if pool and self.rng.random() < 0.7:
            parent = self.rng.choice(pool)
            pspec = self.models.get(parent) or self.bases[parent]
            for name, kv in pspec["tensors"].items():
                if self.rng.random() < 0.6:
                    inherit.append(name)
                    tensors[name] = kv
        for i in range(self.rng.randint(1, 5)):
            name = f"t{i}"
            if name in tensors:
                continue
            nbytes = self.rng.choices(SIZES, SIZE_WEIGHTS)[0] + self.rng.randrange(0, 64) * 8
            if parent and self.rng.random() < 0.2 and name in pspec["tensors"]:
                tensors[name] = pspec["tensors"][name]  # same bytes sent again: deduplicated, not inherited
            else:
                tensors[name] = [f"{mid}/{name}", nbytes]
        if not tensors:
            tensors["t0"] = [f"{mid}/t0", 4096]
        return parent, tensors, inherit

    def parent_pool(self):
        """Models a commit may derive from. A soak derives only from the base models, so that what it
        removes and collects is gone for good and the daemon's memory can stay flat (a chain of
        derived models keeps its retired ancestors' lineage for as long as a descendant lives)."""
        if self.cfg.get("flat_lineage"):
            return list(self.bases)
        return list(self.models) + list(self.bases)

    def op_commit(self, meta_only=False):
        self.n += 1
        mid = f"{self.me}-{self.n}"
        level = self.rng.choices(["memory", "local", "global"], [4, 3, 3])[0]
        if meta_only and self.parent_pool():
            parent = self.rng.choice(self.parent_pool())
            pspec = self.models.get(parent) or self.bases[parent]
            tensors, inherit, arrays = dict(pspec["tensors"]), [], {}
            kw = {"inherit_all": True}
        else:
            parent, tensors, inherit = self.new_spec(mid)
            arrays = {n: tensor_bytes(*kv) for n, kv in tensors.items() if n not in inherit}
            kw = {"inherit": inherit}
            if arrays and inherit and self.rng.random() < 0.5:
                names = list(tensors)
                self.rng.shuffle(names)
                kw["order"] = names
        spec = {"tensors": tensors, "parent": parent, "durability": level}
        emit("intent", id=mid, spec=spec, who=self.me)
        later = self.rng.random() < 0.15
        try:
            ticket = self.client.save_model(mid, arrays, parent=parent, durability=level, meta={"n": self.n},
                                            wait=not later, **kw)
            if later:
                ticket.wait(timeout=120)
        except cairn.NotFound as e:
            if parent not in self.models:
                raise
            self.gone(parent, self.models[parent], "commit of a child", str(e))  # a `memory` parent lost in a crash
            return
        spec = dict(spec, epoch=self.epoch, level=level)
        self.models[mid] = spec
        self.order.append(mid)
        emit("ack", id=mid, level=level, who=self.me)

    def pick_model(self):
        pool = list(self.models) + list(self.bases)
        if not pool:
            return None, None
        mid = self.rng.choice(pool)
        return mid, self.models.get(mid) or self.bases[mid]

    def gone(self, mid, spec, op, msg=""):
        """A NotFound for an own or base model: allowed only for a `memory` one after a lost connection."""
        if mid in self.bases:
            emit("violation", who=self.me, what=f"{op}: base model {mid!r} is gone")
            return
        self.models.pop(mid, None)
        if mid in self.order:
            self.order.remove(mid)
        if spec["level"] == "memory" and spec["epoch"] < self.epoch:
            emit("lost_memory", id=mid, who=self.me)
        else:
            since = " (no lost connection since)" if spec["epoch"] == self.epoch else ""
            emit("violation", who=self.me,
                 what=f"{op}: model {mid!r} acknowledged {spec['level']} is gone{since}: {msg[:300]}")

    def op_read(self, mapped):
        mid, spec = self.pick_model()
        if mid is None:
            return
        try:
            if mapped:
                arrays = self.client.load_model(mid, writable=self.rng.random() < 0.2)
            else:
                arrays = self.client.load_model(mid, copy=True)
        except cairn.NotFound as e:
            self.gone(mid, spec, "read", str(e))
            return
        wrong = check_model(arrays, spec)
        if wrong:
            emit("violation", who=self.me, what=f"read of {mid!r} served wrong bytes: {wrong}")
        if mapped:
            self.views.append((mid, spec, arrays))
            if len(self.views) > 8 or self.rng.random() < 0.3:
                self.views.pop(self.rng.randrange(len(self.views)))
        emit("read", id=mid, who=self.me)

    def op_named(self):
        key = f"nt-{self.me}-{self.rng.randrange(4)}"
        r = self.rng.random()
        if r < 0.5:
            nbytes = self.rng.choice([64, 4096, 300_000])
            ck = f"{key}@{self.n}-{self.rng.randrange(1 << 30)}"
            emit("named", key=key)
            self.client.put_tensor(key, tensor_bytes(ck, nbytes))
            self.named[key] = (ck, nbytes, self.epoch)
        elif r < 0.85 and key in self.named:
            ck, nbytes, ep = self.named[key]
            try:
                got = self.client.get_tensor(key)
            except cairn.NotFound:
                del self.named[key]
                if ep == self.epoch:
                    emit("violation", who=self.me, what=f"named tensor {key!r} is gone without a restart")
                return
            diff = first_difference(got, tensor_bytes(ck, nbytes))
            if diff:
                emit("violation", who=self.me, what=f"named tensor {key!r}: {diff}")
        elif key in self.named:
            try:
                self.client.tensor_delete(key)
            except cairn.NotFound:
                pass
            del self.named[key]

    def op_remove(self, force=False):
        if not self.order or (not force and len(self.order) < 4):
            return
        mid = self.order[0] if force else self.rng.choice(self.order)
        spec = self.models.pop(mid)
        self.order.remove(mid)
        self.views = [v for v in self.views if v[0] != mid]
        emit("remove", id=mid, who=self.me)
        try:
            self.client.remove(mid)
        except cairn.NotFound as e:
            self.gone(mid, spec, "rm", str(e))
        except cairn.Busy:
            # still flushing, or it has descendants in flight: keep it
            self.models[mid] = spec
            self.order.insert(0, mid)
            emit("unremove", id=mid, who=self.me)

    def op_hint(self):
        ids = [self.rng.choice(list(self.models) + list(self.bases)) for _ in range(2)] if (
            self.models or self.bases) else []
        kind = self.rng.choice(["will_load", "population", "sequence", "done", "garbage", "unknown"])
        try:
            if kind == "garbage":
                self.client.hint("will_load", ids, when=self.rng.choice(["soon", -1, {"x": 1}]))
            elif kind == "unknown":
                self.client.hint("will_load", [f"no-such-{self.rng.randrange(1000)}"])
            elif kind == "will_load":
                self.client.hint("will_load", ids, when="next")
            else:
                self.client.hint(kind, ids)
        except cairn.InvalidArgument:
            if kind != "garbage":
                raise

    def op_query(self):
        mid, spec = self.pick_model()
        if mid is None:
            return
        try:
            if self.rng.random() < 0.5:
                info = self.client.show(mid)
                if spec.get("parent") and info.get("parent") not in (spec["parent"], None):
                    emit("violation", who=self.me, what=f"show {mid!r}: parent {info.get('parent')!r}, "
                                                        f"expected {spec['parent']!r}")
            else:
                self.client.lineage(mid, depth=3)
        except cairn.NotFound as e:
            self.gone(mid, spec, "show", str(e))

    def step(self):
        ops = self.cfg["ops"]
        op = self.rng.choices(list(ops), list(ops.values()))[0]
        emit("op", op=op, who=self.me)
        try:
            if op == "commit":
                self.op_commit()
            elif op == "meta":
                self.op_commit(meta_only=True)
            elif op in ("read", "map"):
                self.op_read(op == "map")
            elif op == "named":
                self.op_named()
            elif op == "rm":
                self.op_remove()
            elif op == "gc":
                self.client.gc()
            elif op == "flush":
                self.client.flush(timeout=60)
            elif op == "hint":
                self.op_hint()
            elif op == "query":
                self.op_query()
            while len(self.order) > self.max_live:
                self.op_remove(force=True)
        except DISCONNECTED as e:
            self.lost(op, e)
        except (cairn.NotFound, cairn.AlreadyExists, cairn.InvalidArgument, cairn.InternalError) as e:
            emit("unexpected", who=self.me, op=op, status=e.status, msg=str(e)[:300])
        except EXPECTED as e:
            emit("error", who=self.me, op=op, status=e.status, msg=str(e)[:300])
        emit("done", who=self.me)

    def run(self, stop_at):
        self.connect()
        emit("ready", who=self.me)
        while time.monotonic() < stop_at:
            self.step()
            pause = self.cfg.get("pause", 0)
            if pause:
                time.sleep(self.rng.random() * pause)


def hog(cfg):
    """Fills the arena: views of every base model (leases), then 4 MiB named tensors until the daemon
    says CAIRN_ERR_NO_SPACE; then holds everything until killed or `seconds` are up."""
    client = cairn.connect(cfg["socket"])
    held = [client.load_model(mid) for mid in cfg["bases"]]
    n = 0
    while n < 4096:
        key = f"hog-{cfg['name']}-{n}"
        emit("named", key=key)
        try:
            client.put_tensor(key, tensor_bytes(key, 4 << 20))
        except cairn.NoSpace as e:
            emit("error", who=cfg["name"], op="hog", status=e.status, msg=str(e)[:300])
            break
        n += 1
    emit("full", who=cfg["name"], named=n, views=len(held))
    time.sleep(cfg.get("seconds", 3600))
    os._exit(0)


def main():
    cfg = json.loads(Path(sys.argv[1]).read_text())
    if cfg.get("hog"):
        hog(cfg)
    stop_at = time.monotonic() + cfg.get("seconds", 1e9)
    loops = [Loop(cfg, t) for t in range(cfg.get("threads", 1))]
    errors = []

    def run(loop):
        try:
            loop.run(stop_at)
        except BaseException as e:  # reported, then the process fails
            emit("crash", who=loop.me, msg=f"{type(e).__name__}: {e}"[:500])
            errors.append(e)

    threads = [threading.Thread(target=run, args=(lp,), daemon=True) for lp in loops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit("exit", who=cfg["name"])
    os._exit(1 if errors else 0)


if __name__ == "__main__":
    main()
