"""What bench/workloads/torch_load.py compares cairn's module loads with, beside safetensors and
torch.load: the fastest loaders that run without a GPU, the kernel's page mapping alone for the same
bytes, and the machine's setting for shared-memory huge pages.

Loaders (PyPI, in the same environment; each reads its own format into a module already built):
  Run:ai Model Streamer  runai_model_streamer.SafetensorsStreamer reads the safetensors file with
                         its own reader threads (its defaults: RUNAI_STREAMER_* unset). Two ways:
                         "assigned": owned tensors (owned=True, the default) become the module's
                         parameters (load_state_dict(assign=True): the streamer's read is the only
                         copy); "copied": views into the streamer's reused buffers (owned=False),
                         each copied into the parameter it belongs to as it arrives.
  Tensorizer             tensorizer.TensorSerializer.write_module writes its format once;
                         TensorDeserializer(path, device="cpu") + load_into_module (which registers
                         the read tensors as the module's parameters and buffers), eager (every
                         tensor read in the constructor) and lazy_load=True (each read when
                         load_into_module asks for it). plaid_mode is accepted by 2.x for
                         compatibility and does nothing, so it is not a separate way.

The kernel's page mapping alone: a memfd of the model's size, backed with memory beforehand the way
cairnd backs its arena (MADV_HUGEPAGE, then MADV_POPULATE_WRITE through a shared mapping), then timed:
one private read-write mapping of it populated with MADV_POPULATE_READ (what cairn's copy-on-write
views ask of the kernel for each tensor), or the same mapping with one byte read per 4 KiB page.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
HUGE = 2 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage")


def versions() -> Dict[str, str]:
    out = {}
    for dist in ("runai-model-streamer", "tensorizer", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


# ---- Run:ai Model Streamer and Tensorizer ---------------------------------------------------

def write_tensorizer(module: torch.nn.Module, path: Path) -> None:
    from tensorizer import TensorSerializer
    s = TensorSerializer(str(path))
    s.write_module(module)
    s.close()


def runai_assigned(st: Path, module: torch.nn.Module) -> None:
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        s.stream_file(str(st), device="cpu")
        state = dict(s.get_tensors())
    module.load_state_dict(state, assign=True)


def runai_copied(st: Path, module: torch.nn.Module) -> None:
    from runai_model_streamer import SafetensorsStreamer
    own = module.state_dict(keep_vars=True)
    with SafetensorsStreamer() as s, torch.no_grad():
        s.stream_file(str(st), device="cpu", owned=False)
        seen = 0
        for name, t in s.get_tensors():
            own[name].copy_(t)
            seen += 1
    if seen != len(own):
        raise RuntimeError(f"Run:ai Model Streamer gave {seen} tensors for a module of {len(own)}")


def tensorizer_load(tz: Path, module: torch.nn.Module, lazy: bool) -> None:
    from tensorizer import TensorDeserializer
    d = TensorDeserializer(str(tz), device="cpu", lazy_load=lazy)
    try:
        n = d.load_into_module(module)
    finally:
        d.close()
    if n != len(module.state_dict()):
        raise RuntimeError(f"Tensorizer loaded {n} tensors into a module of {len(module.state_dict())}")


def loader_ways(st: Path, tz: Path) -> Dict[str, Tuple[str, str, Callable[[torch.nn.Module], None]]]:
    """way ("loader (variant)") -> (loader, variant, load into a built module)."""
    ways = [("Run:ai Model Streamer", "assigned", lambda m: runai_assigned(st, m)),
            ("Run:ai Model Streamer", "copied", lambda m: runai_copied(st, m)),
            ("Tensorizer", "eager", lambda m: tensorizer_load(tz, m, False)),
            ("Tensorizer", "lazy_load", lambda m: tensorizer_load(tz, m, True))]
    return {f"{loader} ({variant})": (loader, variant, fn) for loader, variant, fn in ways}


# ---- the kernel's page mapping alone ---------------------------------------------------------

class ShmFile:
    """A memfd of `nbytes` (rounded up to 2 MiB), its pages allocated at creation the way cairnd backs
    its arena (huge pages where shmem_enabled allows them to a mapping that asks)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.size = (nbytes + HUGE - 1) // HUGE * HUGE
        self.fd = os.memfd_create("cairn-bench-pages", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        m = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        m.madvise(mmap.MADV_HUGEPAGE)
        m.madvise(MADV_POPULATE_WRITE)
        m.close()

    def close(self) -> None:
        os.close(self.fd)

    def map(self, touch: bool) -> Tuple[float, mmap.mmap]:
        """Seconds to map nbytes of the file privately (read-write, as cairn's views) and fault every
        page in: MADV_POPULATE_READ, or (touch) one byte read per 4 KiB page; and the mapping (the
        caller unmaps it, outside the time)."""
        t0 = time.perf_counter()
        m = mmap.mmap(self.fd, self.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if touch:
            a = np.frombuffer(m, dtype=np.uint8)
            int(a[::4096].sum())
            del a
        else:
            m.madvise(MADV_POPULATE_READ)
        return time.perf_counter() - t0, m

    @staticmethod
    def pmd_kib(mapping: mmap.mmap) -> int:
        """KiB of `mapping` (one returned by map) that the kernel mapped with 2 MiB entries."""
        buf = (ctypes.c_char * 1).from_buffer(mapping)
        start = ctypes.addressof(buf)
        del buf
        return pmd_mapped_kib(lambda at, _perms, _name: at == start)


def pmd_mapped_kib(match: Callable[[int, str, str], bool]) -> int:
    """KiB of this process's mappings mapped with 2 MiB entries (ShmemPmdMapped + FilePmdMapped in
    /proc/self/smaps), over the mappings for which match(start address, permissions, name) holds."""
    total, take = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    parts = line.split(None, 5)
                    take = match(int(head.split("-")[0], 16), parts[1], parts[5].strip() if len(parts) > 5 else "")
                elif take and head in ("ShmemPmdMapped:", "FilePmdMapped:"):
                    total += int(line.split()[1])
    except OSError:
        return -1
    return total


# ---- the machine's shared-memory huge-page setting ---------------------------------------------

def _word(path: Path) -> str:
    try:
        return path.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return ""


def shmem_thp_file() -> Optional[Path]:
    """The file that decides shared memory's 2 MiB pages: the 2 MiB size's own setting unless it
    says "inherit", else the global one; None where the kernel has neither."""
    per_size = THP / "hugepages-2048kB" / "shmem_enabled"
    w = _word(per_size)
    if w and w != "inherit":
        return per_size
    return THP / "shmem_enabled" if _word(THP / "shmem_enabled") else None


def shmem_thp() -> str:
    f = shmem_thp_file()
    return _word(f) if f else ""


def is_huge(mode: str) -> bool:
    return mode in ("always", "within_size", "advise", "force")


_GUARD = r"""
import sys
path, mine, old = sys.argv[1:4]
sys.stdin.read()  # EOF: the benchmark ended (or was killed)
try:
    with open(path) as f:
        now = f.read().split("[", 1)[1].split("]", 1)[0]
    if now == mine:
        with open(path, "w") as f:
            f.write(old)
except (OSError, IndexError):
    pass
"""


class ShmemThp:
    """Sets the shared-memory huge-page mode for the with-block and puts the old one back after it.
    A guard process puts it back too if this process dies without doing so (its stdin closes), and
    only if nobody changed the setting meanwhile."""

    def __init__(self, mode: str):
        self.path = shmem_thp_file()
        self.mode = mode
        self.old = shmem_thp()
        self.guard = None

    def __enter__(self) -> "ShmemThp":
        if self.path is None:
            raise OSError("this kernel has no shmem_enabled setting")
        self.guard = subprocess.Popen([sys.executable, "-c", _GUARD, str(self.path), self.mode, self.old],
                                      stdin=subprocess.PIPE)
        try:
            self.path.write_text(self.mode)
        except OSError:
            self.guard.stdin.close()
            self.guard.wait()
            raise
        if _word(self.path) != self.mode:
            self.__exit__()
            raise OSError(f"{self.path} did not take {self.mode!r}")
        return self

    def __exit__(self, *exc) -> None:
        try:
            if _word(self.path) == self.mode:
                self.path.write_text(self.old)
        finally:
            self.guard.stdin.close()
            self.guard.wait(timeout=30)


def can_set_shmem_thp() -> bool:
    f = shmem_thp_file()
    return f is not None and os.access(f, os.W_OK)
