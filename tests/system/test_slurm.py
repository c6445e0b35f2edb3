"""The Slurm prolog, task prolog and epilog (workflow/slurm/) on a real one-node Slurm cluster
(slurm_cluster.py), with cairn installed into a prefix as a site would install it and the site
config at <prefix>/etc/cairn/site.yaml. Jobs run as two non-root test users."""
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import slurm_cluster

BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
USERS = ("cairnt1", "cairnt2")

pytestmark = pytest.mark.skipif(slurm_cluster.missing_reason() is not None,
                                reason=slurm_cluster.missing_reason() or "")


def write_site(prefix, root, **overrides):
    lines = {
        "enable": "opt-in",
        "repository": root + "/repos/${USER}",
        "job_dir": root + "/run",
        "drain_timeout": "60s",
        "start_timeout": "20s",
        "stop_timeout": "30s",
    }
    lines.update(overrides)
    text = "".join("%s: %s\n" % (k, v) for k, v in lines.items() if k != "daemon")
    text += lines.get("daemon", "daemon:\n  tiers:\n    dram:\n      capacity: 128MiB\n"
                      "    nvme:\n      path: %s/nvme\n      capacity: 256MiB\n" % root)
    os.makedirs(os.path.join(prefix, "etc", "cairn"), exist_ok=True)
    with open(os.path.join(prefix, "etc", "cairn", "site.yaml"), "w") as f:
        f.write(text)


