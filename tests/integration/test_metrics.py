"""Metrics for monitoring (docs/metrics.md), checked as a site operator would:

- a daemon with metrics.listen on 127.0.0.1 and a free port serves GET /metrics; a scrape before and
  after `cairn put` + `cairn get` of a model shows the commit, the DRAM hits and the bytes it caused,
  and the requests' latency histograms; other paths are 404, other methods 405; after a restart, a
  cold load shows the bytes read from the repository;
- with an OpenMetrics Accept header the exposition is OpenMetrics and ends with `# EOF`;
- metrics.textfile is rewritten every metrics.interval with the same families, atomically, and
  removed when the daemon stops;
- `promtool check metrics` (Debian's prometheus package) accepts the scrape and the textfile;
- a bad metrics.listen, or a port another process holds, stops cairnd at start with a message
  naming the key;
- two daemons of one job: each sample carries job_id, and the peer byte counters move when one
  member reads what the other committed.
"""
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import CAIRND, Daemon  # noqa: F401
from stfiles import save_file

PROMTOOL = shutil.which("promtool")
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, path="/metrics", accept=None, method="GET"):
    """(status, content type, body) of one request to the endpoint."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def samples(text):
    """{series: value} of an exposition: the series as written (name and labels)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        out[series] = float(value)
    return out


def metrics_daemon(make_daemon, tmp, name="d", interval="200ms"):
    port = free_port()
    textfile = tmp / name / "cairn.prom"
    d = make_daemon(name, extra_config=f"metrics:\n  listen: 127.0.0.1:{port}\n  textfile: {textfile}\n"
                                       f"  interval: {interval}\n")
    d.port, d.textfile = port, textfile
    return d


def put_model(d, tmp, mid, seed, mib=8):
    rng = np.random.default_rng(seed)
    n = mib * (1 << 20) // 4 // 2
    path = tmp / f"{mid}.safetensors"
    save_file({"a.weight": rng.standard_normal(n).astype(np.float32),
               "b.weight": rng.standard_normal(n).astype(np.float32)}, str(path))
    d.cairn("put", mid, path, "--durability", "global")
    return path


def test_a_scrape_shows_what_a_commit_and_a_load_did(make_daemon, tmp):
    d = metrics_daemon(make_daemon, tmp).start()
    status, ctype, body = scrape(d.port)
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8", (status, ctype)
    before = samples(body)
    for family in ("cairn_dram_hits_total", "cairn_dram_admitted_bytes_total", "cairn_dram_used_bytes",
                   "cairn_dram_capacity_bytes", "cairn_repository_written_bytes_total",
                   "cairn_repository_read_bytes_total", "cairn_repository_models",
                   "cairn_flush_pending_models", "cairn_requests_in_flight", 'cairn_commits_total{durability="global"}'):
        assert family in before, f"{family} missing from the first scrape:\n{body}"
    assert "# TYPE cairn_dram_hits_total counter" in body and "# HELP cairn_dram_hits_total " in body
    assert not any(k.startswith("cairn_peer_") for k in before)  # no peer group
    assert not any("job_id=" in k for k in before)  # no job

    src = put_model(d, tmp, "m1", 1)
    out = tmp / "m1-out.safetensors"
    d.cairn("get", "m1", "-o", out)
    assert out.read_bytes() == src.read_bytes()

    after = samples(scrape(d.port)[2])
    model_bytes = 8 << 20
    assert after["cairn_dram_hits_total"] > before["cairn_dram_hits_total"]
    assert after["cairn_dram_admitted_bytes_total"] - before["cairn_dram_admitted_bytes_total"] >= model_bytes
    assert after["cairn_repository_written_bytes_total"] - before["cairn_repository_written_bytes_total"] >= model_bytes
    assert after["cairn_repository_read_bytes_total"] == before["cairn_repository_read_bytes_total"]  # from DRAM
    assert after['cairn_commits_total{durability="global"}'] == before['cairn_commits_total{durability="global"}'] + 1
    assert after["cairn_repository_models"] == 1
    assert after['cairn_request_duration_seconds_count{op="commit"}'] == 1
    assert after['cairn_request_duration_seconds_bucket{op="commit",le="+Inf"}'] == 1
    assert after['cairn_request_duration_seconds_sum{op="commit"}'] > 0
    assert after.get('cairn_request_duration_seconds_count{op="lease"}', 0) >= 1
    # What `cairn stats` says agrees with the scrape.
    stats = d.stats()["tiers"]["dram"]
    final = samples(scrape(d.port)[2])
    assert final["cairn_dram_hits_total"] == stats["hits"]
    assert final["cairn_dram_capacity_bytes"] == stats["capacity_bytes"]

    # Only GET /metrics.
    assert scrape(d.port, "/")[0] == 404
    assert scrape(d.port, "/other")[0] == 404
    assert scrape(d.port, method="POST")[0] == 405
    assert scrape(d.port, method="HEAD")[0] == 405

    # OpenMetrics when asked for.
    status, ctype, om = scrape(d.port, accept=OPENMETRICS)
    assert status == 200 and ctype == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert om.endswith("\n# EOF\n") and om.count("# EOF") == 1
    assert "# TYPE cairn_dram_hits counter\n" in om and "\ncairn_dram_hits_total " in om
    assert "# UNIT cairn_dram_used_bytes bytes\n" in om

    # The textfile: the same families, in Prometheus text, rewritten every interval.
    deadline = time.time() + 10
    while time.time() < deadline:
        tf = samples(d.textfile.read_text())
        if tf.get('cairn_commits_total{durability="global"}') == 1 and tf.get("cairn_dram_hits_total") == stats["hits"]:
            break
        time.sleep(0.1)
    assert tf['cairn_commits_total{durability="global"}'] == 1
    assert tf["cairn_dram_hits_total"] == stats["hits"]
    assert not d.textfile.read_text().rstrip().endswith("# EOF")
    assert sorted(p.name for p in d.textfile.parent.iterdir() if p.name.startswith("cairn.prom")) == ["cairn.prom"]

    assert d.stop() == 0
    assert not d.textfile.exists(), "the textfile outlived the daemon"

    # A cold load after a restart: the bytes come from the repository, through DRAM misses.
    d.start()
    cold = samples(scrape(d.port)[2])
    d.cairn("get", "m1", "-o", out)
    assert out.read_bytes() == src.read_bytes()
    warm = samples(scrape(d.port)[2])
    assert warm["cairn_repository_read_bytes_total"] - cold["cairn_repository_read_bytes_total"] >= model_bytes
    assert warm["cairn_repository_chunk_reads_total"] > cold["cairn_repository_chunk_reads_total"]
    assert warm["cairn_dram_misses_total"] > cold["cairn_dram_misses_total"]
    assert warm["cairn_dram_admitted_bytes_total"] - cold["cairn_dram_admitted_bytes_total"] >= model_bytes
    assert d.textfile.exists()


