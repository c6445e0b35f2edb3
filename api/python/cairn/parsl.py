"""Parsl integration: ``cairn://`` files staged through the worker node's cairnd (docs/workflows.md).

::

    from parsl.config import Config
    from parsl.data_provider.data_manager import default_staging
    from parsl.data_provider.files import File
    from parsl.executors import HighThroughputExecutor
    import cairn.parsl

    htex = HighThroughputExecutor(storage_access=[cairn.parsl.CairnStaging(), *default_staging],
                                  worker_init=cairn.parsl.worker_init())

    @parsl.python_app
    def finetune(inputs=(), outputs=()):
        sd = safetensors.torch.load_file(inputs[0].filepath)      # the model, as a local file
        ...
        safetensors.torch.save_file(sd, outputs[0].filepath)       # committed after the app returns

    finetune(inputs=[File("cairn://base")], outputs=[File("cairn://ft?parent=base&durability=memory")])

URLs
    ``cairn://<model>``            the whole model (the id is everything between ``cairn://`` and ``?``,
                                   percent-decoded; ids may contain ``/``)
    ``cairn://<model>/<tensor>``   stage-in only: that tensor of the model (the longest prefix that is a
                                   stored model is the id, the rest the tensor name); ``?tensor=NAME``
                                   (repeatable) says the same without guessing
    query (stage-out)              ``parent=ID`` (tensors equal to the parent's are stored once),
                                   ``durability=memory|local|global`` (default ``global``),
                                   ``meta=<JSON object>``

Both directions run inside the task on the worker (Parsl's in-task staging: the app function is
wrapped), against the daemon of the worker's node: ``CairnStaging(address=...)``, else
``$CAIRN_SOCKET``, else the default socket. Nothing goes through Parsl's own serialization or a
shared filesystem. The local files live in ``CairnStaging(directory=...)``, else
``$CAIRN_STAGING_DIR``, else ``/dev/shm`` (so the app maps RAM, not a disk), else ``$TMPDIR``, and are
removed when the app returns.

Stage-in writes the model with ``cairn_model_get_file`` (the C library writes the bytes straight
from the daemon's shared arena into the file: one copy; a model stored from a safetensors file comes
back byte for byte). Stage-out stores the file the app wrote with ``cairn_model_put_file`` (large
tensors are read straight into the arena; with a parent, tensors equal to the parent's are stored
once). A file the app wrote with ``torch.save`` (a state dict) is accepted too.

Hints: ``cairn.parsl.hint(kind, models, **fields)`` tells a node's daemon what the workflow will read
next (``will_load``, ``population``, ``sequence``, ``done``; docs/policy.md), from the driver or from
an app; a lost hint is a warning, never a failed task.

A task that finds no daemon fails at once with :class:`CairnStagingError` naming the socket it
tried; ``worker_init()`` gives a ``worker_init`` line that starts one per node and user first.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np

from . import _errors, _ffi
from ._errors import CairnError

try:  # Parsl is only needed for the staging provider itself, not for worker_init() or the URL parser.
    from parsl.data_provider.staging import Staging as _StagingBase
except ImportError:  # pragma: no cover - without Parsl, CairnStaging raises at construction
    _StagingBase = object  # type: ignore[assignment,misc]

__all__ = ["CairnStaging", "CairnStagingError", "CairnURL", "parse_url", "worker_init", "ensure_daemon", "hint"]

SCHEME = "cairn"


class CairnStagingError(RuntimeError):
    """A ``cairn://`` stage-in or stage-out failed on the worker. A plain RuntimeError with one
    message (which names the URL, the host and the socket) so that Parsl can ship it back to the
    submitting process; ``status`` is the cairn status name when the cause was a cairn call."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.args[0], self.status))


@dataclass(frozen=True)
class CairnURL:
    """A parsed ``cairn://`` URL. ``path`` is the id part (model, or model/tensor for stage-in)."""

    url: str
    path: str
    tensors: Tuple[str, ...] = ()
    parent: Optional[str] = None
    durability: str = "global"
    meta: Optional[Dict[str, Any]] = None


