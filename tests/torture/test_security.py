"""Security checks against real daemons, as an attacker would try them:

- a member of the group that replays frames it sent earlier, verbatim, to their own receiver and to
  other members (CAIRN_PEERS_FAULT=replay): every member refuses them (`replayed_frames`,
  `misaddressed_frames` in `cairn peers --json`, the log names the sender and seq), keeps serving
  exact data, and the group keeps working;
- a member that sends forged frames (altered after signing, or signed with another secret) and
  well-signed frames whose bodies no decoder accepts (CAIRN_PEERS_FAULT=forge,garbage_bodies): refused
  and counted (`refused_frames`, `malformed_bodies`), no daemon crashes, data stays exact;
- another uid (a second user created by the test, removed at its end): cannot use the first user's
  daemon (its socket directory is 0700; with the directory opened up, SO_PEERCRED still refuses it,
  through `cairn` and the Python client), cannot join its peer group (its cairnd refuses to start
  and no member lists it), cannot read its arena (a memfd reachable only through /proc/<pid>, which
  the kernel keeps to the owner) nor its burst buffer (cairnd makes it 0700). The repository is shared
  storage whose privacy is its root directory's mode, which cairn leaves to the site: checked both ways.

Real daemons on 127.0.0.x with provider "tcp;ofi_rxm", as tests/integration/test_peers.py; the fixtures
(`tmp`, `make_daemon`, the Daemon class) come from tests/integration/conftest.py.
"""
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cairn_integration_fixtures", ROOT / "tests" / "integration" / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tmp = _fixtures.tmp  # noqa: F811 (pytest fixtures, used by name)
make_daemon = _fixtures.make_daemon
CAIRN, CAIRND, LIBCAIRN, SOURCE = _fixtures.CAIRN, _fixtures.CAIRND, _fixtures.LIBCAIRN, _fixtures.SOURCE

sys.path.insert(0, str(SOURCE / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(LIBCAIRN))
import cairn  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.environ.get("CAIRN_SANITIZED") == "1", reason="multi-daemon suite: normal build only"),
    pytest.mark.skipif(shutil.which("fi_info") is None and not Path("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
                       reason="libfabric is not installed (scripts/deps installs it)"),
]

JOB = "sec-1"


def member(make_daemon, name, repo, index, env=None, nvme=False, rendezvous=None):
    """A daemon of job sec-1 on 127.0.0.<index>, with its own socket, arena and log, on repository `repo`."""
    d = make_daemon(name)
    rdv = rendezvous or (Path(repo).parent / "rdv")
    burst = f"  nvme:\n    path: {d.root / 'nvme'}\n    capacity: 64MiB\n" if nvme else ""
    d.config.write_text(f"socket: {d.socket}\nrepository: {repo}\nchunk_size: 1MiB\n"
                        f"tiers:\n  dram:\n    capacity: 256MiB\n{burst}"
                        f"peers:\n  job: \"{JOB}\"\n  rendezvous: {rdv}\n  provider: \"tcp;ofi_rxm\"\n"
                        f"  address: 127.0.0.{index}\n  timeout: 3s\n"
                        f"log:\n  level: info\n  file: {d.root / 'cairnd.log'}\n")
    d.env.update(env or {})
    return d


def peers_of(d):
    return json.loads(d.cairn("peers", "--json").stdout)


def wait_verified(daemons, views=None, timeout=20):
    """Until every daemon has verified all the others; the views (`cairn peers --json`)."""
    views = views or peers_of
    deadline = time.time() + timeout
    while True:
        got = [views(d) for d in daemons]
        if all(sum(m["state"] == "verified" for m in v["members"]) == len(daemons) - 1 for v in got):
            return got
        if time.time() > deadline:
            raise AssertionError("members did not verify each other: " + json.dumps(got)[:3000])
        time.sleep(0.2)


def model(seed, mib):
    rng = np.random.default_rng(seed)
    n = mib * (1 << 20) // 4 // 4
    return {f"layer{i}.weight": rng.standard_normal(n, dtype=np.float32) for i in range(4)}