def test_promtool_accepts_the_scrape_and_the_textfile(make_daemon, tmp):
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/deps installs it): "
                    "the exposition is not validated")
    d = metrics_daemon(make_daemon, tmp).start()
    put_model(d, tmp, "m1", 2, mib=1)
    d.cairn("get", "m1", "-o", tmp / "out.safetensors")
    d.cairn("show", "nope", check=False)  # an error by status code
    body = scrape(d.port)[2]
    assert 'cairn_request_errors_total{op="show",code="not_found"} 1' in body
    for what, text in (("the scrape", body), ("the textfile", d.textfile.read_text())):
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", \
            f"promtool check metrics on {what}: {r.returncode}\n{r.stdout}\n{r.stderr}\n{text}"


def test_a_bad_listen_address_or_a_port_in_use_stops_the_daemon(make_daemon, tmp):
    d = make_daemon("bad", extra_config="metrics:\n  listen: localhost\n")
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "metrics.listen: 'localhost' has no port" in str(e.value)

    d = make_daemon("range", extra_config="metrics:\n  listen: 127.0.0.1:70000\n")
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "metrics.listen: '127.0.0.1:70000' has a port out of range" in str(e.value)

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        d = make_daemon("busy", extra_config=f"metrics:\n  listen: 127.0.0.1:{port}\n")
        with pytest.raises(RuntimeError) as e:
            d.start()
        assert f"metrics.listen: cannot listen on '127.0.0.1:{port}': Address already in use" in str(e.value)

    d = make_daemon("env")
    d.env["CAIRN_METRICS_TEXTFILE"] = str(tmp / "no" / "such" / "dir" / "cairn.prom")
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "metrics.textfile: " in str(e.value) and "no/such/dir" in str(e.value)


@pytest.mark.skipif(os.environ.get("CAIRN_SANITIZED") == "1", reason="multi-daemon suite: normal build only")
@pytest.mark.skipif(shutil.which("fi_info") is None and not Path("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
                    reason="libfabric is not installed (scripts/deps installs it)")
def test_the_daemons_of_a_job_label_their_metrics_and_count_peer_bytes(make_daemon, tmp):
    repo, rdv = tmp / "repo", tmp / "rdv"
    ds = []
    for i in (1, 2):
        d = metrics_daemon(make_daemon, tmp, name=f"m{i}")
        # One repository and one job for both (conftest's config names a repository of its own).
        d.config.write_text(
            f"socket: {d.socket}\nrepository: {repo}\nchunk_size: 1MiB\ntiers:\n  dram:\n    capacity: 256MiB\n"
            f"peers:\n  job: \"4242\"\n  rendezvous: {rdv}\n  provider: \"tcp;ofi_rxm\"\n  address: 127.0.0.{i}\n"
            f"  timeout: 3s\nlog:\n  level: warn\n  file: {d.root / 'cairnd.log'}\n"
            f"metrics:\n  listen: 127.0.0.1:{d.port}\n  textfile: {d.textfile}\n  interval: 200ms\n")
        ds.append(d.start())
    deadline = time.time() + 20
    while time.time() < deadline:
        if all(samples(scrape(d.port)[2]).get('cairn_peer_members{job_id="4242"}') == 1 for d in ds):
            break
        time.sleep(0.2)
    first = samples(scrape(ds[1].port)[2])
    assert first.get('cairn_peer_members{job_id="4242"}') == 1, first
    assert all('job_id="4242"' in k for k in first), [k for k in first if 'job_id="4242"' not in k]

    put_model(ds[0], tmp, "shared", 3, mib=4)
    ds[1].cairn("get", "shared", "-o", tmp / "shared-out.safetensors")
    reader = samples(scrape(ds[1].port)[2])
    writer = samples(scrape(ds[0].port)[2])
    assert reader['cairn_peer_received_bytes_total{job_id="4242"}'] >= 4 << 20, reader
    assert writer['cairn_peer_sent_bytes_total{job_id="4242"}'] >= 4 << 20, writer
    assert writer['cairn_commits_total{job_id="4242",durability="global"}'] == 1