def parse_url(url: str) -> CairnURL:
    """Parses a ``cairn://`` URL; ValueError (naming the URL) when it is not one or its query is bad."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"{url!r} is not a cairn:// URL")
    path = unquote(parts.netloc + parts.path).strip("/")
    if not path:
        raise ValueError(f"{url!r} names no model (cairn://<model>[/<tensor>][?parent=ID&durability=D])")
    q = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(q) - {"parent", "durability", "tensor", "meta"})
    if unknown:
        raise ValueError(f"{url!r}: unknown query field(s) {', '.join(unknown)} "
                         f"(known: parent, durability, tensor, meta)")
    durability = q.get("durability", ["global"])[-1]
    if durability not in _ffi.DURABILITY:
        raise ValueError(f"{url!r}: durability {durability!r} is not one of memory, local, global")
    parent = q.get("parent", [None])[-1] or None
    meta = None
    if "meta" in q:
        try:
            meta = json.loads(q["meta"][-1])
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise ValueError(f"{url!r}: meta must be a JSON object")
    return CairnURL(url, path, tuple(q.get("tensor", [])), parent, durability, meta)


# ---- on the worker ----

def _staging_dir(directory: Optional[str]) -> str:
    if directory:
        return directory
    env = os.environ.get("CAIRN_STAGING_DIR")
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def _file_name(path: str) -> str:
    base = path.rstrip("/").rsplit("/", 1)[-1] or "model"
    return "".join(ch if ch.isalnum() or ch in "-_.+" else "_" for ch in base) + ".safetensors"


def _fail(url: str, what: str, e: BaseException) -> CairnStagingError:
    status = e.status if isinstance(e, CairnError) else ""
    return CairnStagingError(f"cairn:// {what} of {url} on {socket.gethostname()}: {e}", status)


def _connect(address: Optional[str]) -> Any:
    from .client import connect  # noqa: PLC0415

    return connect(address)


def get_file(client: Any, model: str, path: str) -> None:
    """Writes model ``model`` as the safetensors file ``path`` (:meth:`cairn.Client.model_get_file`: straight
    from the daemon's arena into the file, atomically)."""
    client.model_get_file(model, path)


def put_file(client: Any, model: str, path: str, parent: Optional[str] = None, durability: str = "global",
             meta: Optional[Dict[str, Any]] = None) -> None:
    """Stores the safetensors file ``path`` as model ``model`` (:meth:`cairn.Client.model_put_file`), derived
    from ``parent``; returns once ``durability`` is reached."""
    client.model_put_file(model, path, parent=parent, durability=durability, meta=meta)


def _write_safetensors(arrays: Dict[str, np.ndarray], dtypes: Dict[str, str], path: str) -> None:
    """A safetensors file of ``arrays`` (views of the arena: one copy, into the file)."""
    header: Dict[str, Any] = {}
    off = 0
    for name, a in arrays.items():
        header[name] = {"dtype": dtypes[name], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for a in arrays.values():
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    os.replace(tmp, path)


def _resolve(client: Any, u: CairnURL) -> Tuple[str, Tuple[str, ...]]:
    """(model id, tensor names) of a stage-in URL: the whole path if it is a model, else the longest
    prefix that is one, the rest being a tensor name."""
    if u.tensors:
        return u.path, u.tensors
    try:
        client.show(u.path)
        return u.path, ()
    except _errors.NotFound:
        pass
    parts = u.path.split("/")
    for i in range(len(parts) - 1, 0, -1):
        model, tensor = "/".join(parts[:i]), "/".join(parts[i:])
        try:
            info = client.show(model)
        except _errors.NotFound:
            continue
        if any(t.get("name") == tensor for t in info.get("tensors", [])):
            return model, (tensor,)
    raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: no model {u.path!r} and no model/tensor of that name "
                        f"(see `cairn ls`)")


def stage_in_file(client: Any, url: str, path: str) -> str:
    """Writes what the stage-in URL ``url`` names to the safetensors file ``path``; returns the model id."""
    u = parse_url(url)
    model, tensors = _resolve(client, u)
    if not tensors:
        get_file(client, model, path)
        return model
    stored = {t["name"]: t["dtype"] for t in client.show(model).get("tensors", [])}
    arrays = client.load_model(model, names=list(tensors))  # zero-copy views, released below
    try:
        _write_safetensors(arrays, {n: stored[n] for n in arrays}, path)
    finally:
        del arrays
    return model


def _is_torch_file(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def stage_out_file(client: Any, url: str, path: str) -> str:
    """Stores the file ``path`` (safetensors, or a torch.save'd state dict) as the model the stage-out
    URL ``url`` names, with its parent and durability; returns the model id."""
    u = parse_url(url)
    if not os.path.isfile(path):
        raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: the app did not write {path}")
    if _is_torch_file(path):
        from .io import _import_torch  # noqa: PLC0415

        _import_torch(client, u.path, path, u.parent, u.meta, u.durability)
    else:
        put_file(client, u.path, path, u.parent, u.durability, u.meta)
    return u.path


def _set_local_paths(args: Iterable[Any], kwargs: Dict[str, Any], url: str, path: str) -> None:
    """Points every parsl File of the task with this url at the worker-side ``path`` (the File objects
    the app receives are copies made by Parsl's serialization, not the one the wrapper holds)."""
    from parsl.data_provider.files import File  # noqa: PLC0415

    def visit(v: Any) -> None:
        if isinstance(v, File):
            if v.url == url:
                v.local_path = path
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    for a in args:
        visit(a)
    for v in kwargs.values():
        visit(v)


def _stage_in_wrapper(func: Callable, file: Any, token: str, directory: Optional[str], address: Optional[str]) -> Callable:
    url = file.url

    def cairn_stage_in(*args: Any, **kwargs: Any) -> Any:
        d = os.path.join(_staging_dir(directory), f"cairn-parsl-{token}")
        path = os.path.join(d, _file_name(parse_url(url).path))
        file.local_path = path
        _set_local_paths(args, kwargs, url, path)
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            try:
                with _connect(address) as c:
                    stage_in_file(c, url, path)
            except (CairnError, OSError, ValueError) as e:
                raise _fail(url, "stage-in", e) from None
            return func(*args, **kwargs)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    return cairn_stage_in


def _stage_out_wrapper(func: Callable, file: Any, token: str, directory: Optional[str], address: Optional[str]) -> Callable:
    url = file.url

    def cairn_stage_out(*args: Any, **kwargs: Any) -> Any:
        d = os.path.join(_staging_dir(directory), f"cairn-parsl-{token}")
        path = os.path.join(d, _file_name(parse_url(url).path))
        file.local_path = path
        _set_local_paths(args, kwargs, url, path)
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            # Connect first: a node without a daemon fails before the app spends its time.
            try:
                c = _connect(address)
            except CairnError as e:
                raise _fail(url, "stage-out", e) from None
            with c:
                result = func(*args, **kwargs)
                try:
                    stage_out_file(c, url, path)
                except (CairnError, OSError, ValueError) as e:
                    raise _fail(url, "stage-out", e) from None
            return result
        finally:
            shutil.rmtree(d, ignore_errors=True)

    return cairn_stage_out


class CairnStaging(_StagingBase):  # type: ignore[misc,valid-type]
    """A Parsl staging provider for ``cairn://`` URLs (in-task: the transfer runs inside the app's
    task on the worker, against that node's daemon).

    Args:
        address: the daemon's socket on the workers; None (default): ``$CAIRN_SOCKET`` of the worker,
            else the default socket (as :func:`cairn.connect`).
        directory: where the local files are made on the worker; None: ``$CAIRN_STAGING_DIR``,
            else ``/dev/shm``, else the temporary directory.
    """

    def __init__(self, address: Optional[str] = None, directory: Optional[str] = None) -> None:
        if _StagingBase is object:
            raise ImportError("cairn.parsl.CairnStaging needs Parsl (pip install parsl)")
        self.address = address
        self.directory = directory

    def __repr__(self) -> str:
        return f"CairnStaging(address={self.address!r}, directory={self.directory!r})"

    def can_stage_in(self, file: Any) -> bool:
        return file.scheme == SCHEME

    def can_stage_out(self, file: Any) -> bool:
        return file.scheme == SCHEME

    def _plan(self, file: Any) -> str:
        parse_url(file.url)  # a bad URL fails at submission, not on the worker
        token = uuid.uuid4().hex
        file.cairn_token = token
        # A submit-side placeholder; the wrapper sets the worker's own path before the app runs.
        file.local_path = os.path.join(self.directory or tempfile.gettempdir(), f"cairn-parsl-{token}",
                                       _file_name(parse_url(file.url).path))
        return token

    def stage_in(self, dm: Any, executor: str, file: Any, parent_fut: Any) -> None:
        self._plan(file)
        return None

    def stage_out(self, dm: Any, executor: str, file: Any, app_fu: Any) -> None:
        self._plan(file)
        return None

    def replace_task(self, dm: Any, executor: str, file: Any, func: Callable) -> Callable:
        token = getattr(file, "cairn_token", None) or self._plan(file)
        return _stage_in_wrapper(func, file, token, self.directory, self.address)

    def replace_task_stage_out(self, dm: Any, executor: str, file: Any, func: Callable) -> Callable:
        token = getattr(file, "cairn_token", None) or self._plan(file)
        return _stage_out_wrapper(func, file, token, self.directory, self.address)


# ---- hints: what the workflow will read next ----

def hint(kind: str, models: Any, address: Optional[str] = None, strict: bool = False, **fields: Any) -> Optional[Dict[str, Any]]:
    """Tells the daemon of the node this runs on what the workflow will read next (docs/policy.md):
    ``kind`` is ``"will_load"`` (``tensors=[...]``, ``when=seconds`` or ``"next"``), ``"population"``,
    ``"sequence"`` (``ahead=k``) or ``"done"``; ``models`` one id or a list. Usable in the driver (the
    submit side: it reaches the driver node's daemon) and inside an app (the worker node's daemon,
    which is the one that will serve the task's reads). The daemon is ``address``, else
    ``$CAIRN_SOCKET``, else the default socket, as for :class:`CairnStaging`.

    Returns the daemon's answer (``unknown`` lists ids that do not exist, which is not an error).
    A hint is advice: when no daemon is reachable it returns None with a warning naming the socket
    (``strict=True`` raises CairnStagingError instead), so a lost hint never fails a task. A
    malformed hint (an unknown kind or field) always raises CairnError naming the field.
    """
    from ._errors import Unavailable  # noqa: PLC0415

    try:
        client = _connect(address)
    except Unavailable as e:
        if strict:
            raise CairnStagingError(f"hint '{kind}' on {socket.gethostname()}: {e}", e.status) from e
        import warnings  # noqa: PLC0415

        warnings.warn(f"cairn.parsl.hint('{kind}'): not sent: {e}", RuntimeWarning, stacklevel=2)
        return None
    try:
        return client.hint(kind, models, **fields)
    finally:
        client.close()


# ---- making sure a node has a daemon ----

def _default_socket() -> str:
    run = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(run, f"cairn-{os.getuid()}", "cairnd.sock")


def _which(name: str, env_var: str) -> Optional[str]:
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    build = os.environ.get("CAIRN_BUILD_DIR")
    from pathlib import Path  # noqa: PLC0415

    for cand in ([Path(build) / "bin" / name] if build else []) + [Path(__file__).resolve().parents[3] / "build" / "bin" / name]:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which(name)


def _listening(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def ensure_daemon(job: Optional[str] = None, job_dir: Optional[str] = None, wait: float = 30.0) -> str:
    """Makes sure this node has a daemon for this user and returns its socket path.

    ``$CAIRN_SOCKET`` (or the default socket) when a daemon listens there. Else, under an ``flock`` on
    ``<job_dir>/start.lock`` (so concurrent workers of a node start one): ``cairn job start --job JOB
    --job-dir DIR`` as a user (docs/slurm.md: the daemon runs detached, with the repository of the
    site config or ``~/cairn-repo``); as root, where ``cairn job start`` wants a job user,
    ``cairnd`` itself, detached, with the socket in ``<job_dir>/<job>/``. ``job`` defaults to
    ``$SLURM_JOB_ID``, ``$PBS_JOBID``, else ``user-<uid>`` (one per user and node); ``job_dir`` to
    ``${TMPDIR:-/tmp}/cairn-<uid>/jobs``. Raises CairnStagingError naming the socket tried when no
    daemon can be found or started.
    """
    import fcntl  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import time  # noqa: PLC0415

    tried = os.environ.get("CAIRN_SOCKET") or _default_socket()
    if _listening(tried):
        return tried
    job = job or os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or f"user-{os.getuid()}"
    job_dir = job_dir or os.path.join(tempfile.gettempdir(), f"cairn-{os.getuid()}", "jobs")
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    sock = os.path.join(job_dir, job, "cairnd.sock")
    with open(os.path.join(job_dir, "start.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _listening(sock):
            return sock
        tool, cairnd = _which("cairn", "CAIRN_TOOL"), _which("cairnd", "CAIRND")
        why = ""
        if tool and os.getuid() != 0:
            r = subprocess.run([tool, "job", "start", "--job", job, "--job-dir", job_dir],
                               capture_output=True, text=True, timeout=wait + 30)
            for line in r.stdout.splitlines():
                if line.startswith("export CAIRN_SOCKET="):
                    sock = shlex.split(line[len("export CAIRN_SOCKET="):])[0]
            if r.returncode == 0 and _listening(sock):
                return sock
            why = (r.stderr.strip().splitlines() or [f"`cairn job start` exited with {r.returncode}"])[-1]
        elif cairnd:
            d = os.path.dirname(sock)
            os.makedirs(d, mode=0o700, exist_ok=True)
            cfg = os.path.join(d, "cairnd.yaml")
            repo = os.environ.get("CAIRN_REPOSITORY") or os.path.join(os.path.expanduser("~"), "cairn-repo")
            with open(cfg, "w") as f:
                f.write(f"# written by cairn.parsl.ensure_daemon\nsocket: {json.dumps(sock)}\n"
                        f"repository: {json.dumps(repo)}\n"
                        f"log:\n  file: {json.dumps(os.path.join(d, 'cairnd.log'))}\n")
            with open(os.path.join(d, "cairnd.out"), "ab") as out:
                p = subprocess.Popen([cairnd, "--config", cfg], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     start_new_session=True, env=dict(os.environ, CAIRN_SOCKET=sock))
            with open(os.path.join(d, "cairnd.pid"), "w") as f:
                f.write(f"{p.pid}\n")
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and p.poll() is None:
                if _listening(sock):
                    return sock
                time.sleep(0.05)
            why = f"cairnd (pid {p.pid}) exited with {p.returncode}" if p.poll() is not None else \
                f"cairnd (pid {p.pid}) did not listen within {wait:g} s"
            why += f"; see {os.path.join(d, 'cairnd.out')}"
        else:
            why = "neither the `cairn` tool nor `cairnd` was found (CAIRN_TOOL, CAIRND, CAIRN_BUILD_DIR, PATH)"
    raise CairnStagingError(f"daemon unavailable: no cairnd is listening on {tried} and none could be started "
                            f"on {sock}: {why}", "CAIRN_ERR_UNAVAILABLE")


def worker_init(job: Optional[str] = None, job_dir: Optional[str] = None, python: Optional[str] = None) -> str:
    """A shell line for an executor's ``worker_init`` that makes sure the node has a daemon (see
    :func:`ensure_daemon`) and exports ``CAIRN_SOCKET`` to the workers. A node where none can be
    started prints why (naming the socket) and the line fails (``exit 1`` of the worker script), so
    the block ends at once instead of running tasks that cannot reach cairn."""
    py = python or sys.executable or "python3"
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ""
    if job:
        args += f", job={job!r}"
    if job_dir:
        args += f", job_dir={job_dir!r}"
    code = (f"import sys; sys.path.insert(0, {pkg!r}); import cairn.parsl as p; "
            f"print(p.ensure_daemon({args.lstrip(', ')}))")
    return (f'_cairn_sock="$({shlex.quote(py)} -c {shlex.quote(code)})" || exit 1; '
            f'export CAIRN_SOCKET="$_cairn_sock"')


def _main(argv: Optional[List[str]] = None) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python3 -m cairn.parsl", description="make sure this node has a cairnd")
    ap.add_argument("command", choices=["ensure-daemon"])
    ap.add_argument("--job")
    ap.add_argument("--job-dir")
    a = ap.parse_args(argv)
    try:
        print(f"export CAIRN_SOCKET={shlex.quote(ensure_daemon(a.job, a.job_dir))}")
    except CairnStagingError as e:
        print(f"cairn: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
