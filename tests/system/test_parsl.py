"""cairn with real Parsl (HTEX, local provider), real ProxyStore and a real cairnd (docs/workflows.md).

Run: CAIRN_BUILD_DIR=build CAIRN_SOURCE_DIR=. .venv/bin/python -m pytest -q -x tests/system/test_parsl.py
Self-contained: one cairnd (temporary socket and repository, started and stopped by pid) and one
Parsl DataFlowKernel with 2 workers are shared by the module.
"""
import os
import re
import json
import socket
import subprocess
import sys
import tempfile
import time
import shutil
from pathlib import Path

import numpy as np
import pytest

SOURCE = Path(os.environ.get("CAIRN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR") or SOURCE / "build")
CAIRND = BUILD / "bin" / "cairnd"
PKG = SOURCE / "api" / "python"

parsl = pytest.importorskip("parsl")
pytest.importorskip("proxystore")
sys.path.insert(0, str(PKG))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))


def _wait_listening(path, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cairnd exited with {proc.returncode}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    raise RuntimeError("cairnd did not listen in time")


@pytest.fixture(scope="module")
def env():
    root = Path(tempfile.mkdtemp(prefix="cairn-parsl-", dir="/tmp"))
    sock = str(root / "run" / "cairnd.sock")
    cfg = root / "cairn.yaml"
    cfg.write_text(f"socket: {sock}\nrepository: {root / 'repo'}\ntiers:\n  dram:\n    capacity: 768MiB\n"
                   f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n")
    proc = subprocess.Popen([str(CAIRND), "--config", str(cfg)], env=dict(os.environ, CAIRN_SOCKET=sock),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dfk = None
    saved = {k: os.environ.get(k) for k in ("CAIRN_SOCKET", "PYTHONPATH", "PATH")}
    try:
        _wait_listening(sock, proc)
        os.environ["CAIRN_SOCKET"] = sock
        # The workers import this module (its apps are pickled by reference) and the package.
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG), str(Path(__file__).resolve().parent),
                                                                saved["PYTHONPATH"]]))
        os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), saved["PATH"] or ""])
        from parsl.config import Config
        from parsl.data_provider.data_manager import default_staging
        from parsl.executors import HighThroughputExecutor
        from parsl.providers import LocalProvider

        import cairn.parsl

        dfk = parsl.load(Config(
            executors=[HighThroughputExecutor(
                label="htex", max_workers_per_node=2, cores_per_worker=1,
                provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
                storage_access=[cairn.parsl.CairnStaging(), *default_staging])],
            run_dir=str(root / "runinfo"), strategy="none"))
        yield {"root": root, "socket": sock}
    finally:
        if dfk is not None:
            dfk.cleanup()
            parsl.clear()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


@parsl.python_app
def _finetune(inputs=(), outputs=()):
    import safetensors.numpy as sn

    sd = sn.load_file(inputs[0].filepath)
    sd["head.bias"] = sd["head.bias"] + 1.0          # one small tensor changes
    sn.save_file(sd, outputs[0].filepath)
    return sorted(sd)


def test_stage_in_and_out_with_parent(env):
    import cairn
    from parsl.data_provider.files import File

    with cairn.connect() as c:
        base = {"body.weight": np.random.rand(1024, 1024).astype(np.float32),
                "head.bias": np.zeros(1000, np.float32)}
        c.save_model("base", base, wait=True)
        before = c.stats()["repository"]["physical_bytes"]
        fut = _finetune(inputs=[File("cairn://base")], outputs=[File("cairn://ft?parent=base&durability=global")])
        assert fut.result(timeout=120) == ["body.weight", "head.bias"]
        fut.outputs[0].result(timeout=60)
        assert c.lineage("ft")["ancestors"] == ["base"]
        grown = c.stats()["repository"]["physical_bytes"] - before
        assert 0 < grown < 64 * 1024, grown          # only head.bias (4000 bytes) is new, not the 4 MiB body
        ft = c.load_model("ft", copy=True)
        assert np.array_equal(ft["body.weight"], base["body.weight"])
        assert np.array_equal(ft["head.bias"], base["head.bias"] + 1)


