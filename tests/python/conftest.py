"""Fixtures for the Python package's tests: real cairnd processes (started by pid on a temporary
config, socket and repository, stopped with SIGTERM) and the in-tree `cairn` package over the
build's libcairn.so.

Run: .venv/bin/python -m pytest -q tests/python
The daemon helper is tests/integration/conftest.py's `Daemon`, loaded as a module of another name
(both files cannot be the module `conftest`). Environment: CAIRN_BUILD_DIR (default: <repo>/build) picks cairnd and libcairn.so; CAIRN_LIBRARY, when
set, overrides the library.
"""
import gc
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location("cairn_integration_fixtures", ROOT / "tests" / "integration" / "conftest.py")
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)
Daemon = fixtures.Daemon
# The names tests/integration import `from conftest`, so that both directories can also run in one
# pytest session (whichever conftest.py is imported last is the module `conftest`).
BUILD, SOURCE, CAIRND, CAIRN, LIBCAIRN = fixtures.BUILD, fixtures.SOURCE, fixtures.CAIRND, fixtures.CAIRN, fixtures.LIBCAIRN
ctypes_env = fixtures.ctypes_env

# The package under test is the one in this tree, over this build's library.
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(LIBCAIRN))



def _start(root: Path, **kw) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    return Daemon(root, **kw).start()


@pytest.fixture(scope="module")
def daemon():
    """One daemon (256 MiB arena) shared by a test module; tests use distinct ids and keys."""
    root = Path(tempfile.mkdtemp(prefix="cairn-py-", dir="/tmp"))
    d = None
    try:
        d = _start(root / "d")
        yield d
        log = root / "d" / "cairnd.log"
        assert d.stop() == 0, log.read_text() if log.exists() else ""
    finally:
        if d is not None and d.alive():
            d.kill9()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_daemon():
    """Starts daemons with a custom config (e.g. a small arena); each is stopped after the test."""
    root = Path(tempfile.mkdtemp(prefix="cairn-py-", dir="/tmp"))
    started = []

    def make(name="d", **kw):
        (root / name).mkdir(parents=True, exist_ok=True)
        d = Daemon(root / name, **kw)
        started.append(d)
        return d.start()

    try:
        yield make
    finally:
        for d in started:
            if d.alive():
                d.proc.kill()
                d.proc.wait()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(daemon):
    import cairn

    c = cairn.connect(daemon.socket)
    yield c
    c.close()
    gc.collect()
