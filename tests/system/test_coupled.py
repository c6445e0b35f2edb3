"""The coupled example (workflow/examples/coupled/): an MPI heat simulation on 2 ranks publishes its
field as named tensors, a PyTorch trainer learns a surrogate online and commits versions of it, and
the simulation loads the newest version through the C API and uses it to predict its next field.
Checks: it runs to completion, the simulation used at least two successive surrogate versions, and
the last surrogate's lineage lists the earlier ones."""
import os
import re
import subprocess
import sys

import pytest

from daemons import cairnd

SOURCE = os.environ.get("CAIRN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(SOURCE, "build"))
SIM = os.path.join(BUILD, "bin", "coupled_heat")


def test_simulation_uses_successive_surrogates_trained_online(tmp_path):
    if not os.path.exists(SIM):
        pytest.skip("built without MPI (CAIRN_WITH_MPI=OFF): %s is missing" % SIM)
    trainer = None
    with cairnd(BUILD, "cairn-coupled-") as d:
        sock = d["socket"]
        try:
            env = dict(os.environ, CAIRN_SOCKET=sock, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONPATH=os.path.join(SOURCE, "api", "python"),
                       CAIRN_LIBRARY=os.path.join(BUILD, "lib", "libcairn.so"))
            trainer = subprocess.Popen([sys.executable, os.path.join(SOURCE, "workflow", "examples", "coupled", "trainer.py"),
                                        "--ranks", "2", "--timeout", "240"], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, universal_newlines=True)
            sim = subprocess.run(["mpirun", "-np", "2", SIM, "--steps", "300", "--pace-ms", "60"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
            assert sim.returncode == 0, sim.stdout
            out, _ = trainer.communicate(timeout=240)
            assert trainer.returncode == 0, out
            used = sorted({int(v) for v in re.findall(r"surrogate v(\d+) predicted", sim.stdout)})
            assert len(used) >= 2, "the simulation used surrogate versions %s:\n%s\n%s" % (used, sim.stdout, out)
            last = re.search(r"last (\S+)\)", out).group(1)
            n = int(last.rsplit("v", 1)[1])
            lineage = subprocess.run([os.path.join(BUILD, "bin", "cairn"), "lineage", last], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
            ancestors = lineage.stdout.split("ancestors:")[1].split("\n")[0].split()
            assert ancestors == ["surrogate-v%d" % k for k in range(n - 1, 0, -1)], lineage.stdout
            errors = [float(e) for e in re.findall(r"relative error ([0-9.]+)", sim.stdout)]
            print("versions used %s of %d; prediction error %.4f first, %.4f last" % (used, n, errors[0], errors[-1]))
        finally:
            if trainer is not None and trainer.poll() is None:
                trainer.kill()
