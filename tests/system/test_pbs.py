"""cairn's PBS hook (workflow/pbs/cairn_hook.py), installed into a prefix, fed execjob_begin,
execjob_launch and execjob_end events by a fake `pbs` module (tests/system/fake_pbs), starting and
stopping a real cairnd as a non-root test user."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fake_pbs"))
import pbs  # noqa: E402  (the fake)
import slurm_cluster  # noqa: E402  (ensure_user, stop_pid)

BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
USER = "cairnt1"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the PBS hook test needs root (the hook starts the daemon as another user)")


@pytest.fixture(scope="module")
def site():
    root = tempfile.mkdtemp(prefix="cairn-pbs-", dir="/tmp")
    os.chmod(root, 0o755)
    os.makedirs(os.path.join(root, "repos"))
    os.chmod(os.path.join(root, "repos"), 0o1777)
    prefix = os.path.join(root, "prefix")
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    assert p.returncode == 0, p.stdout
    hook = os.path.join(prefix, "share", "cairn", "pbs", "cairn_hook.py")
    assert os.path.exists(hook)
    site_yaml = os.path.join(root, "site.yaml")
    with open(site_yaml, "w") as f:
        f.write("enable: opt-in\nrepository: %s/repos/${USER}\njob_dir: %s/run\ndrain_timeout: 60s\n"
                "daemon:\n  tiers:\n    dram:\n      capacity: 64MiB\n" % (root, root))
    config = os.path.join(root, "cairn_hook.json")
    with open(config, "w") as f:
        json.dump({"cairn": os.path.join(prefix, "bin", "cairn"), "site": site_yaml}, f)
    pbs.hook_config_filename = config
    pw = slurm_cluster.ensure_user(USER)
    work = os.path.join(root, "work")
    os.makedirs(work)
    os.chown(work, pw.pw_uid, pw.pw_gid)
    model = {"w": np.random.default_rng(3).standard_normal((128, 256)).astype(np.float32)}
    save_file(model, os.path.join(work, "m.safetensors"))
    os.chmod(os.path.join(work, "m.safetensors"), 0o644)
    yield {"root": root, "prefix": prefix, "hook": hook, "work": work, "model": model, "site": site_yaml}
    shutil.rmtree(root, ignore_errors=True)


def as_user(args, env=None):
    return subprocess.run(["runuser", "-u", USER, "--"] + args, env=env or os.environ.copy(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, cwd="/")


def daemon_pid(site, job):
    with open(os.path.join(site["root"], "run", job + ".pid")) as f:
        return int(f.read())


def test_begin_launch_end_run_a_real_daemon_for_the_job(site):
    job = pbs.Job("4242.pbs-server", USER, Variable_List={"CAIRN": "1", "PBS_O_HOME": "/nonexistent"})
    ev = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_BEGIN, job))
    assert ev.accepted, ev.reject_message
    pid = daemon_pid(site, job.id)
    assert os.stat("/proc/%d" % pid).st_uid == slurm_cluster.ensure_user(USER).pw_uid
    launch = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_LAUNCH, job))
    sock = os.path.join(site["root"], "run", job.id, "cairnd.sock")
    assert launch.accepted and launch.env.get("CAIRN_SOCKET") == sock, launch.env
    cairn = os.path.join(site["prefix"], "bin", "cairn")
    p = as_user([cairn, "put", "pbs-model", os.path.join(site["work"], "m.safetensors"), "--durability", "memory"],
                env=dict(os.environ, CAIRN_SOCKET=sock))
    assert p.returncode == 0, p.stdout
    end = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_END, job))
    assert end.accepted
    assert not os.path.exists(os.path.join(site["root"], "run", job.id))
    assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z"
    # The model is in the user's repository: read it back through a daemon of the user's own.
    jobs = os.path.join(site["work"], "verify")
    start = as_user([cairn, "job", "start", "--job", "v1", "--job-dir", jobs, "--site", site["site"]])
    assert start.returncode == 0, start.stdout
    vsock = start.stdout.split("export CAIRN_SOCKET=")[1].split()[0]
    out = os.path.join(site["work"], "back.safetensors")
    try:
        g = as_user([cairn, "get", "pbs-model", "-o", out], env=dict(os.environ, CAIRN_SOCKET=vsock))
        assert g.returncode == 0, g.stdout
        np.testing.assert_array_equal(load_file(out)["w"], site["model"]["w"])
    finally:
        as_user([cairn, "job", "stop", "--job", "v1", "--job-dir", jobs, "--site", site["site"]])


def test_a_job_that_does_not_opt_in_gets_nothing(site):
    job = pbs.Job("4243.pbs-server", USER)
    assert pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_BEGIN, job)).accepted
    assert not os.path.exists(os.path.join(site["root"], "run", job.id))
    launch = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_LAUNCH, job))
    assert "CAIRN_SOCKET" not in launch.env
    assert pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_END, job)).accepted


def test_opt_in_by_comment_and_a_failed_start_does_not_reject_the_job(site):
    with open(site["site"]) as f:
        good = f.read()
    try:
        with open(site["site"], "w") as f:
            f.write(good.replace("capacity: 64MiB", "capacity: lots"))
        job = pbs.Job("4244.pbs-server", USER, comment="cairn please")
        ev = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_BEGIN, job))
        assert ev.accepted, ev.reject_message
        assert any("capacity" in m and "lots" in m for _, m in pbs.log), pbs.log
        # With on_failure: drain, the same failure rejects the begin event (PBS then offlines the node).
        with open(site["site"], "w") as f:
            f.write(good.replace("capacity: 64MiB", "capacity: lots") + "on_failure: drain\n")
        ev = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_BEGIN, pbs.Job("4245.pbs-server", USER, comment="cairn")))
        assert ev.accepted is False and "capacity" in ev.reject_message
    finally:
        with open(site["site"], "w") as f:
            f.write(good)
    for j in ("4244.pbs-server", "4245.pbs-server"):
        assert pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_END, pbs.Job(j, USER))).accepted
        assert not os.path.exists(os.path.join(site["root"], "run", j))


def test_end_keeps_the_job_summary_and_restores_the_node_setting(site, monkeypatch):
    # The node setting goes to a file of the test's own (the CAIRN_TEST_SYSFS_ROOT test hook), which
    # the hook's `cairn job` inherits from this process.
    sysfs = os.path.join(site["root"], "sys")
    thp = os.path.join(sysfs, "kernel", "mm", "transparent_hugepage", "shmem_enabled")
    os.makedirs(os.path.dirname(thp), exist_ok=True)
    with open(thp, "w") as f:
        f.write("always within_size advise [never] deny force\n")
    monkeypatch.setenv("CAIRN_TEST_SYSFS_ROOT", sysfs)
    with open(site["site"]) as f:
        good = f.read()
    job = pbs.Job("4246.pbs-server", USER, comment="cairn")
    cairn = os.path.join(site["prefix"], "bin", "cairn")
    try:
        with open(site["site"], "w") as f:
            f.write(good + "node: {shmem_thp: advise}\n")
        ev = pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_BEGIN, job))
        assert ev.accepted, ev.reject_message
        assert open(thp).read().strip() == "advise"
        sock = os.path.join(site["root"], "run", job.id, "cairnd.sock")
        uenv = dict(os.environ, CAIRN_SOCKET=sock)
        p = as_user([cairn, "put", "sum-model", os.path.join(site["work"], "m.safetensors")], env=uenv)
        assert p.returncode == 0, p.stdout
        p = as_user([cairn, "get", "sum-model", "-o", os.path.join(site["work"], "sum.safetensors")], env=uenv)
        assert p.returncode == 0, p.stdout
        assert pbs.run_hook(site["hook"], pbs.Event(pbs.EXECJOB_END, job)).accepted
    finally:
        with open(site["site"], "w") as f:
            f.write(good)
    assert open(thp).read().strip() == "never"
    assert not os.path.exists(os.path.join(site["root"], "run", "node-settings.json"))
    with open(os.path.join(site["root"], "run", "cairn-job.log")) as f:
        lines = [ln for ln in f if "job %s:" % job.id in ln]
    assert any("node: shmem_enabled set to 'advise' (was 'never'" in ln for ln in lines), lines
    assert any("node: shmem_enabled restored to 'never'" in ln for ln in lines), lines
    assert any("summary: 1 model committed" in ln and "2 models loaded" in ln for ln in lines), lines
    # The user reads it afterwards: a table, and the JSON as stored.
    table = as_user([cairn, "job", "summary", job.id, "--site", site["site"]])
    assert table.returncode == 0, table.stdout
    assert "cairn job %s (user %s" % (job.id, USER) in table.stdout, table.stdout
    got = as_user([cairn, "job", "summary", job.id, "--site", site["site"], "--json"])
    assert got.returncode == 0, got.stdout
    summary = json.loads(got.stdout)
    nbytes = site["model"]["w"].nbytes
    # `cairn get` opens the model twice: for its description and for the file's original header.
    assert summary["models"] == {"committed": 1, "loaded": 2}, summary
    # Stored, or deduplicated against the same bytes another test put into this repository.
    assert summary["committed_bytes"]["stored"] + summary["committed_bytes"]["deduplicated"] == nbytes, summary
    assert summary["committed_bytes"]["inherited"] == 0, summary
    assert summary["loaded_bytes"]["dram"] == nbytes, summary
    assert summary["requests"] > 0 and summary["wait_seconds"] > 0, summary
    path = os.path.join(site["root"], "run", job.id + ".summary.json")
    st = os.stat(path)
    assert st.st_uid == slurm_cluster.ensure_user(USER).pw_uid and st.st_mode & 0o777 == 0o600
    with open(path) as f:
        assert json.load(f) == summary
    # Bad, unknown and damaged ones are one-line errors.
    bad = as_user([cairn, "job", "summary", "../x", "--site", site["site"]])
    assert bad.returncode != 0 and "job id '../x'" in bad.stdout, bad.stdout
    missing = as_user([cairn, "job", "summary", "999.nowhere", "--site", site["site"]])
    assert missing.returncode != 0 and "no summary of job '999.nowhere'" in missing.stdout, missing.stdout
    with open(path, "w") as f:
        f.write('{"format": "cairn-job-summary", "version": 1}')
    damaged = as_user([cairn, "job", "summary", job.id, "--site", site["site"]])
    assert damaged.returncode != 0 and "field 'job' is missing" in damaged.stdout, damaged.stdout