def assert_model(d, mid, want, timeout=15):
    """Reads mid through d, exactly. The commit's announcement to the group is asynchronous (and the
    repository's refresh a fallback), so a model committed elsewhere a moment ago may take a moment."""
    deadline = time.time() + timeout
    with cairn.connect(d.socket) as c:
        while True:
            try:
                got = c.load_model(mid, copy=True)
                break
            except cairn.NotFound:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    assert list(got) == list(want), (mid, list(got))
    for k, v in want.items():
        assert np.array_equal(got[k], v), f"model {mid!r} tensor {k!r} read through {d.root.name} differs"


def log_of(d):
    p = d.root / "cairnd.log"
    return p.read_text(errors="replace") if p.exists() else ""


def entry(view, member_id):
    return next(m for m in view["members"] if m["id"] == member_id)


def exchange_through(ds, bad, seed):
    """Models committed at `memory` on the misbehaving member and on an honest one, each read exactly
    through every other member: the group's chunk traffic (lookups, gets, haves, commits) runs while
    `bad` misbehaves."""
    from_bad, from_good = model(seed, 8), model(seed + 1, 8)
    with cairn.connect(bad.socket) as c:
        c.save_model("from-bad", from_bad, durability="memory", wait=True)
    with cairn.connect(ds[0].socket) as c:
        c.save_model("from-good", from_good, durability="memory", wait=True)
    for d in ds:
        if d is not bad:
            assert_model(d, "from-bad", from_bad)
        if d is not ds[0]:
            assert_model(d, "from-good", from_good)
    for d in ds:
        if d is not bad:
            assert d.stats()["movement"]["bytes_from_peer"] > 0, f"{d.root.name} read nothing through the group"


def group_with_a_bad_member(make_daemon, tmp, hooks, seed):
    """Members a and b, and one with the CAIRN_PEERS_FAULT hooks, verified and exchanging models while
    the bad one misbehaves; (a, b, bad, bad's id)."""
    repo = tmp / "repo"
    a = member(make_daemon, "a", repo, 1).start()
    b = member(make_daemon, "b", repo, 2).start()
    bad = member(make_daemon, "bad", repo, 3, env={"CAIRN_PEERS_FAULT": hooks}).start()
    wait_verified([a, b, bad])
    exchange_through([a, b, bad], bad, seed)
    view = peers_of(bad)
    assert view["fault_frames_sent"] > 0, f"the member with {hooks} sent nothing wrong: the test proves nothing"
    return a, b, bad, view["self"]


def still_works(ds, writer, seed):
    """No daemon crashed; all still verify each other; a new model through `writer` reads exactly everywhere."""
    crashed = [d.proc.stderr.read().decode(errors="replace")[-2000:] for d in ds if not d.alive()]
    assert not crashed, crashed
    wait_verified(ds)
    more = model(seed, 4)
    with cairn.connect(writer.socket) as c:
        c.save_model("after", more, durability="memory", wait=True)
    for d in ds:
        if d is not writer:
            assert_model(d, "after", more)


def test_replayed_and_misdirected_frames_are_refused(make_daemon, tmp):
    a, b, r, r_id = group_with_a_bad_member(make_daemon, tmp, "replay", seed=21)
    views = {d.root.name: peers_of(d) for d in (a, b)}
    for name, v in views.items():
        assert v["replayed_frames"] > 0, f"{name} accepted every replayed frame: {v}"
        assert entry(v, r_id)["replayed"] > 0, v
    assert sum(v["misaddressed_frames"] for v in views.values()) > 0, views
    # No honest frame was taken for a replay (frames arrive out of order over two endpoints).
    a_id, b_id = views["a"]["self"], views["b"]["self"]
    assert entry(views["a"], b_id)["replayed"] == 0 and entry(views["b"], a_id)["replayed"] == 0, views
    assert views["a"]["malformed_bodies"] == 0 and views["b"]["malformed_bodies"] == 0, views
    logs = log_of(a) + log_of(b)
    assert f"from member {r_id} (seq " in logs, logs[-3000:]
    assert "a replay (seen before)" in logs or "addressed to another member" in logs, logs[-3000:]
    still_works([a, b, r], b, seed=23)


