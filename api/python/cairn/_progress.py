"""Progress bars for the helpers that move whole models (``progress=True``): tqdm's on stderr when
tqdm is installed, else one plain line per update on stderr, at most four a second."""
from __future__ import annotations

import sys
import time
from typing import Any, Optional


class _Off:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class _Lines:
    """One line per update on stderr (no carriage returns), at most four a second, and a summary."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.start = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= 0.25:
            self.last = now
            pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            sys.stderr.write(f"{self.desc}: {_human(self.done)} / {_human(self.total)}{pct}\n")
            sys.stderr.flush()

    def close(self) -> None:
        secs = time.monotonic() - self.start
        sys.stderr.write(f"{self.desc}: {_human(self.done)} in {secs:.1f}s\n")
        sys.stderr.flush()


def bar(total: int, desc: str, enabled: bool) -> Any:
    """A progress bar over ``total`` bytes: ``update(n)`` as bytes move, ``close()`` at the end."""
    if not enabled:
        return _Off()
    try:
        from tqdm import tqdm  # noqa: PLC0415 -- optional
    except ImportError:
        return _Lines(total, desc)
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                dynamic_ncols=True)


def bytes_of(arrays: Any) -> int:
    return int(sum(getattr(a, "nbytes", 0) for a in arrays))


__all__ = ["bar", "bytes_of"]
_ = Optional