@parsl.python_app
def _make_proxy(n):
    import numpy as np
    from proxystore.store import Store, get_store

    import cairn.proxystore as cps

    store = get_store("cairn-test") or Store("cairn-test", cps.CairnConnector(), serializer=cps.serialize,
                                             deserializer=cps.deserialize, register=True)
    a = np.arange(n, dtype=np.float64) * 0.5
    # Pickled here: a pickled proxy is its factory (store config + key), never the data; Parsl's own
    # serializer would hash the proxy, which resolves it.
    import pickle

    return pickle.dumps(store.proxy(a, populate_target=False))


@parsl.python_app
def _resolve(pickled):
    import hashlib
    import pickle

    import numpy as np

    a = np.asarray(pickle.loads(pickled))  # resolves through this worker's daemon
    return a.shape, hashlib.sha256(a.tobytes()).hexdigest()


@parsl.python_app
def _resolve_error(pickled):
    """ProxyStore's exceptions do not unpickle, so Parsl cannot ship them back: report them."""
    import pickle

    import numpy as np

    try:
        np.asarray(pickle.loads(pickled))
        return []
    except Exception as e:  # noqa: BLE001
        chain = []
        while e is not None:
            chain.append(type(e).__name__)
            e = e.__cause__
        return chain


def test_proxystore_64mib_between_apps_evict_and_missing(env):
    import hashlib

    from proxystore.store import Store
    from proxystore.store.utils import get_key

    import cairn.proxystore as cps

    n = 64 * 2**20 // 8
    import pickle

    p = _make_proxy(n).result(timeout=120)
    key = get_key(pickle.loads(p))
    assert key.form == "numpy"
    shape, digest = _resolve(p).result(timeout=120)
    want = np.arange(n, dtype=np.float64) * 0.5
    assert tuple(shape) == (n,) and digest == hashlib.sha256(want.tobytes()).hexdigest()

    store = Store("cairn-test-main", cps.CairnConnector(), serializer=cps.serialize, deserializer=cps.deserialize)
    assert store.exists(key)
    store.evict(key)
    assert not store.exists(key)
    assert store.connector.get(key) is None
    # ProxyStore 1.x raises ProxyResolveError caused by ProxyResolveMissingKeyError.
    chain = _resolve_error(p).result(timeout=120)
    assert "ProxyResolveMissingKeyError" in chain, chain
    store.close()