def test_forged_frames_and_garbage_bodies_are_refused(make_daemon, tmp):
    a, b, f, f_id = group_with_a_bad_member(make_daemon, tmp, "forge,garbage_bodies", seed=31)
    for d in (a, b):
        v = peers_of(d)
        assert v["refused_frames"] > 0, f"{d.root.name} accepted forged frames: {v}"
        assert v["malformed_bodies"] > 0, f"{d.root.name} acted on garbage bodies: {v}"
        assert entry(v, f_id)["state"] == "verified"  # its genuine frames still count
    logs = log_of(a) + log_of(b)
    assert "bad MAC (not signed with this group's secret)" in logs, logs[-3000:]
    assert f"member {f_id} sent a message this daemon cannot read" in logs, logs[-3000:]
    still_works([a, b, f], a, seed=33)


# ---- another uid ----

# What the test's users run. The checkout may sit under a directory only root can enter (/root, a
# `mktemp -d`), so the `users` fixture copies cairnd, cairn, libcairn.so (every name of it) and the Python package to a
# directory every user can read, and they run Debian's python3 (numpy from python3-numpy), not .venv.
AS_USER = types.SimpleNamespace(cairnd=CAIRND, cairn=CAIRN, lib=LIBCAIRN, pypath=SOURCE / "api" / "python",
                                python=sys.executable)


class User:
    def __init__(self, name):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, pw.pw_uid, pw.pw_gid

    def run(self, args, env=None, timeout=120, check=False):
        """Runs args as this user (no supplementary groups), from /."""
        r = subprocess.run([str(a) for a in args], user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                           env=env or self.env(), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} as {self.name} failed ({r.returncode}): {r.stderr}")
        return r

    def env(self, **extra):
        return dict(PATH=os.environ.get("PATH", "/usr/bin:/bin"), HOME="/", LANG="C.UTF-8",
                    PYTHONPATH=str(AS_USER.pypath), CAIRN_LIBRARY=str(AS_USER.lib),
                    LD_LIBRARY_PATH=str(Path(AS_USER.lib).parent), **extra)

    def python(self, code, **extra_env):
        return self.run([AS_USER.python, "-c", code], env=self.env(**extra_env))

    def own(self, path, mode):
        os.chown(path, self.uid, self.gid)
        os.chmod(path, mode)


