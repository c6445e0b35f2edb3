"""The coupled example (workflow/examples/coupled/): an MPI heat simulation on 2 ranks publishes its
field as named tensors, a PyTorch trainer learns a surrogate online and commits versions of it, and
the simulation loads the newest version through the C API and uses it to predict its next field.
The simulation runs in lockstep with the trainer (--lockstep 1), so how fast each runs beside the
other does not change which versions it sees. Checks: it runs to completion, the simulation used at least two successive surrogate versions, and
the last surrogate's lineage lists the earlier ones. The same example over a real redis-server (the
SmartRedis-style baseline, --backend redis) runs to completion with at least two versions too."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from daemons import cairnd, redis_server

SOURCE = os.environ.get("CAIRN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(SOURCE, "build"))
SIM = os.path.join(BUILD, "bin", "coupled_heat")


def run_example(env, where, steps, pace_ms):
    """Runs the trainer and `mpirun -np 2` of the simulation with backend arguments `where`; returns
    both outputs once both ended successfully, and the surrogate versions the simulation used."""
    env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONPATH=os.path.join(SOURCE, "api", "python"),
               CAIRN_LIBRARY=os.path.join(BUILD, "lib", "libcairn.so"))
    trainer = subprocess.Popen([sys.executable, os.path.join(SOURCE, "workflow", "examples", "coupled", "trainer.py"),
                                "--ranks", "2", "--timeout", "240", *where], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, universal_newlines=True)
    try:
        sim = subprocess.run(["mpirun", "-np", "2", SIM, *where, "--steps", str(steps), "--pace-ms", str(pace_ms),
                              "--lockstep", "1"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                             timeout=300)
        assert sim.returncode == 0, sim.stdout
        out, _ = trainer.communicate(timeout=240)
        assert trainer.returncode == 0, out
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    used = sorted({int(v) for v in re.findall(r"surrogate v(\d+) predicted", sim.stdout)})
    assert len(used) >= 2, "the simulation used surrogate versions %s:\n%s\n%s" % (used, sim.stdout, out)
    return sim.stdout, out, used


def test_simulation_uses_successive_surrogates_trained_online(tmp_path):
    if not os.path.exists(SIM):
        pytest.skip("built without MPI (CAIRN_WITH_MPI=OFF): %s is missing" % SIM)
    with cairnd(BUILD, "cairn-coupled-") as d:
        env = dict(os.environ, CAIRN_SOCKET=d["socket"])
        sim, out, used = run_example(env, [], 300, 60)
        last = re.search(r"last (\S+)\)", out).group(1)
        n = int(last.rsplit("v", 1)[1])
        lineage = subprocess.run([os.path.join(BUILD, "bin", "cairn"), "lineage", last], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        ancestors = lineage.stdout.split("ancestors:")[1].split("\n")[0].split()
        assert ancestors == ["surrogate-v%d" % k for k in range(n - 1, 0, -1)], lineage.stdout
        errors = [float(e) for e in re.findall(r"relative error ([0-9.]+)", sim)]
        print("versions used %s of %d; prediction error %.4f first, %.4f last" % (used, n, errors[0], errors[-1]))


def test_the_same_example_runs_over_redis(tmp_path):
    if not os.path.exists(SIM):
        pytest.skip("built without MPI (CAIRN_WITH_MPI=OFF): %s is missing" % SIM)
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed (Debian: redis-server)")
    with open(SIM, "rb") as f:
        if b"built without hiredis" in f.read():
            pytest.skip("%s was built without hiredis (Debian: libhiredis-dev)" % SIM)
    redis = pytest.importorskip("redis", reason="redis-py is not installed (Debian: python3-redis)")
    with redis_server("cairn-coupled-redis-") as r:
        sim, out, used = run_example(dict(os.environ), ["--backend", "redis", "--redis", r["socket"]], 200, 60)
        db = redis.Redis(unix_socket_path=r["socket"])
        latest = int.from_bytes(db.hget("surrogate/latest", "data"), "little")
        assert latest >= max(used), (latest, used)
        assert db.exists("surrogate-v%d/conv.weight" % latest) and db.exists("surrogate-v%d/conv.bias" % latest)
        assert not db.keys("heat/[0-9]*"), "fields the trainer did not read and delete: %s" % db.keys("heat/[0-9]*")
        print("over Redis: versions used %s of %d" % (used, latest))
