"""torch.distributed.checkpoint on cairn (cairn.dcp, docs/python.md): real cairnd, real gloo jobs.

The multi-rank tests run this file as a worker script (``python test_dcp.py worker ARGS``), one
process per rank under a gloo process group on 127.0.0.1, each started and waited for by pid with a
timeout. A saving rank writes a reference copy of what it saved with torch.save; a loading rank
compares what DCP loaded from cairn with that reference, bit for bit, and prints a JSON report.

- 2 ranks save a model and its Adam state (replicated, as data-parallel training holds it), a
  fine-tuning save derived from it stores few new bytes, dcp.async_save stages into arena space
  (the weights change right after it returns; the checkpoint keeps the staged values); a 1-rank
  job loads each back exactly.
- Resharding: an FSDP2-sharded state (DTensors) saved on 2 ranks loads on 1; a state saved on 1
  rank loads into FSDP2 shards on 2.
- A rank killed mid-save leaves no checkpoint, and the surviving rank learns that the part is
  missing; the id can be saved again.
- In this process (one rank, no process group): missing and corrupt checkpoints (not DCP's, torn
  metadata, bytes rotted in the repository) raise errors naming them, ModelWriter's arena space and
  abort, the zero-copy load planner, CUDA (skipped without a GPU).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ != "__main__":
    import numpy as np
    import pytest

    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import cairn
    from cairn.dcp import METADATA_TENSOR, CairnReader, CairnWriter, ZeroCopyLoadPlanner
    from torch.distributed.checkpoint import CheckpointException

    # What a failed dcp.save/load raises: DCP wraps the storage layer's errors in a
    # CheckpointException (a BaseException) that carries their messages.
    DCP_ERRORS = (Exception, CheckpointException)

JOB_TIMEOUT = 150  # seconds for one multi-process job


# ---- what the ranks hold (shared by the worker and the tests) ----

def _model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(160, 160) for _ in range(5)], torch.nn.Linear(160, 16))


def _train(model, opt, seed, frozen=0):
    """One Adam step on seeded data; with ``frozen`` the first layers get no gradient (so their
    weights and Adam state stay as they were: a fine-tuning run)."""
    import torch
    for i, layer in enumerate(model):
        for p in layer.parameters():
            p.requires_grad_(i >= frozen)
    g = torch.Generator().manual_seed(seed)
    opt.zero_grad(set_to_none=True)
    model(torch.randn(8, 160, generator=g)).square().mean().backward()
    opt.step()


def _leaves(obj, prefix=""):
    """(path, value) of every leaf of a nested state dict."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, obj


def _full(obj):
    """The state dict with every DTensor gathered into a plain tensor (a collective)."""
    import torch
    if isinstance(obj, dict):
        return {k: _full(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_full(v) for v in obj]
    if hasattr(obj, "full_tensor"):
        return obj.full_tensor()
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    return obj


def _bits(t):
    import torch
    return t.contiguous().view(torch.uint8) if t.dim() else t


def _differences(got, ref):
    """The leaves of ``got`` that are not exactly (bitwise, dtype and shape) those of ``ref``."""
    import torch
    a, b = dict(_leaves(_full(got))), dict(_leaves(ref))
    bad = sorted(set(a) ^ set(b))
    for k in set(a) & set(b):
        x, y = a[k], b[k]
        if isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and
                    torch.equal(_bits(x), _bits(y))):
                bad.append(k)
        elif x != y:
            bad.append(k)
    return bad


# ---- the worker: one rank of a gloo job ----

