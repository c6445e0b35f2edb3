"""A real one-node Slurm cluster for the tests: Debian's munged, slurmctld and slurmd started with a
temporary slurm.conf (all state under one temporary directory, ports of their own) and stopped by
pid. The cluster runs cairn's Prolog, TaskProlog and Epilog from an installed cairn tree, as a site
would. Needs root (slurmd runs jobs as other users) and Debian's slurmctld, slurmd, slurm-client and
munge (scripts/deps installs them)."""
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo")


def missing_reason():
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd runs jobs as the test users); run scripts/test as root"
    missing = [b for b in SLURM_BINARIES if shutil.which(b, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        return "Debian's Slurm is not installed (missing %s; scripts/deps installs slurmctld slurmd slurm-client munge)" % ", ".join(missing)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_user(name):
    """Creates a plain test user (no home directory) if it does not exist; returns its pwd entry."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", "-d", "/nonexistent", name], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return pwd.getpwnam(name)


def _read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(pid, timeout=15):
    if not pid or not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


class SlurmCluster:
    def __init__(self, root, prefix):
        self.root = root          # all state
        self.prefix = prefix      # the installed cairn tree (share/cairn/slurm/*)
        self.conf = os.path.join(root, "slurm.conf")
        self.node = socket.gethostname()
        self.pids = {}
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self):
        r = self.root
        os.makedirs(os.path.join(r, "ctld"), exist_ok=True)
        os.makedirs(os.path.join(r, "spool"), exist_ok=True)
        key = os.path.join(r, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        subprocess.run(["munged", "--socket", r + "/munge.sock", "--key-file", key, "--log-file", r + "/munged.log",
                        "--pid-file", r + "/munged.pid", "--seed-file", r + "/munged.seed", "--force"],
                       check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.pids["munged"] = _read_pid(r + "/munged.pid")
        slurm = os.path.join(self.prefix, "share", "cairn", "slurm")
        ncpu = os.cpu_count() or 1
        with open(self.conf, "w") as f:
            f.write("""ClusterName=cairntest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
CredType=cred/munge
SlurmctldPort={p1}
SlurmdPort={p2}
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
PrologFlags=Alloc
Prolog={slurm}/prolog
TaskProlog={slurm}/task_prolog
Epilog={slurm}/epilog
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={ncpu} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""".format(node=self.node, r=r, p1=free_port(), p2=free_port(), slurm=slurm, ncpu=ncpu))
        for daemon in ("slurmctld", "slurmd"):
            args = [daemon, "-f", self.conf] + (["-c"] if daemon == "slurmctld" else [])
            subprocess.run(args, check=True, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            deadline = time.time() + 20
            while _read_pid(os.path.join(r, daemon + ".pid")) is None and time.time() < deadline:
                time.sleep(0.1)
            self.pids[daemon] = _read_pid(os.path.join(r, daemon + ".pid"))
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True).stdout.strip()
            if out in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.2)
        raise RuntimeError("the node did not become idle within 60 s: sinfo says %r; slurmctld.log:\n%s" %
                           (out, self.log_tail("slurmctld.log")))

    def log_tail(self, name, n=30):
        try:
            with open(os.path.join(self.root, name)) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no %s)" % name

    def stop(self):
        subprocess.run(["scancel", "--full", "--quiet", "-u", "cairnt1"], env=self.env, stderr=subprocess.DEVNULL)
        subprocess.run(["scancel", "--full", "--quiet", "-u", "cairnt2"], env=self.env, stderr=subprocess.DEVNULL)
        for daemon in ("slurmd", "slurmctld", "munged"):
            stop_pid(self.pids.get(daemon))

    def run_as(self, user, args, **kw):
        """Runs a command as a test user with the cluster's SLURM_CONF (runuser keeps the env)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        kw.setdefault("universal_newlines", True)
        env = kw.pop("env", self.env)
        return subprocess.run(["runuser", "-u", user, "--"] + list(args), env=env, **kw)

    def submit(self, user, script, workdir, comment=None, extra=(), env=None):
        args = ["sbatch", "--parsable", "-D", workdir, "-o", os.path.join(workdir, "slurm-%j.out")]
        if comment is not None:
            args.append("--comment=" + comment)
        args += list(extra) + [script]
        p = self.run_as(user, args, env=env or self.env)
        assert p.returncode == 0, "sbatch failed: " + p.stdout
        return p.stdout.strip().split(";")[0]

    def state(self, job):
        out = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True).stdout
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if m else "UNKNOWN"

    def wait_state(self, job, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.state(job)
            if s in states:
                return s
            time.sleep(0.1)
        raise AssertionError("job %s is %s after %d s, not one of %s; slurmd.log:\n%s" %
                             (job, self.state(job), timeout, states, self.log_tail("slurmd.log")))

    def wait_ended(self, job, timeout=180):
        """Waits until the job has ended and its epilog has run (COMPLETING is over)."""
        return self.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
                               timeout)
