# cairn's PBS hook: one daemon per node per job, like the Slurm prolog/epilog (docs/pbs.md).
#
# Events: execjob_begin (start the job's cairnd as the job's user on this node), execjob_launch
# (put CAIRN_SOCKET into every task's environment), execjob_end (flush the daemon to the
# repository, stop it by its pidfile, remove the job directory). The work is done by
# `cairn job start|env|stop`, which reads the site config (/etc/cairn/site.yaml). A job opts in
# (with `enable: opt-in`) by `qsub -v CAIRN=1` or a comment containing "cairn".
#
# The hook's config file (qmgr: import hook cairn application/x-config default cairn_hook.json) may
# name the tool: {"cairn": "/opt/cairn/bin/cairn", "site": "/etc/cairn/site.yaml"}. The hook never
# rejects a job: a daemon that fails to start is logged and the job runs without cairn (unless the
# site config says on_failure: drain, in which case the begin event is rejected).
import json
import os
import shutil
import subprocess

import pbs


def _config():
    path = getattr(pbs, "hook_config_filename", None)
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            pbs.logmsg(pbs.LOG_ERROR, "cairn hook: cannot read %s: %s" % (path, e))
    return {}


def _cairn(cfg):
    for c in (cfg.get("cairn"), "/usr/bin/cairn", "/usr/local/bin/cairn", shutil.which("cairn")):
        if c and os.access(c, os.X_OK):
            return c
    return None


def _opted_in(job):
    comment = str(getattr(job, "comment", "") or "")
    if "cairn" in comment.lower():
        return True
    variables = getattr(job, "Variable_List", None) or {}
    try:
        value = str(variables.get("CAIRN", "") or "")
    except AttributeError:
        value = ""
    return value.lower() in ("1", "yes", "true", "on")


def _run(args, timeout):
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           universal_newlines=True)
        return p.returncode, p.stdout, p.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, "", str(e)


def main():
    e = pbs.event()
    job = e.job
    cfg = _config()
    cairn = _cairn(cfg)
    if cairn is None:
        pbs.logmsg(pbs.LOG_ERROR, "cairn hook: job %s: the cairn tool is not installed (set \"cairn\" in the hook config); "
                   "the job runs without cairn" % job.id)
        e.accept()
    site = ["--site", cfg["site"]] if cfg.get("site") else []
    if e.type == pbs.EXECJOB_BEGIN:
        args = [cairn, "job", "start", "--batch", "pbs", "--job", str(job.id), "--user", str(job.euser)] + site
        args += ["--comment", "cairn" if _opted_in(job) else ""]
        rc, out, err = _run(args, cfg.get("timeout", 120))
        if err:
            pbs.logmsg(pbs.LOG_DEBUG if rc == 0 else pbs.LOG_ERROR, "cairn hook: %s" % err)
        if rc != 0:
            e.reject("cairn: the job's daemon did not start and the site config says on_failure: drain: %s" % err)
    elif e.type == pbs.EXECJOB_LAUNCH:
        rc, out, err = _run([cairn, "job", "env", "--job", str(job.id)] + site, 30)
        for line in out.splitlines():
            if line.startswith("export CAIRN_SOCKET="):
                e.env["CAIRN_SOCKET"] = line[len("export CAIRN_SOCKET="):]
    elif e.type == pbs.EXECJOB_END:
        rc, out, err = _run([cairn, "job", "stop", "--batch", "pbs", "--job", str(job.id)] + site,
                            cfg.get("stop_timeout", 600))
        if err:
            pbs.logmsg(pbs.LOG_DEBUG, "cairn hook: %s" % err)
    e.accept()


main()