def _sharded_state(seed, world=1):
    """A model and its Adam state as torch.distributed.checkpoint.state_dict.get_state_dict gives
    them: sharded by FSDP2 over ``world`` ranks (DTensors), or plain on one."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model = _model(seed)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, seed + 100)
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from datetime import timedelta
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    import cairn
    from cairn.dcp import CairnReader, CairnWriter

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    rank, world = args["rank"], args["world"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.get("pg_timeout", 60)))
    refs = Path(args["dir"])
    client = cairn.connect(args["socket"])
    report = {}

    def replicated(seed, steps):
        model = _model(seed)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for s, frozen in steps:
            _train(model, opt, s, frozen)
        return model, opt, {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"epoch": len(steps)}}

    def keep_reference(ckpt, state):
        full = _full(state)  # a collective for DTensors: every rank takes part
        if rank == 0:
            torch.save(full, refs / f"{ckpt}.pt")

    def check(ckpt, state):
        ref = torch.load(refs / f"{ckpt}.pt", weights_only=False)
        bad = _differences(state, ref)
        report[ckpt] = {"different": bad, "leaves": len(list(_leaves(ref)))}

    for op in args["ops"]:
        kind, ckpt = op["op"], op["id"]
        if kind == "save":  # data-parallel replicas: every rank holds the same state
            _, _, state = replicated(1, op["steps"])
            dcp.save(state, storage_writer=CairnWriter(ckpt, parent=op.get("parent"), durability=op["durability"],
                                                       client=client))
            keep_reference(ckpt, state)
            if rank == 0:
                report[ckpt] = {"repository": client.stats()["repository"]}
        elif kind == "async_save":
            model, _, state = replicated(1, op["steps"])
            writer = CairnWriter(ckpt, parent=op.get("parent"), durability=op["durability"], client=client)
            keep_reference(ckpt, state)
            t0 = time.perf_counter()
            got = dcp.async_save(state, storage_writer=writer)
            blocked = time.perf_counter() - t0
            with torch.no_grad():  # the next step changes the weights while the upload runs
                for p in model.parameters():
                    p.add_(1.0)
            (got.upload_completion if hasattr(got, "upload_completion") else got).result(timeout=60)
            if rank == 0:
                report[ckpt] = {"blocked_s": blocked}
        elif kind == "load":
            _, _, state = replicated(7, [(8, 0)])
            dcp.load(state, storage_reader=CairnReader(ckpt, client=client))
            check(ckpt, state)
        elif kind == "save_sharded":  # FSDP2 shards when world > 1, a plain state on one rank
            state = _sharded_state(3, world)
            dcp.save(state, storage_writer=CairnWriter(ckpt, durability="memory", client=client))
            keep_reference(ckpt, state)
        elif kind == "load_sharded":
            state = _sharded_state(11, world)
            dcp.load(state, storage_reader=CairnReader(ckpt, client=client))
            check(ckpt, state)
        elif kind == "save_killed":  # rank 1 dies in the middle of writing its part
            class DieMidSave(DefaultSavePlanner):
                resolved = 0

                def resolve_data(self, item):
                    self.resolved += 1
                    if rank == 1 and self.resolved == 3:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return super().resolve_data(item)

            _, _, state = replicated(1, [(2, 0)])
            writer = CairnWriter(ckpt, durability="memory", client=client, part_timeout=op["part_timeout"])
            try:
                dcp.save(state, storage_writer=writer, planner=DieMidSave())
                report["save"] = "returned"
            except BaseException as e:  # DCP's CheckpointException is a BaseException
                report["save"] = f"{type(e).__name__}: {e}"[:2000]
            try:
                writer.wait(timeout=60)
                report["part"] = "complete"
            except cairn.CairnError as e:
                report["part"] = f"{type(e).__name__}: {e}"
            client.close()
            print(json.dumps(report), flush=True)
            os._exit(0)  # the process group's other member is gone: no orderly teardown
    dist.barrier()
    client.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        _worker(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit("usage: test_dcp.py worker JSON   (run by the tests, one process per rank)")


# ---- running jobs ----

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(daemon, tmp_path, world, ops, expect_rc=None, **extra):
    """Runs ``ops`` on ``world`` ranks; returns each rank's (exit code, report). Every rank must
    exit 0 unless ``expect_rc`` says otherwise ({rank: code})."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "api" / "python"), CAIRN_SOCKET=daemon.socket,
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    port = _free_port()
    procs = []
    for rank in range(world):
        args = dict(rank=rank, world=world, port=port, socket=daemon.socket, dir=str(tmp_path), ops=ops, **extra)
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", json.dumps(args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        for rank, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            want = (expect_rc or {}).get(rank, 0)
            assert p.returncode == want, f"rank {rank} exited with {p.returncode}, not {want}:\n{stderr[-4000:]}"
            lines = stdout.strip().splitlines()
            out.append(json.loads(lines[-1]) if lines and p.returncode == 0 else None)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    return out


def _has_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401 (FSDP2, torch >= 2.6)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    return tmp_path_factory.mktemp("dcp-refs")


