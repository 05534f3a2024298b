#!/usr/bin/env python
"""The window of 503s that a master failover of the rank views' Redis Cluster shows readers.

Runs tests/test_cluster_failover.py --runs times (each run a new cluster of 3 masters with
one replica each, a season of 2,000 players, an epoch in a child process, 4 readers on the
fast read path and a writer on the write API; a master SIGKILLed during the epoch, see the
test's docstring) and collects what each run prints: the window of 503s (first to last),
when the replica was seen promoted (every node agreeing on the slots again), how many
answers were 503s. Prints each run, then the median, minimum and maximum per target, with
the load average before and after (the machine is shared: compare medians).

    SECRET_KEY=x DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench REDIS_URL=redis://127.0.0.1:6379/1 \\
        .venv/bin/python bench/failover.py --runs 5 --target groups --node-timeout-ms 2000

The runs reuse the test's own checks: a run whose answers were not all right (or whose
503s lasted past the test's bound) is reported as failed and left out of the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(
    r"failover of the (?P<target>\w+) master .*?: promoted (?P<promoted>[\d.]+)s after the kill; "
    r"503 window (?P<window>[\d.]+)s \((?P<n503>\d+) 503s of (?P<answers>\d+) answers")


@dataclass(frozen=True)
class Run:
    target: str
    window: float
    promoted: float
    unavailable: int
    answers: int
    passed: bool


def run_once(*, target: str, node_timeout_ms: int) -> list[Run]:
    env = {**os.environ, "TEST_REDIS_CLUSTER": "1", "TEST_FAILOVER_NODE_TIMEOUT_MS": str(node_timeout_ms)}
    env.setdefault("SECRET_KEY", "bench-only-not-secret")
    selection = ["-k", "under_load" if target == "both" else f"under_load and {target}"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-rA", "-p", "no:randomly", "tests/test_cluster_failover.py",
         *selection], cwd=ROOT, env=env, capture_output=True, text=True)
    passed = set(re.findall(r"^PASSED \S+\[(\w+)\]", done.stdout, flags=re.MULTILINE))
    runs = []
    for match in LINE.finditer(done.stdout):
        runs.append(Run(target=match["target"], window=float(match["window"]), promoted=float(match["promoted"]),
                        unavailable=int(match["n503"]), answers=int(match["answers"]),
                        passed=match["target"] in passed))
    failures = re.findall(r"^E +(.{0,300})", done.stdout, flags=re.MULTILINE)
    if failures:
        print("  failed: " + " | ".join(failures[:3]), flush=True)
    if not runs:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"the test printed no failover line (exit {done.returncode}):\n{tail}")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--target", choices=["control", "groups", "both"], default="both",
                        help="the master killed: the season's control slot's, one with only slot groups, or each")
    parser.add_argument("--node-timeout-ms", type=int, default=2000,
                        help="cluster-node-timeout of the nodes (Redis's default is 15000)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("set DATABASE_URL=postgres://... (the test needs PostgreSQL)")
    load_before = os.getloadavg()[0]
    runs: list[Run] = []
    for n in range(args.runs):
        for run in run_once(target=args.target, node_timeout_ms=args.node_timeout_ms):
            runs.append(run)
            print(f"run {n + 1} {run.target}: 503 window {run.window:.2f} s, promoted seen {run.promoted:.1f} s "
                  f"after the kill, {run.unavailable} 503s of {run.answers} answers"
                  f"{'' if run.passed else ' (FAILED: left out)'}; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nnode timeout {args.node_timeout_ms} ms; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    for target in sorted({run.target for run in runs}):
        good = [run for run in runs if run.target == target and run.passed]
        if not good:
            print(f"{target}: no run passed")
            continue
        windows = [run.window for run in good]
        promoted = [run.promoted for run in good]
        print(f"{target}: 503 window median {statistics.median(windows):.2f} s (min {min(windows):.2f}, "
              f"max {max(windows):.2f}); promoted seen median {statistics.median(promoted):.1f} s; "
              f"{len(good)} of {sum(1 for run in runs if run.target == target)} runs passed")


if __name__ == "__main__":
    main()