def test_nas_parsl_end_to_end(env):
    t0 = time.time()
    r = subprocess.run([sys.executable, str(SOURCE / "workflow" / "examples" / "nas_parsl.py"), "--candidates", "12",
                        "--steps", "10", "--run-dir", str(env["root"] / "nas-runinfo")],
                       env=dict(os.environ, CAIRN_SOCKET=env["socket"]), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    for mode in ("cairn", "files"):
        assert out[mode]["read_back_exact"] == 12
    assert out["cairn"]["lineage_ok"]
    assert 0 < out["cairn"]["stored_bytes"] < out["files"]["stored_bytes"]
    # The driver's hints reached the daemon: a population and a will_load per child of a tournament
    # (12 candidates, population 8: 4 children), every id known.
    h = out["cairn"]["hints"]
    assert h["hints"] == 2 * 4 and h["unknown_models"] == 0, h
    print(f"\nnas_parsl (12 candidates) in {time.time() - t0:.1f} s:\n" + "\n".join(r.stdout.splitlines()[-4:-1]))


@parsl.python_app
def _hint_app(kind, models, address):
    import cairn.parsl

    return cairn.parsl.hint(kind, models, address=address)


def _prefetch_stats(c, want_staged, timeout=30):
    """The daemon's prefetch stats once its queue is empty and it staged at least want_staged chunks."""
    deadline = time.time() + timeout
    while True:
        p = c.stats()["prefetch"]
        if (p["queued"] == 0 and p["chunks_staged"] >= want_staged) or time.time() > deadline:
            return p
        time.sleep(0.05)


def test_hint_from_an_app_stages_the_model_before_the_read(env):
    """A will_load sent by a Parsl app reaches its node's daemon, which stages the model into DRAM
    before the read: the read uses the prefetched chunks. The daemon here starts cold on the
    repository the model was committed to (as a node of a later job would)."""
    import cairn
    import cairn.parsl

    rng = np.random.default_rng(16)
    tensors = {f"layer{i}.weight": rng.random((1024, 1024), dtype=np.float32) for i in range(3)}  # 3 x 4 MiB
    with cairn.connect() as c:
        c.save_model("hinted/base", tensors, durability="global", wait=True)
    root = env["root"]
    sock = str(root / "run-cold" / "cairnd.sock")
    cfg = root / "cold.yaml"
    cfg.write_text(f"socket: {sock}\nrepository: {root / 'repo'}\ntiers:\n  dram:\n    capacity: 256MiB\n"
                   f"log:\n  level: warn\n  file: {root / 'cold.log'}\n")
    proc = subprocess.Popen([str(CAIRND), "--config", str(cfg)], env=dict(os.environ, CAIRN_SOCKET=sock),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(sock, proc)
        with cairn.connect(sock) as c:
            before = c.stats()["prefetch"]
            assert before["chunks_staged"] == 0 and before["hints"] == 0, before
            answer = _hint_app("will_load", ["hinted/base", "hinted/not-there"], sock).result(timeout=120)
            assert answer["unknown"] == ["hinted/not-there"] and answer["queued"] == 1, answer
            p = _prefetch_stats(c, 3)
            assert p["hints"] == 1 and p["unknown_models"] == 1 and p["chunks_staged"] >= 3, p
            got = c.load_model("hinted/base", copy=True)
            for k, v in tensors.items():
                assert np.array_equal(got[k], v), k
            p = c.stats()["prefetch"]
            assert p["chunks_used"] >= 3 and p["chunks_wasted"] == 0, p
            # From the driver: a population hint on the same daemon, and a malformed one names its field.
            assert cairn.parsl.hint("population", ["hinted/base"], address=sock)["models"] == 1
            with pytest.raises(cairn.CairnError, match="ahead"):
                cairn.parsl.hint("sequence", ["hinted/base"], address=sock, ahead=0)
            assert c.stats()["prefetch"]["hints"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # No daemon: a warning naming the socket, not an error (strict=True raises).
    missing = str(root / "none" / "cairnd.sock")
    with pytest.warns(RuntimeWarning, match=re.escape(missing)):
        assert cairn.parsl.hint("done", ["hinted/base"], address=missing) is None
    with pytest.raises(cairn.parsl.CairnStagingError, match=re.escape(missing)):
        cairn.parsl.hint("done", ["hinted/base"], address=missing, strict=True)


_NO_DAEMON = r'''
import os, sys, time
import parsl
from parsl.config import Config
from parsl.executors import ThreadPoolExecutor
from parsl.data_provider.data_manager import default_staging
from parsl.data_provider.files import File
import cairn.parsl
parsl.load(Config(executors=[ThreadPoolExecutor(label="t", storage_access=[cairn.parsl.CairnStaging(), *default_staging])]))
@parsl.python_app
def app(inputs=()):
    return 1
t0 = time.time()
try:
    app(inputs=[File("cairn://base")]).result(timeout=60)
    print("NO ERROR")
except Exception as e:
    print("ERROR", type(e).__name__, str(e), round(time.time() - t0, 2))
parsl.dfk().cleanup()
'''


def test_no_daemon_fails_at_once_naming_the_socket(env):
    missing = str(env["root"] / "none" / "cairnd.sock")
    e = dict(os.environ, CAIRN_SOCKET=missing)
    r = subprocess.run([sys.executable, "-c", _NO_DAEMON], env=e, capture_output=True, text=True, timeout=120)
    m = re.search(r"^ERROR (\S+) (.*) ([\d.]+)$", r.stdout, re.M)
    assert m, r.stdout + r.stderr
    assert missing in m.group(2) and float(m.group(3)) < 10, m.group(0)
    # The example workflow refuses to start, naming the socket, before Parsl starts.
    t0 = time.time()
    r = subprocess.run([sys.executable, str(SOURCE / "workflow" / "examples" / "nas_parsl.py")], env=e,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and missing in r.stderr and time.time() - t0 < 30, r.stderr