@pytest.fixture
def users():
    """Two users made for the test (the daemons' owner and an intruder), removed at its end. Request it
    before make_daemon: fixtures end in reverse order, so the users' daemons are stopped (by pid) first."""
    if os.geteuid() != 0:
        pytest.skip("the other-uid checks create users (useradd) and need root; run the suite as root to include them")
    if not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("useradd/userdel are not installed: cannot create the second user")
    shared = Path(tempfile.mkdtemp(prefix="cairn-sec-bin-", dir="/tmp"))
    # The tool links libcairn.so by its soname (libcairn.so.0): every name of the library is copied,
    # and the users' environment puts the directory on LD_LIBRARY_PATH.
    for src in (CAIRND, CAIRN, *sorted(LIBCAIRN.parent.glob(LIBCAIRN.name + "*"))):
        shutil.copy2(src, shared / src.name)
    shutil.copytree(SOURCE / "api" / "python" / "cairn", shared / "python" / "cairn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(shared):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o755)
    saved = dict(vars(AS_USER))
    AS_USER.cairnd, AS_USER.cairn, AS_USER.lib = shared / CAIRND.name, shared / CAIRN.name, shared / LIBCAIRN.name
    AS_USER.pypath = shared / "python"
    AS_USER.python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    made = []
    try:
        for role in ("own", "oth"):
            name = f"cairn{role}{secrets.token_hex(3)}"
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            made.append(name)
        yield [User(n) for n in made]
    finally:
        vars(AS_USER).update(saved)
        shutil.rmtree(shared, ignore_errors=True)
        left = [name for name in made if subprocess.run(["userdel", name], capture_output=True).returncode != 0]
        assert not left, f"could not remove the test's users {left} (userdel failed: a process of theirs still runs?)"


def start_as(user, d, timeout=30):
    """Starts daemon d as user (the fixture still stops it by pid); waits until its owner can talk to it."""
    d.proc = subprocess.Popen([str(AS_USER.cairnd), "--config", str(d.config)], env=user.env(CAIRN_SOCKET=d.socket),
                              user=user.uid, group=user.gid, extra_groups=[], cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if d.proc.poll() is not None:
            raise RuntimeError(f"cairnd as {user.name} exited with {d.proc.returncode}: {d.proc.stderr.read().decode()}")
        if user.run([AS_USER.cairn, "ls"], env=user.env(CAIRN_SOCKET=d.socket)).returncode == 0:
            return d
        time.sleep(0.1)
    raise RuntimeError(f"cairnd as {user.name} did not start in time")


def peers_as(user, d):
    return json.loads(user.run([AS_USER.cairn, "peers", "--json"], env=user.env(CAIRN_SOCKET=d.socket), check=True).stdout)


SAVE = """
import sys, numpy as np, cairn
with cairn.connect(sys.argv[1]) as c:
    for mid, level in (("priv-local", "local"), ("priv-global", "global")):
        rng = np.random.default_rng(len(mid))
        c.save_model(mid, {"w": rng.standard_normal(1 << 18, dtype=np.float32)}, durability=level, wait=True)
"""

# Tries each path as the current user; prints {path: "read" | "denied: <errno name>" | "missing"}.
TRY_READ = """
import errno, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as f:
                f.read(1)
        out[p] = "read"
    except FileNotFoundError:
        out[p] = "missing"
    except OSError as e:
        out[p] = "denied: " + errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def try_read(user, paths):
    r = user.run([AS_USER.python, "-c", TRY_READ, *paths])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_another_uid_cannot_use_join_or_read_the_daemons_of_a_user(users, make_daemon, tmp):
    owner, other = users
    # A layout every user can walk through, so that what protects each part is cairn's own modes.
    os.chmod(tmp, 0o755)
    repo = tmp / "repo"
    repo.mkdir()
    owner.own(repo, 0o755)
    rdv = repo / ".peers"
    ds = []
    for i, name in enumerate(("a1", "a2")):
        d = member(make_daemon, name, repo, i + 1, nvme=True, rendezvous=rdv)
        owner.own(d.root, 0o755)
        ds.append(start_as(owner, d))
    a1, a2 = ds
    wait_verified(ds, views=lambda d: peers_as(owner, d))
    r = owner.run([AS_USER.python, "-c", SAVE, a1.socket])
    assert r.returncode == 0, r.stderr

    # (a) The socket directory is the owner's, 0700: the other user cannot even reach the socket.
    run_dir = Path(a1.socket).parent
    st = run_dir.stat()
    assert st.st_uid == owner.uid and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    r = other.run([AS_USER.cairn, "ls"], env=other.env(CAIRN_SOCKET=a1.socket))
    assert r.returncode != 0 and "ermission denied" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # Opened up (as a careless site might), SO_PEERCRED still refuses it, with the reason.
    os.chmod(run_dir, 0o711)
    os.chmod(a1.socket, 0o777)
    try:
        r = other.run([AS_USER.cairn, "ls"], env=other.env(CAIRN_SOCKET=a1.socket))
        assert r.returncode != 0, r.stdout
        assert f"cairnd serves only uid {owner.uid}; start your own daemon" in r.stderr, r.stderr
        assert "priv-global" not in r.stdout
        r = other.python("import os, cairn\n"
                         "try:\n"
                         "    with cairn.connect(os.environ['CAIRN_SOCKET']) as c: print('LISTED', c.ls())\n"
                         "except cairn.CairnError as e: print('REFUSED', type(e).__name__, e)\n",
                         CAIRN_SOCKET=a1.socket)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("REFUSED PermissionDenied") and f"serves only uid {owner.uid}" in r.stdout, r.stdout
        # The owner, through the same socket, is served (the refusal is about the uid).
        r = owner.run([AS_USER.cairn, "ls"], env=owner.env(CAIRN_SOCKET=a1.socket))
        assert r.returncode == 0 and "priv-global" in r.stdout, (r.stdout, r.stderr)
    finally:
        os.chmod(a1.socket, 0o755)
        os.chmod(run_dir, 0o700)

    # (b) The other user's cairnd, same job and rendezvous directory: it cannot join.
    group_dir = rdv / JOB
    assert stat.S_IMODE(group_dir.stat().st_mode) == 0o700 and group_dir.stat().st_uid == owner.uid
    assert stat.S_IMODE((group_dir / "secret").stat().st_mode) == 0o600
    got = try_read(other, [str(group_dir / "secret"), str(group_dir / "members")])
    assert all(v.startswith("denied") for v in got.values()), got
    intruder = member(make_daemon, "intruder", tmp / "intruder-repo", 3, rendezvous=rdv)
    (tmp / "intruder-repo").mkdir()
    other.own(tmp / "intruder-repo", 0o755)
    other.own(intruder.root, 0o755)
    proc = subprocess.Popen([str(AS_USER.cairnd), "--config", str(intruder.config)],
                            env=other.env(CAIRN_SOCKET=intruder.socket), user=other.uid, group=other.gid,
                            extra_groups=[], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    intruder.proc = proc
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the other user's cairnd kept running in the owner's group")
    err = err.decode(errors="replace") + log_of(intruder)
    assert proc.returncode != 0, err
    assert f"belongs to uid {owner.uid}" in err and "another user's job cannot be joined" in err, err
    for d in ds:
        v = peers_as(owner, d)
        assert len(v["members"]) == 2 and all(m["state"] in ("self", "verified") for m in v["members"]), v
    assert len(list((group_dir / "members").glob("*.json"))) == 2

    # (c) The arena: a memfd, reachable only through /proc/<pid>/fd, /proc/<pid>/map_files and
    # /proc/<pid>/mem, which the kernel keeps to the owner; no /dev/shm segment to find.
    pid = a1.proc.pid
    memfds = [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")]
    assert memfds, "no memfd in the daemon's descriptors: where is the arena?"
    got = try_read(other, memfds + [f"/proc/{pid}/mem", f"/proc/{pid}/map_files", f"/proc/{pid}/fd"])
    assert all(v.startswith("denied") for v in got.values()), got
    shm = [p for p in Path("/dev/shm").iterdir() if p.stat().st_uid == owner.uid]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 == 0 for p in shm), [(p, oct(p.stat().st_mode)) for p in shm]
    # The burst buffer: cairnd creates its directory 0700; the files in it are out of reach.
    burst = a1.root / "nvme"
    assert stat.S_IMODE(burst.stat().st_mode) == 0o700 and burst.stat().st_uid == owner.uid
    got = try_read(other, [str(burst), str(burst / "data"), str(burst / "journal")])
    assert all(v.startswith("denied") for v in got.values()), got
    # The repository is shared storage (0755 directories, 0644 files): its privacy is its root's mode,
    # the site's choice. Readable through a 0755 root; not through a 0700 one.
    files = [str(p) for p in repo.rglob("*") if p.is_file() and ".peers" not in p.parts]
    assert files, "nothing in the repository"
    assert all(v == "read" for v in try_read(other, files).values())
    os.chmod(repo, 0o700)
    assert all(v.startswith("denied") for v in try_read(other, files).values())
    # The owner's daemons do not mind: the model is still read exactly through the other member.
    r = owner.python("import os, numpy as np, cairn\n"
                     "with cairn.connect(os.environ['CAIRN_SOCKET']) as c:\n"
                     "    got = c.load_model('priv-global', copy=True)['w']\n"
                     "want = np.random.default_rng(len('priv-global')).standard_normal(1 << 18, dtype=np.float32)\n"
                     "print('EXACT' if np.array_equal(got, want) else 'DIFFERS')\n", CAIRN_SOCKET=a2.socket)
    assert r.stdout.strip() == "EXACT", (r.stdout, r.stderr)
