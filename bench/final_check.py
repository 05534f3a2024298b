#!/usr/bin/env python
"""Peak memory and time of a FINAL candidate's full reconciliation (`version_reconcile`).

Runs the check the lifecycle tick runs before a candidate can be proposed (every check,
the index's and the ledger's full scans) on the published version of a season loaded by
bench/fifty_million.py (`--steps load`), each run in a fresh process so its peak RSS is
its own, and prints per run: seconds, the process's RSS before the check, its peak
during it, the difference per player, and the load average.

    SECRET_KEY=x .venv/bin/python bench/final_check.py --season last --runs 3 \\
        --database-url postgresql://postgres@127.0.0.1:5432/lb_bench \\
        --redis-url redis://127.0.0.1:6392/0 --redis-db 0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402


def rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def check_once(slug: str) -> dict[str, Any]:
    from leaderboard.recovery.reconcile import version_reconcile
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys
    from seasons.models import Season

    season = (Season.objects.filter(slug__startswith="bench-50m-").order_by("-pk").first() if slug == "last"
              else Season.objects.get(slug=slug))
    assert season is not None
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    assert version is not None
    manifest = rankview.manifest_get(r, keys, version)
    assert manifest is not None
    before = rss_now()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=version, sample=1000)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"season": season.slug, "players": manifest.total, "version": version, "seconds": seconds,
            "rss_before": before, "rss_peak": peak, "bytes_per_player": (peak - before) / max(1, manifest.total),
            "ok": report.ok, "failures": [f.check for f in report.failures()], "load_before": load,
            "load_after": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--season", default="last", help="a season slug, or 'last' (bench/fifty_million.py's newest)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    if args.child:
        benchenv.environment_prepare(args, quiet=True)
        print(json.dumps(check_once(args.season)), flush=True)
        return 0
    print(benchenv.machine_line(), flush=True)
    runs = []
    for _ in range(args.runs):
        child = [sys.executable, __file__, "--child", "--season", args.season, "--no-migrate",
                 "--redis-db", str(args.redis_db)]
        child += ["--database-url", args.database_url] if args.database_url else []
        child += ["--redis-url", args.redis_url] if args.redis_url else []
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        run = json.loads(out.strip().splitlines()[-1])
        runs.append(run)
        print(f"# {run['players']:,} players: {run['seconds']:.1f}s, RSS {run['rss_before'] / 2**20:.0f} MiB before, "
              f"peak {run['rss_peak'] / 2**20:.0f} MiB: {run['bytes_per_player']:.1f} bytes a player; "
              f"ok={run['ok']} {run['failures']}; load {run['load_before']:.1f} -> {run['load_after']:.1f}",
              flush=True)
    print(f"# median: {benchenv.median([r['seconds'] for r in runs]):.1f}s, "
          f"{benchenv.median([r['bytes_per_player'] for r in runs]):.1f} bytes a player", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
