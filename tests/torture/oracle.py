"""The oracle: a model of what every daemon acknowledged, at which level and when, fed by the
workers' events and the controller's own actions (kills, flushes), and the judge of every read.

Rules (docs/reliability.md):
- a model acknowledged `global` reads back exactly from every daemon of the repository;
- one acknowledged `local` reads back exactly from its daemon, across any number of kill -9s;
- one acknowledged `memory` reads back exactly from its daemon unless that daemon was killed after
  the acknowledgement (a flush that returned since makes it `global`);
- a model whose commit was never acknowledged may exist or not; if it exists it is exact;
- nothing is ever served wrong: any read of any model, at any moment, is exact or an error.
"""
import threading
import time


class Oracle:
    def __init__(self):
        self.mu = threading.Lock()
        self.specs = {}  # id -> spec (from the intent: tensors, parent, durability)
        self.owner = {}  # id -> node index that was asked
        self.acked = {}  # id -> (level, t)
        self.removed = set()
        self.kills = {}  # node -> [t, ...] of kill -9s
        self.named = {}  # node -> set of named-tensor keys ever put
        self.violations = []
        self.counts = {}  # what happened, for the report
        self.lost_memory = 0
        self.sent = {}  # id -> when its commit was sent

    def count(self, what, n=1):
        with self.mu:
            self.counts[what] = self.counts.get(what, 0) + n

    def violation(self, what):
        with self.mu:
            self.violations.append(f"{time.strftime('%H:%M:%S')} {what}")

    # ---- events ----
    def intent(self, mid, spec, node, t=None):
        """A commit about to be sent at t. A kill after t may take a `memory` model with it even when
        the client stamps the acknowledgement later (the reply was in its socket when the daemon died)."""
        with self.mu:
            self.specs[mid] = spec
            self.owner[mid] = node
            if t is not None:
                self.sent[mid] = t

    def ack(self, mid, level, t):
        with self.mu:
            if mid in self.specs:
                self.acked[mid] = (level, t)
                self.counts[f"acked_{level}"] = self.counts.get(f"acked_{level}", 0) + 1

    def remove(self, mid):
        with self.mu:
            self.removed.add(mid)

    def unremove(self, mid):
        with self.mu:
            self.removed.discard(mid)

    def killed(self, node, t):
        with self.mu:
            self.kills.setdefault(node, []).append(t)

    def flushed(self, node, t_start):
        """A flush of `node` that started at t_start returned: what it acknowledged before is global."""
        with self.mu:
            last_kill = max(self.kills.get(node, [0.0]))
            for mid, (level, t) in self.acked.items():
                # A `memory` one acknowledged before the daemon's last kill may have been lost then:
                # the flush says nothing about it.
                if level == "global" or self.owner.get(mid) != node or t >= t_start:
                    continue
                if level == "memory" and min(t, self.sent.get(mid, t)) < last_kill:
                    continue
                self.acked[mid] = ("global", t)

    def forget(self, mid):
        """A `memory` model lost with its daemon: allowed, counted, no longer expected."""
        with self.mu:
            self.acked.pop(mid, None)
            self.specs.pop(mid, None)
            self.lost_memory += 1

    # ---- judging ----
    def expected_on(self, node, group):
        """Ids a read through `node` should find now: (id, spec, must) where must is False for models
        whose commit was never acknowledged, or that were removed meanwhile."""
        out = []
        with self.mu:
            for mid, spec in self.specs.items():
                if mid in self.removed:
                    continue
                owner = self.owner[mid]
                level = self.acked.get(mid, (None, 0))[0]
                if owner != node and not (group and level == "global"):
                    continue
                out.append((mid, spec, level is not None))
        return out

    def may_be_lost(self, mid):
        """A NotFound for mid is allowed: removed, never acknowledged, or `memory` with a kill since."""
        with self.mu:
            if mid in self.removed or mid not in self.acked:
                return True
            level, t = self.acked[mid]
            if level != "memory":
                return False
            t = min(t, self.sent.get(mid, t))
            return any(k > t for k in self.kills.get(self.owner[mid], []))

    def summary(self):
        with self.mu:
            return {
                "models_acknowledged": len(self.acked),
                "acknowledged_by_level": {lv: self.counts.get(f"acked_{lv}", 0) for lv in ("memory", "local", "global")},
                "models_removed": len(self.removed),
                "memory_models_lost_with_a_killed_daemon": self.lost_memory,
                "violations": list(self.violations),
                "counts": dict(sorted(self.counts.items())),
            }