@pytest.fixture(scope="module")
def env():
    # Not under pytest's tmp_path: that is mode 0700, and the test users must reach their files.
    root = tempfile.mkdtemp(prefix="cairn-slurm-", dir="/tmp")
    os.chmod(root, 0o755)
    for d in ("repos", "nvme", "work"):
        os.makedirs(os.path.join(root, d))
        os.chmod(os.path.join(root, d), 0o1777)
    prefix = os.path.join(root, "prefix")
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    assert p.returncode == 0, p.stdout
    for script in ("prolog", "task_prolog", "epilog"):
        assert os.access(os.path.join(prefix, "share", "cairn", "slurm", script), os.X_OK), script
    write_site(prefix, root)
    users = {u: slurm_cluster.ensure_user(u) for u in USERS}
    work = {}
    models = [{"w": np.random.default_rng(k).standard_normal((256, 512)).astype(np.float32)} for k in range(40)]
    rng = np.random.default_rng(7)
    model = {"w": rng.standard_normal((512, 1024)).astype(np.float32), "b": np.arange(1024, dtype=np.float32)}
    for u, pw in users.items():
        w = os.path.join(root, "work", u)
        os.makedirs(w)
        save_file(model, os.path.join(w, "m.safetensors"))
        os.makedirs(os.path.join(w, "models"))
        for k, m in enumerate(models):
            save_file(m, os.path.join(w, "models", "m%d.safetensors" % k))
        for dirpath, _, files in os.walk(w):
            os.chown(dirpath, pw.pw_uid, pw.pw_gid)
            for f in files:
                os.chown(os.path.join(dirpath, f), pw.pw_uid, pw.pw_gid)
        work[u] = w
    cluster = slurm_cluster.SlurmCluster(os.path.join(root, "slurm"), prefix)
    os.makedirs(cluster.root)
    cluster.start()
    cluster.env["PATH"] = os.path.join(prefix, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin"
    yield {"root": root, "prefix": prefix, "cluster": cluster, "work": work, "model": model, "models": models}
    cluster.stop()
    # Nothing of cairn may outlive the tests (the epilog stops every daemon; this is a backstop).
    leftovers = daemons_under(root)
    for pid in leftovers:
        slurm_cluster.stop_pid(pid)
    assert not leftovers, "cairnd processes left running: %s" % leftovers
    shutil.rmtree(root, ignore_errors=True)


def daemons_under(root):
    """pids of cairnd processes started from this test's installed tree."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.readlink("/proc/%s/exe" % entry)
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if exe.startswith(root) and os.path.basename(exe).startswith("cairnd") and root in cmd:
            found.append(int(entry))
    return found


def write_script(env, user, name, body):
    path = os.path.join(env["work"][user], name)
    with open(path, "w") as f:
        f.write("#!/bin/bash\nset -u\n" + body)
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    os.chmod(path, 0o755)
    return path


def job_output(env, user, job):
    with open(os.path.join(env["work"][user], "slurm-%s.out" % job)) as f:
        return f.read()


def assert_job_cleaned(env, job):
    run = os.path.join(env["root"], "run")
    assert not os.path.exists(os.path.join(run, job)), "the job directory is still there"
    assert not os.path.exists(os.path.join(run, job + ".pid")), "the pidfile is still there"
    assert daemons_under(env["root"]) == [], "a cairnd is still running after the job"


def repository_models(env, user, ids):
    """Reads models back from the user's repository through a daemon of the user's own, started
    and stopped with `cairn job start|stop` as that user (the non-root path)."""
    bin_dir = os.path.join(env["prefix"], "bin")
    c = env["cluster"]
    job_dir = os.path.join(env["work"][user], "verify-jobs")
    common = ["--job", "verify", "--job-dir", job_dir]
    p = c.run_as(user, [bin_dir + "/cairn", "job", "start"] + common)
    assert p.returncode == 0 and "export CAIRN_SOCKET=" in p.stdout, p.stdout
    sock = p.stdout.split("export CAIRN_SOCKET=")[1].split()[0]
    out = {}
    try:
        uenv = dict(c.env, CAIRN_SOCKET=sock)
        for i in ids:
            dest = os.path.join(env["work"][user], "verify-%s.safetensors" % i)
            g = c.run_as(user, [bin_dir + "/cairn", "get", i, "-o", dest], env=uenv)
            out[i] = load_file(dest) if g.returncode == 0 else g.stdout
    finally:
        s = c.run_as(user, [bin_dir + "/cairn", "job", "stop"] + common)
        assert s.returncode == 0, s.stdout
    return out


def test_job_with_cairn_gets_a_daemon_in_every_task_and_the_model_outlives_it(env):
    c = env["cluster"]
    script = write_script(env, "cairnt1", "put.sh", """
srun -n 2 bash -c 'echo "task $SLURM_PROCID socket=${CAIRN_SOCKET:-none} uid=$(id -u)"'
ps -o user=,args= -C cairnd | grep -- "--config" | sed 's/^/daemon: /'
cairn put put-model m.safetensors --durability memory
cairn get put-model -o back.safetensors && echo got-back
""")
    job = c.submit("cairnt1", script, env["work"]["cairnt1"], comment="train with cairn", extra=["-n", "2"])
    assert c.wait_ended(job) == "COMPLETED", job_output(env, "cairnt1", job)
    out = job_output(env, "cairnt1", job)
    sock = os.path.join(env["root"], "run", job, "cairnd.sock")
    for task in (0, 1):
        assert "task %d socket=%s" % (task, sock) in out, out
    assert "daemon: cairnt1 " in out, "the daemon did not run as the job's user:\n" + out
    assert "got-back" in out, out
    assert_job_cleaned(env, job)
    got = repository_models(env, "cairnt1", ["put-model"])["put-model"]
    assert isinstance(got, dict), got
    for k, v in env["model"].items():
        np.testing.assert_array_equal(got[k], v)


def test_scancel_while_writing_leaves_nothing_running_and_every_acknowledged_model_stored(env):
    c = env["cluster"]
    script = write_script(env, "cairnt1", "writer.sh", """
rm -f acked.txt
for i in $(seq 0 100000); do
  d=local; [ $((i % 2)) = 0 ] && d=global
  if cairn put "w$SLURM_JOB_ID-$i" models/m$((i % 40)).safetensors --durability $d >/dev/null 2>>writer.err; then
    echo "w$SLURM_JOB_ID-$i" >> acked.txt
  fi
done
""")
    acked = os.path.join(env["work"]["cairnt1"], "acked.txt")
    job = c.submit("cairnt1", script, env["work"]["cairnt1"], comment="cairn")
    c.wait_state(job, ("RUNNING",))
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(acked) and len(open(acked).read().split()) >= 8:
            break
        time.sleep(0.05)
    subprocess.run(["scancel", job], env=c.env, check=True)
    assert c.wait_ended(job) == "CANCELLED"
    assert_job_cleaned(env, job)
    ids = open(acked).read().split()
    assert len(ids) >= 8
    got = repository_models(env, "cairnt1", ids)
    for i in ids:
        assert isinstance(got[i], dict), "%s was acknowledged but is not in the repository: %s" % (i, got[i])
        k = int(i.rsplit("-", 1)[1]) % 40
        np.testing.assert_array_equal(got[i]["w"], env["models"][k]["w"])


def test_two_users_get_two_daemons_and_cannot_reach_each_other(env):
    c = env["cluster"]
    jobs = {}
    for u in USERS:
        script = write_script(env, u, "hold.sh", """
echo "socket=$CAIRN_SOCKET"
cairn put mine-$USER m.safetensors --durability memory
while [ ! -e release ]; do sleep 0.1; done
""")
        jobs[u] = c.submit(u, script, env["work"][u], comment="cairn")
    try:
        for u, job in jobs.items():
            c.wait_state(job, ("RUNNING",))
        socks = {u: os.path.join(env["root"], "run", job, "cairnd.sock") for u, job in jobs.items()}
        deadline = time.time() + 30
        while time.time() < deadline and not all(os.path.exists(s) for s in socks.values()):
            time.sleep(0.1)
        owners = sorted(os.stat("/proc/%d" % pid).st_uid for pid in daemons_under(env["root"]))
        assert owners == sorted(pwd.getpwnam(u).pw_uid for u in USERS), owners
        bin_dir = os.path.join(env["prefix"], "bin")
        for me, other in (("cairnt1", "cairnt2"), ("cairnt2", "cairnt1")):
            mode = os.stat(os.path.dirname(socks[other])).st_mode
            assert stat.S_IMODE(mode) == 0o700
            p = c.run_as(me, [bin_dir + "/cairn", "ls"], env=dict(c.env, CAIRN_SOCKET=socks[other]))
            assert p.returncode != 0, "%s reached %s's daemon: %s" % (me, other, p.stdout)
            own = c.run_as(me, [bin_dir + "/cairn", "ls"], env=dict(c.env, CAIRN_SOCKET=socks[me]))
            assert own.returncode == 0, own.stdout
    finally:
        for u in USERS:
            open(os.path.join(env["work"][u], "release"), "w").close()
    # Both jobs are released together: wait for both to end before looking for leftover daemons,
    # or the other user's job may still be in its epilog.
    for u, job in jobs.items():
        assert c.wait_ended(job) == "COMPLETED", job_output(env, u, job)
        os.unlink(os.path.join(env["work"][u], "release"))
    for job in jobs.values():
        assert_job_cleaned(env, job)


def test_job_without_the_opt_in_gets_no_daemon_but_can_start_its_own(env):
    c = env["cluster"]
    script = write_script(env, "cairnt2", "plain.sh", """
echo "socket=${CAIRN_SOCKET:-none}"
ls "%s/run/$SLURM_JOB_ID" 2>/dev/null && echo "a job directory exists"
# A site without the prolog: the user starts one daemon per node from inside the allocation.
eval "$(srun --ntasks-per-node=1 --overlap cairn job start)"
echo "own=$CAIRN_SOCKET"
cairn put own-model m.safetensors --durability global && echo stored
srun --ntasks-per-node=1 --overlap cairn job stop 2>stop.err && echo stopped
grep -o "summary: 1 model committed" stop.err
# The user's own daemon keeps its summary in the user's own place.
cairn job summary $SLURM_JOB_ID --json > own-summary.json && echo summary-kept
""" % env["root"])
    job = c.submit("cairnt2", script, env["work"]["cairnt2"])
    assert c.wait_ended(job) == "COMPLETED", job_output(env, "cairnt2", job)
    out = job_output(env, "cairnt2", job)
    assert "socket=none" in out and "a job directory exists" not in out, out
    assert "own=/" in out and "stored" in out and "stopped" in out, out
    assert "summary: 1 model committed" in out and "summary-kept" in out, out
    with open(os.path.join(env["work"]["cairnt2"], "own-summary.json")) as f:
        own = json.load(f)
    assert own["job"] == job and own["user"] == "cairnt2" and own["models"]["committed"] == 1, own
    kept = "/tmp/cairn-%d/jobs/%s.summary.json" % (pwd.getpwnam("cairnt2").pw_uid, job)
    assert os.stat(kept).st_mode & 0o777 == 0o600
    os.unlink(kept)
    assert_job_cleaned(env, job)
    got = repository_models(env, "cairnt2", ["own-model"])["own-model"]
    assert isinstance(got, dict), got


def test_daemon_that_cannot_start_leaves_the_job_running_and_logs_why(env):
    c = env["cluster"]
    write_site(env["prefix"], env["root"],
               daemon="daemon:\n  tiers:\n    dram:\n      capacity: banana\n")
    try:
        script = write_script(env, "cairnt1", "nodaemon.sh", 'echo "socket=${CAIRN_SOCKET:-none}"; echo ran\n')
        job = c.submit("cairnt1", script, env["work"]["cairnt1"], comment="cairn")
        assert c.wait_ended(job) == "COMPLETED", job_output(env, "cairnt1", job)
    finally:
        write_site(env["prefix"], env["root"])
    out = job_output(env, "cairnt1", job)
    assert "socket=none" in out and "ran" in out, out
    with open(os.path.join(env["root"], "run", "cairn-job.log")) as f:
        lines = [ln for ln in f if "job %s:" % job in ln]
    assert any("capacity" in ln and "banana" in ln and "without cairn" in ln for ln in lines), lines
    assert_job_cleaned(env, job)


def wrap_node_scripts(env, sysfs):
    """Makes the installed prolog and epilog run with CAIRN_TEST_SYSFS_ROOT=sysfs (slurmd gives
    them no environment of its own); returns a function that puts the originals back."""
    slurm = os.path.join(env["prefix"], "share", "cairn", "slurm")
    for name in ("prolog", "epilog"):
        path = os.path.join(slurm, name)
        os.rename(path, path + ".real")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nCAIRN_TEST_SYSFS_ROOT=%s exec %s.real \"$@\"\n" % (sysfs, path))
        os.chmod(path, 0o755)

    def unwrap():
        for name in ("prolog", "epilog"):
            path = os.path.join(slurm, name)
            os.rename(path + ".real", path)
    return unwrap


def test_a_job_ends_with_a_summary_for_its_user_and_the_node_setting_is_restored_by_the_last_job(env):
    c = env["cluster"]
    sysfs = os.path.join(env["root"], "sys")
    thp = os.path.join(sysfs, "kernel", "mm", "transparent_hugepage", "shmem_enabled")
    os.makedirs(os.path.dirname(thp), exist_ok=True)
    with open(thp, "w") as f:
        f.write("always within_size advise [never] deny force\n")
    bin_dir = os.path.join(env["prefix"], "bin")
    write_site(env["prefix"], env["root"], node="{shmem_thp: advise}")
    unwrap = wrap_node_scripts(env, sysfs)
    release = os.path.join(env["work"]["cairnt2"], "release-node")
    holder = holder_state = None
    try:
        # cairnt2's job holds the node while cairnt1's job runs and ends.
        hold = write_script(env, "cairnt2", "hold-node.sh", "while [ ! -e release-node ]; do sleep 0.1; done\n")
        holder = c.submit("cairnt2", hold, env["work"]["cairnt2"], comment="cairn")
        c.wait_state(holder, ("RUNNING",))
        deadline = time.time() + 30  # RUNNING may come before the prolog is done
        while open(thp).read().strip() != "advise" and time.time() < deadline:
            time.sleep(0.1)
        assert open(thp).read().strip() == "advise"
        work = write_script(env, "cairnt1", "summary.sh", """
cairn put sum-base m.safetensors --durability memory
cairn put sum-child m.safetensors --parent sum-base --durability memory
cairn get sum-base -o sum1.safetensors && cairn get sum-child -o sum2.safetensors && echo loaded
""")
        job = c.submit("cairnt1", work, env["work"]["cairnt1"], comment="cairn")
        assert c.wait_ended(job) == "COMPLETED", job_output(env, "cairnt1", job)
        assert "loaded" in job_output(env, "cairnt1", job)
        assert open(thp).read().strip() == "advise", "restored while another cairn job still runs"
    finally:
        open(release, "w").close()
        try:
            if holder:
                holder_state = c.wait_ended(holder)
        finally:
            unwrap()
            write_site(env["prefix"], env["root"])
            os.unlink(release)
    assert holder_state == "COMPLETED", job_output(env, "cairnt2", holder)
    assert open(thp).read().strip() == "never"
    assert not os.path.exists(os.path.join(env["root"], "run", "node-settings.json"))
    assert_job_cleaned(env, job)
    assert_job_cleaned(env, holder)

    # The job log: the summary of cairnt1's job, and the node setting applied and restored.
    with open(os.path.join(env["root"], "run", "cairn-job.log")) as f:
        log = f.readlines()
    mine = [ln for ln in log if "job %s:" % job in ln]
    assert any("summary: 2 models committed" in ln and "4 models loaded" in ln for ln in mine), mine
    assert any("node: shmem_enabled set to 'advise' (was 'never'" in ln for ln in log if "job %s:" % holder in ln), log
    assert any("node: shmem_enabled restored to 'never'" in ln for ln in log if "job %s:" % holder in ln), log

    # The user reads it afterwards, as a table and as JSON; the other user cannot.
    table = c.run_as("cairnt1", [bin_dir + "/cairn", "job", "summary", job])
    assert table.returncode == 0, table.stdout
    assert "cairn job %s (user cairnt1" % job in table.stdout, table.stdout
    assert re.search(r"^ +models committed +2$", table.stdout, re.M), table.stdout
    # Each `cairn get` opens its model twice (the description, and the file's original header).
    assert re.search(r"^ +models loaded +4$", table.stdout, re.M), table.stdout
    assert re.search(r"^ +time processes waited on cairn +\d+\.\d+ s over \d+ requests$", table.stdout, re.M), table.stdout
    got = c.run_as("cairnt1", [bin_dir + "/cairn", "job", "summary", job, "--json"])
    assert got.returncode == 0, got.stdout
    summary = json.loads(got.stdout)
    nbytes = sum(v.nbytes for v in env["model"].values())
    assert summary["job"] == job and summary["user"] == "cairnt1", summary
    assert summary["models"] == {"committed": 2, "loaded": 4}, summary
    # The child repeats its parent's bytes: not written again, whether the tool inherits them or
    # the daemon deduplicates them.
    committed = summary["committed_bytes"]
    assert committed["stored"] + committed["deduplicated"] + committed["inherited"] == 2 * nbytes, summary
    assert committed["deduplicated"] + committed["inherited"] >= nbytes, summary
    assert summary["loaded_bytes"]["dram"] == 2 * nbytes, summary
    assert summary["requests"] > 0 and summary["wait_seconds"] > 0, summary
    other = c.run_as("cairnt2", [bin_dir + "/cairn", "job", "summary", job])
    assert other.returncode != 0 and "is not yours" in other.stdout, other.stdout
