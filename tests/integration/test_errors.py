"""Malformed input gets a one-line error naming the problem; the daemon keeps running and no
stored model changes."""
import json
import socket
import struct
import subprocess

import numpy as np
import pytest

from conftest import CAIRND
from stfiles import rand, save_file, write_header_only

T = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}

MALFORMED = {
    "truncated": (dict(h={"w": T}, data=b"\0" * 8), "16"),
    "header_longer_than_file": (dict(h={"w": T}, data=b"\0" * 16, declared=10_000), "header"),
    "overlapping": (dict(h={"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, data=b"\0" * 12), "overlap"),
    "out_of_range": (dict(h={"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, data=b"\0" * 16), "w"),
    "unknown_dtype": (dict(h={"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, data=b"\0" * 16), "F128"),
    "shape_mismatch": (dict(h={"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 16]}}, data=b"\0" * 16), "w"),
    "not_json": (dict(raw=b"{this is not json", data=b""), "JSON"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_safetensors_is_rejected_and_nothing_changes(daemon, tmp, case):
    rng = np.random.default_rng(0)
    good = {"w": rand(rng, (64, 64), np.float32)}
    save_file(good, str(tmp / "good.safetensors"))
    daemon.cairn("put", "good", tmp / "good.safetensors")
    before = daemon.stats()["repository"]

    spec, needle = MALFORMED[case]
    bad = tmp / f"{case}.safetensors"
    write_header_only(bad, spec.get("h"), spec["data"], raw_header=spec.get("raw"), declared_len=spec.get("declared"))
    r = daemon.cairn("put", "bad", bad, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle.lower() in lines[0].lower(), lines[0]
    assert daemon.alive()
    assert daemon.stats()["repository"] == before
    assert daemon.cairn("get", "bad", "-o", tmp / "x", check=False).returncode != 0
    daemon.cairn("get", "good", "-o", tmp / "good-out.safetensors")
    assert (tmp / "good-out.safetensors").read_bytes() == (tmp / "good.safetensors").read_bytes()


def test_unknown_ids_get_one_line_errors(daemon, tmp):
    for args in (["get", "nope", "-o", tmp / "x"], ["show", "nope"], ["lineage", "nope"], ["rm", "nope"],
                 ["prefetch", "nope"]):
        r = daemon.cairn(*args, check=False)
        assert r.returncode != 0
        assert len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr, (args, r.stderr)
    r = daemon.cairn("put", "x", tmp / "does-not-exist.safetensors", check=False)
    assert r.returncode != 0 and "does-not-exist" in r.stderr
    r = daemon.cairn("put", "x", tmp / "x.safetensors", "--parent", "ghost", check=False)
    assert r.returncode != 0


def test_bad_config_key_is_named(tmp):
    cfg = tmp / "bad.yaml"
    cfg.write_text("tiers:\n  dram:\n    capacty: 1GiB\n")
    r = subprocess.run([str(CAIRND), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "tiers.dram.capacty" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    cfg.write_text("tiers:\n  dram:\n    capacity: 12 parsecs\n")
    r = subprocess.run([str(CAIRND), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "tiers.dram.capacity" in r.stderr


def test_second_daemon_on_the_same_socket_is_refused(daemon, tmp):
    r = subprocess.run([str(CAIRND), "--config", str(daemon.config)], capture_output=True, text=True, timeout=30,
                       env=daemon.env)
    assert r.returncode != 0
    assert str(daemon.proc.pid) in r.stderr and "already" in r.stderr
    assert daemon.alive()
    daemon.cairn("stats")


def test_garbage_and_oversized_frames_do_not_hurt_the_daemon(daemon, tmp):
    def send(raw):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(daemon.socket)
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        data = b""
        s.settimeout(10)
        try:
            while chunk := s.recv(4096):
                data += chunk
        except OSError:
            pass
        s.close()
        return data

    send(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 100)
    send(b"CRN1" + struct.pack("<HHIIQ", 1, 1, 0xFFFFFFF0, 0, 0))          # oversized json_len
    send(b"CRN1" + struct.pack("<HHIIQ", 1, 1, 10, 0, 1 << 40))            # oversized blob
    send(b"CRN1" + struct.pack("<HHIIQ", 1, 1, 5, 0, 0) + b"[1,2]")        # not an object
    js = json.dumps({"op": "commit", "id": "evil", "tensors": [{"name": "w", "dtype": "F32", "shape": [4],
                                                                 "inline": [0, 1 << 30]}]}).encode()
    reply = send(b"CRN1" + struct.pack("<HHIIQ", 1, 1, len(js), 0, 0) + js)
    assert b"inline" in reply
    send(b"CRN1" + struct.pack("<HHIIQ", 1, 1, 100, 0, 0) + b"{}")          # cut short
    assert daemon.alive()
    assert daemon.stats()["repository"]["models"] == 0


def test_bad_architecture_graph_is_named_and_nothing_is_stored(daemon, tmp):
    import json as _json
    rng = np.random.default_rng(5)
    save_file({"stem.weight": rand(rng, (8, 3, 3, 3), np.float32)}, str(tmp / "m.safetensors"))
    bad = tmp / "bad-graph.json"
    bad.write_text(_json.dumps({"layers": [{"name": "stem", "type": "Conv2d", "inputs": ["input_ghost"]}]}))
    r = daemon.cairn("put", "m", tmp / "m.safetensors", "--arch", bad, check=False)
    assert r.returncode != 0 and "input_ghost" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert daemon.stats()["repository"]["models"] == 0
    good = tmp / "graph.json"
    good.write_text(_json.dumps({"layers": [{"name": "stem", "type": "Conv2d", "config": {"k": 3}}]}))
    daemon.cairn("put", "m", tmp / "m.safetensors", "--arch", good)
    assert _json.loads(daemon.cairn("show", "m").stdout)["architecture"]["layers"][0]["name"] == "stem"