@pytest.fixture(scope="module")
def jobs(daemon, refs):
    """The module's gloo jobs, run once (each rank's start imports torch: seconds on 2 cores): this
    process saves a plain state (one rank, no process group); 2 ranks save checkpoints and load
    that state into FSDP2 shards; 1 rank loads theirs. Their reports."""
    steps = [(2, 0)]
    sharded = _has_fsdp2()
    save = [
        {"op": "save", "id": "dcp-a", "steps": steps, "durability": "global"},
        # Fine-tuning with the first 5 of 6 layers frozen: only the head and its Adam state change.
        {"op": "save", "id": "dcp-b", "parent": "dcp-a", "steps": steps + [(3, 5)], "durability": "global"},
        {"op": "async_save", "id": "dcp-c", "parent": "dcp-b", "steps": steps + [(3, 5), (4, 5)],
         "durability": "memory"},
    ]
    load = [{"op": "load", "id": c} for c in ("dcp-a", "dcp-b", "dcp-c")]
    if sharded:
        with warnings.catch_warnings(), cairn.connect(daemon.socket) as c:
            warnings.simplefilter("ignore")
            state = _sharded_state(3)
            dcp.save(state, storage_writer=CairnWriter("dcp-s1", durability="memory", client=c))
            torch.save(_full(state), refs / "dcp-s1.pt")
        save += [{"op": "save_sharded", "id": "dcp-s2"}, {"op": "load_sharded", "id": "dcp-s1"}]
        load += [{"op": "load_sharded", "id": "dcp-s2"}]
    return {"saved": _job(daemon, refs, 2, save)[0], "loaded": _job(daemon, refs, 1, load)[0]}


# ---- multi-rank ----

def test_two_ranks_save_a_derived_and_an_async_checkpoint_and_one_rank_loads_them_exactly(daemon, jobs):
    saved, loaded = jobs["saved"], jobs["loaded"]
    a, b = saved["dcp-a"]["repository"], saved["dcp-b"]["repository"]
    # What dcp-b added to the repository: the head's few KiB and the metadata, not another copy.
    grown = b["physical_bytes"] - a["physical_bytes"]
    assert 0 < grown < 0.1 * a["physical_bytes"], (a, b)
    for c in ("dcp-a", "dcp-b", "dcp-c"):
        assert loaded[c]["different"] == [], (c, loaded[c])
        assert loaded[c]["leaves"] > 20

    with cairn.connect(daemon.socket) as c:
        info = c.show("dcp-b")
        assert info["parent"] == "dcp-a"
        assert info["metadata"]["format"] == "torch.distributed.checkpoint" and info["metadata"]["ranks"] == 2
        names = [t["name"] for t in info["tensors"]]
        assert names[-1] == METADATA_TENSOR and "model.0.weight" in names
        # The async checkpoint's tensors were staged in arena space, one part per rank.
        staged = [t["name"] for t in c.show("dcp-c")["tensors"] if t["name"].endswith(("@rank0", "@rank1"))]
        assert "model.0.weight@rank0" in staged and "model.0.weight@rank1" in staged


def test_resharding_fsdp_shards_saved_on_two_ranks_load_on_one_and_back(daemon, jobs):
    if not _has_fsdp2():
        pytest.skip(f"FSDP2 (fully_shard) is not in torch {torch.__version__}")
    assert jobs["loaded"]["dcp-s2"]["different"] == [], jobs["loaded"]
    with cairn.connect(daemon.socket) as c:
        names = [t["name"] for t in c.show("dcp-s2")["tensors"]]
    assert "model.0.weight@0_0" in names and "model.0.weight@80_0" in names  # one row-shard per rank
    # Saved on one rank (this process), loaded into FSDP2 shards on two.
    assert jobs["saved"]["dcp-s1"]["different"] == [], jobs["saved"]


def test_a_rank_killed_mid_save_leaves_no_checkpoint(daemon, refs):
    t0 = time.monotonic()
    survivor, _ = _job(daemon, refs, 2, [{"op": "save_killed", "id": "dcp-killed", "part_timeout": 3}],
                       expect_rc={1: -signal.SIGKILL}, pg_timeout=20)
    assert time.monotonic() - t0 < JOB_TIMEOUT
    assert survivor["save"] != "returned", survivor
    # The surviving rank's part fails: the dead rank's part (and the coordinator's) never arrived.
    assert "dcp-killed" in survivor["part"] and "was not created" in survivor["part"], survivor
    assert "parts 1, 2 of 3 did not arrive" in survivor["part"], survivor
    with cairn.connect(daemon.socket) as c:
        with pytest.raises(cairn.NotFound):
            c.show("dcp-killed")
        assert "dcp-killed" not in [m["id"] for m in c.list()]
        with pytest.raises(DCP_ERRORS) as e:
            dcp.load({"w": torch.zeros(3)}, storage_reader=CairnReader("dcp-killed", client=c))
        assert "checkpoint 'dcp-killed' does not exist" in str(e.value)
        # Nothing of it is left: the id can be saved again.
        dcp.save({"w": torch.arange(3.0)}, storage_writer=CairnWriter("dcp-killed", durability="memory", client=c))
        got = {"w": torch.zeros(3)}
        dcp.load(got, storage_reader=CairnReader("dcp-killed", client=c))
        assert torch.equal(got["w"], torch.arange(3.0))


