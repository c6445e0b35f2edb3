"""A stand-in for the `pbs` module that OpenPBS's pbs_mom gives a hook (OpenPBS cannot be installed
here). It reproduces what cairn's hook reads and calls, as the PBS Professional Hooks Guide
describes them: pbs.event() with .type, .job (.id, .euser, .comment, .Variable_List) and .env (for
execjob_launch), e.accept() and e.reject(msg), which end the hook; pbs.logmsg(level, msg);
pbs.hook_config_filename; the event-type and log-level constants."""

EXECJOB_BEGIN = 0x1000
EXECJOB_LAUNCH = 0x4000
EXECJOB_END = 0x8000

LOG_DEBUG = 0x0004
LOG_WARNING = 0x0002
LOG_ERROR = 0x0001

hook_config_filename = None
log = []            # (level, message) from logmsg
_event = None


class HookEnded(SystemExit):
    """What accept() and reject() raise: like pbs_mom, nothing after them runs."""


class Job:
    def __init__(self, id, euser, comment=None, Variable_List=None):
        self.id = id
        self.euser = euser
        self.comment = comment
        self.Variable_List = dict(Variable_List or {})


class Event:
    def __init__(self, type, job, env=None):
        self.type = type
        self.job = job
        self.env = dict(env or {})
        self.accepted = None
        self.reject_message = None

    def accept(self, msg=None):
        self.accepted = True
        raise HookEnded(0)

    def reject(self, msg=None):
        self.accepted = False
        self.reject_message = msg
        raise HookEnded(1)


def event():
    return _event


def logmsg(level, msg):
    log.append((level, msg))


def run_hook(path, ev):
    """Runs a hook file for one event, as pbs_mom would: a fresh namespace, `import pbs` giving this
    module; returns the event (accepted / reject_message / env)."""
    global _event
    _event = ev
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    try:
        exec(code, {"__name__": "__main__"})
    except HookEnded:
        pass
    if ev.accepted is None:
        raise AssertionError("the hook ended without accept() or reject()")
    return ev
