#!/usr/bin/env python3
"""Rows and ratios from one run of cairn_bench_micro.

Usage: python3 bench/micro/ratios.py IN.json OUT.json

IN.json is Google Benchmark's JSON output (`cairn_bench_micro --benchmark_out=IN.json
--benchmark_out_format=json`). Benchmarks are named "<family>/<size>/<system>" (system "cairn" for
cairn's code, the baseline's name otherwise); any other name is taken as a cairn row of its own.

OUT.json: {"rows": [{"workload": "micro", "metric": "<family> <size>", "system": ..., "value": ...,
"unit": "GB/s"|"ns", "better": "higher"|"lower"}], "ratios": [{"workload": "micro", "metric": ...,
"cairn": v, "baseline": <system>, "baseline_value": v2, "ratio": v / v2, "goal": null, "met": null}]}

A row's value is bytes/s in GB/s (1e9 bytes) where the benchmark sets bytes processed, otherwise the
time per iteration in ns (wall-clock time when the benchmark uses real time, as all of cairn's
do). With --benchmark_repetitions the median aggregate is used. A ratio compares cairn with every
other system of the same metric; ratio > 1 means faster for GB/s, slower for ns. The table printed
says which.
"""
from __future__ import annotations

import json
import sys
from typing import Dict, List, Tuple

WORKLOAD = "micro"
_NS_PER = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def _split(name: str) -> Tuple[str, str]:
    """(metric, system) of a benchmark's run name."""
    parts = [p for p in name.split("/") if p not in ("real_time", "manual_time")]
    if len(parts) == 3:
        family, size, system = parts
        return f"{family} {size}", system
    return " ".join(parts), "cairn"


def _pick_runs(benchmarks: List[dict]) -> Dict[str, dict]:
    """One entry per run name: the median aggregate when repetitions ran, else the (last) iteration run."""
    chosen: Dict[str, dict] = {}
    for b in benchmarks:
        if b.get("error_occurred"):
            print(f"ratios.py: {b.get('name')}: skipped: {b.get('error_message', 'error')}", file=sys.stderr)
            continue
        run = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                chosen[run] = b
        elif run not in chosen or chosen[run].get("run_type") != "aggregate":
            chosen[run] = b
    return chosen


def rows_and_ratios(doc: dict) -> Tuple[List[dict], List[dict]]:
    rows: List[dict] = []
    for run, b in _pick_runs(doc.get("benchmarks", [])).items():
        metric, system = _split(run)
        if "bytes_per_second" in b:
            value, unit, better = b["bytes_per_second"] / 1e9, "GB/s", "higher"
        else:
            value, unit, better = b["real_time"] * _NS_PER[b.get("time_unit", "ns")], "ns", "lower"
        rows.append({"workload": WORKLOAD, "metric": metric, "system": system, "value": value, "unit": unit,
                     "better": better})
    ratios: List[dict] = []
    by_metric: Dict[str, List[dict]] = {}
    for r in rows:
        by_metric.setdefault(r["metric"], []).append(r)
    for metric, group in by_metric.items():
        cairn = next((r for r in group if r["system"] == "cairn"), None)
        if cairn is None:
            continue
        for base in group:
            if base is cairn or base["unit"] != cairn["unit"] or base["value"] == 0:
                continue
            ratios.append({"workload": WORKLOAD, "metric": metric, "cairn": cairn["value"],
                           "baseline": base["system"], "baseline_value": base["value"],
                           "ratio": cairn["value"] / base["value"], "goal": None, "met": None})
    return rows, ratios


def _fmt(value: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{value:9.2f} GB/s"
    for scale, u in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if value >= scale:
            return f"{value / scale:9.2f} {u}  "
    return f"{value:9.1f} ns  "


def print_table(rows: List[dict], ratios: List[dict]) -> None:
    units = {(r["metric"], r["system"]): r["unit"] for r in rows}
    paired = set()
    print(f"{'metric':<34} {'cairn':>14} {'baseline':<12} {'baseline value':>14}  {'ratio':>8}  cairn is")
    for q in ratios:
        unit = units[(q["metric"], "cairn")]
        paired.add(q["metric"])
        # How many times faster cairn is (> 1) or slower (< 1), whatever the unit.
        speed = q["ratio"] if unit == "GB/s" else 1.0 / q["ratio"]
        verdict = f"{speed:.2f}x faster" if speed >= 1 else f"{1 / speed:.2f}x slower"
        print(f"{q['metric']:<34} {_fmt(q['cairn'], unit):>14} {q['baseline']:<12} "
              f"{_fmt(q['baseline_value'], unit):>14}  {q['ratio']:8.3f}  {verdict}")
    for r in rows:
        if r["metric"] not in paired:
            print(f"{r['metric']:<34} {_fmt(r['value'], r['unit']):>14} {r['system'] if r['system'] != 'cairn' else ''} (no baseline)")


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        print("usage: python3 bench/micro/ratios.py IN.json OUT.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"ratios.py: cannot read Google Benchmark JSON from {argv[1]}: {e} "
              f"(run cairn_bench_micro --benchmark_out={argv[1]} --benchmark_out_format=json)", file=sys.stderr)
        return 1
    rows, ratios = rows_and_ratios(doc)
    with open(argv[2], "w") as f:
        json.dump({"rows": rows, "ratios": ratios}, f, indent=2)
        f.write("\n")
    print_table(rows, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