# ---- one rank, in this process ----

@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _sd(seed=0):
    model = _model(seed)
    opt = torch.optim.Adam(model.parameters())
    _train(model, opt, seed + 1)
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def _error_of(excinfo):
    """The message DCP reports (it wraps the storage layer's exceptions)."""
    return str(excinfo.value)


def test_missing_and_corrupt_checkpoints_are_errors_naming_them(client):
    target = _sd(1)
    with pytest.raises(DCP_ERRORS) as e:
        dcp.load(target, storage_reader=CairnReader("dcp-none", client=client))
    assert "checkpoint 'dcp-none' does not exist" in _error_of(e)

    # A model that is not a DCP checkpoint.
    client.save_model("dcp-plain", {"w": np.ones(4, np.float32)}, wait=True)
    with pytest.raises(DCP_ERRORS) as e:
        dcp.load(target, storage_reader=CairnReader("dcp-plain", client=client))
    assert "checkpoint 'dcp-plain' is not a torch.distributed.checkpoint checkpoint" in _error_of(e)

    # Metadata that is not DCP's.
    client.save_model("dcp-garbage", {METADATA_TENSOR: np.frombuffer(b"not a pickle", np.uint8)}, wait=True)
    with pytest.raises(DCP_ERRORS) as e:
        dcp.load(target, storage_reader=CairnReader("dcp-garbage", client=client))
    assert "checkpoint 'dcp-garbage'" in _error_of(e) and "cannot be read" in _error_of(e)

    # Metadata naming tensors the model lacks (its blob copied into a model without them).
    dcp.save(_sd(0), storage_writer=CairnWriter("dcp-whole", durability="memory", client=client))
    blob = client.load_model("dcp-whole", names=[METADATA_TENSOR], copy=True)[METADATA_TENSOR]
    client.save_model("dcp-torn", {"model.0.bias": np.zeros(160, np.float32), METADATA_TENSOR: blob}, wait=True)
    reader = CairnReader("dcp-torn", client=client)
    with pytest.raises(cairn.CorruptData, match="checkpoint 'dcp-torn' lacks"):
        reader.set_up_storage_reader(reader.read_metadata(), True)


def test_a_checkpoint_whose_stored_bytes_rotted_is_an_error_naming_it(make_daemon):
    d = make_daemon("rot")
    sd = {"w": torch.randn(512, 512), "b": torch.randn(512)}
    with cairn.connect(d.socket) as c:
        dcp.save(sd, storage_writer=CairnWriter("dcp-rot", client=c))  # durability global: in the packs
    d.stop()
    pack = max((d.root / "repo" / "packs").iterdir(), key=lambda p: p.stat().st_size)
    with open(pack, "r+b") as f:  # 16 bytes in the middle of w's chunk flipped
        f.seek(pack.stat().st_size // 2)
        rotten = bytes(b ^ 0xFF for b in f.read(16))
        f.seek(pack.stat().st_size // 2)
        f.write(rotten)
    d.start()  # its memory empty: the load reads the pack
    with cairn.connect(d.socket) as c:
        got = {"w": torch.zeros(512, 512), "b": torch.zeros(512)}
        with pytest.raises(DCP_ERRORS) as e:
            dcp.load(got, storage_reader=CairnReader("dcp-rot", client=c))
    assert "corrupt data" in str(e.value) and "checkpoint 'dcp-rot'" in str(e.value), str(e.value)


def test_a_checkpoint_id_is_immutable_and_async_save_keeps_the_staged_id(client):
    dcp.save(_sd(0), storage_writer=CairnWriter("dcp-once", durability="memory", client=client))
    with pytest.raises(DCP_ERRORS) as e:
        dcp.save(_sd(0), storage_writer=CairnWriter("dcp-once", durability="memory", client=client))
    assert "dcp-once" in _error_of(e) and "exists" in _error_of(e)
    # A CairnWriter stages for its own id, and the bytes are saved under the id they were staged for
    # or not at all. A torch that applies async_save's checkpoint_id after staging (2.5 and later)
    # gets a refusal and nothing is stored; one that applies it before (2.4) stages and saves under it.
    used = client.stats()["tiers"]["dram"]["used_bytes"]
    fut = dcp.async_save(_sd(0), storage_writer=CairnWriter("dcp-staged", durability="memory", client=client),
                         checkpoint_id="dcp-other")
    try:
        (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result(timeout=60)
    except DCP_ERRORS as e:
        assert "dcp-staged" in str(e) and "dcp-other" in str(e), str(e)
        ids = [m["id"] for m in client.list()]
        assert "dcp-staged" not in ids and "dcp-other" not in ids
        assert client.stats()["tiers"]["dram"]["used_bytes"] <= used  # the staged arena space was freed
    else:
        ids = [m["id"] for m in client.list()]
        assert "dcp-other" in ids and "dcp-staged" not in ids, ids
        back = _sd(5)
        dcp.load(back, storage_reader=CairnReader("dcp-other", client=client))
        assert _differences(back, _sd(0)) == []


def test_zero_copy_load_planner_hands_over_copy_on_write_views(client):
    sd = _sd(0)
    dcp.save(sd, storage_writer=CairnWriter("dcp-zc", durability="memory", client=client))
    target = _sd(5)
    before = {k: v.data_ptr() for k, v in target["model"].items()}
    dcp.load(target, storage_reader=CairnReader("dcp-zc", client=client), planner=ZeroCopyLoadPlanner())
    assert _differences(target, sd) == []
    # The whole tensors were replaced by views of the daemon's arena (no copy into the old ones)...
    assert all(target["model"][k].data_ptr() != before[k] for k in before)
    # ...that the training may write: the checkpoint does not change.
    target["model"]["0.weight"].add_(1.0)
    again = _sd(6)
    dcp.load(again, storage_reader=CairnReader("dcp-zc", client=client))
    assert torch.equal(again["model"]["0.weight"], sd["model"]["0.weight"])


def test_model_writer_hands_out_arena_space_and_abort_leaves_nothing(client):
    used = client.stats()["tiers"]["dram"]["used_bytes"]
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((256, 512)).astype(np.float32)
    with client.model_create("mw-a") as w:
        space = w.add_tensor_space("w0", "F32", (256, 512))
        assert space.flags.writeable and space.shape == (256, 512)
        space[...] = w0
        w.seal_tensor("w0")
        w.add_tensor("b", np.arange(10, dtype=np.int64))
        w.add_tensors({"t": w0.T, "bf": np.full(8, 0x3F80, np.uint16)}, {"bf": "BF16"})
        with pytest.raises(cairn.AlreadyExists):
            w.add_tensor("b", np.zeros(1))
        w.set_metadata({"k": 1})
        w.commit("memory").wait(timeout=60)
        assert not w.open
    got = client.load_model("mw-a", copy=True)
    assert list(got) == ["w0", "b", "t", "bf"] and np.array_equal(got["w0"], w0) and np.array_equal(got["t"], w0.T)
    assert client.show("mw-a")["metadata"] == {"k": 1}
    assert [t["dtype"] for t in client.show("mw-a")["tensors"]][-1] == "BF16"

    # An exception in the with block, an explicit abort, a writer dropped, a client closed: nothing stays.
    with pytest.raises(RuntimeError):
        with client.model_create("mw-b") as w:
            w.add_tensor_space("x", np.float32, (1024, 1024))[...] = 1
            raise RuntimeError("training crashed")
    w = client.model_create("mw-c")
    w.add_tensor_space("x", np.float32, (1024, 1024))
    w.abort()
    with pytest.raises(cairn.InvalidArgument, match="committed or aborted"):
        w.add_tensor("y", np.zeros(1))
    w = client.model_create("mw-d")
    w.add_tensor_space("x", np.float32, (1024, 1024))
    del w
    other = cairn.connect(client.address)
    ow = other.model_create("mw-e")
    ow.add_tensor_space("x", np.float32, (1024, 1024))
    other.close()
    assert not ow.open
    for m in ("mw-b", "mw-c", "mw-d", "mw-e"):
        with pytest.raises(cairn.NotFound):
            client.show(m)
    # What is left in use is mw-a's 1 MiB, not the 4 MiB of each dropped model.
    assert client.stats()["tiers"]["dram"]["used_bytes"] < used + (4 << 20)


def test_cuda_tensors_save_and_load_through_the_device_paths(client):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the device-to-arena save and read_device load paths are not exercised")
    sd = {k: v.cuda() for k, v in _model(0).state_dict().items()}
    dcp.save(sd, storage_writer=CairnWriter("dcp-cuda", durability="memory", client=client))
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(target, storage_reader=CairnReader("dcp-cuda", client=client))
    for k, v in sd.items():
        assert torch.equal(target[k], v), k
    on_host = {k: torch.zeros_like(v, device="cpu") for k, v in sd.items()}
    dcp.load(on_host, storage_reader=CairnReader("dcp-cuda", client=client))
    for k, v in sd.items():
        assert torch.equal(on_host[k], v.cpu()), k
