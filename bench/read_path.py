#!/usr/bin/env python
"""The read path alone: CPU per read of the functions the read API calls, without a server.

The HTTP benchmark (bench/reads.py) measures whole requests, where the server's own work
(~250 µs a request under uvicorn) and the machine's drift hide differences of tens of
microseconds. Here one process calls `leaderboard/api/reads.py`'s rank and neighbours
answers (and the lean baseline's ZSCORE + ZREVRANK + ZCARD for scale) in a loop against
a loaded season, and reports this process's CPU (time.process_time) and Redis's (INFO
cpu) per read, medians over chunks.

Each configuration reads the same chunk of players, chunk after chunk, in an order that
alternates (A B, B A, ...), so none gains from coming second. Configurations:

- `hints` / `no-hints`: place hints on (READ_PLACE_HINTS, kept from chunk to chunk) or
  off, leaderboard/views/rankview/reads.py;
- the mix: `--readers N` players read again and again (a player watching their rank;
  the hints hit), or every read a player not read before (`--readers 0`, the default:
  every read cold, the hints' bookkeeping without a hit).

    SECRET_KEY=x .venv/bin/python bench/read_path.py --players 200k --reads 100k
    SECRET_KEY=x .venv/bin/python bench/read_path.py --players 200k --reads 100k --readers 5k
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

CHUNKS = 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--players", default="200k", help="players in the season")
    parser.add_argument("--reads", default="100k", help="reads per configuration and endpoint")
    parser.add_argument("--readers", default="0", help="players who read again and again; 0: every read cold")
    parser.add_argument("--endpoints", default="rank,neighbors,baseline-lean")
    parser.add_argument("--seed", type=int, default=3)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (players,) = benchenv.parse_counts(args.players)
    (n,) = benchenv.parse_counts(args.reads)
    (readers,) = benchenv.parse_counts(args.readers)
    endpoints = [e for e in args.endpoints.split(",") if e]
    if readers > players or n > players and not readers:
        parser.error("--reads of cold players (--readers 0) must not exceed --players; --readers at most --players")
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())

    from django.conf import settings

    from leaderboard.api import reads
    from leaderboard.api.baseline_views import baseline_answer, baseline_key
    from leaderboard.redis_client import redis_get
    from leaderboard.views.rankview import manifests

    result = loader.load_season(players=players, seed=args.seed, kind="reads", verbose=True)
    slug = result.season.slug
    r = redis_get()
    key = baseline_key(slug)
    for start in range(0, players, 50_000):
        r.zadd(key, {loader.player_id(i): i for i in range(start, min(players, start + 50_000))})

    rnd = random.Random(args.seed)
    if readers:
        hot = [loader.player_id(i) for i in rnd.sample(range(players), readers)]
        ids = [rnd.choice(hot) for _ in range(n)]
    else:
        ids = [loader.player_id(i) for i in rnd.sample(range(players), n)]
    calls: dict[str, Callable[[str], Any]] = {
        "rank": lambda pid: reads.rank_answer(season_id=slug, player_id=pid, query={}),
        "neighbors": lambda pid: reads.neighbors_answer(season_id=slug, player_id=pid, query={}),
        "baseline-lean": lambda pid: baseline_answer(season_id=slug, player_id=pid, lean=True),
    }
    configs = {"hints": settings.READ_PLACE_HINTS or 200_000, "no-hints": 0}

    def redis_cpu() -> float:
        info = r.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    measured: dict[tuple[str, str], list[tuple[float, float]]] = {}
    hints = manifests._place_hints
    kept: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})
    size = max(1, n // CHUNKS)
    try:
        for k in range(CHUNKS):
            chunk = ids[k * size:(k + 1) * size]
            for endpoint in endpoints:
                order = list(configs) if k % 2 else list(configs)[::-1]
                for config in (order if endpoint != "baseline-lean" else ["no-hints"]):
                    settings.READ_PLACE_HINTS = configs[config]
                    # Each configuration keeps its own hints from chunk to chunk: a
                    # process with hints on has them from the reads before.
                    hints.young, hints.old = kept if configs[config] else ({}, {})
                    call = calls[endpoint]
                    cpu, redis_before = time.process_time(), redis_cpu()
                    for pid in chunk:
                        call(pid)
                    cpu, redis_used = time.process_time() - cpu, redis_cpu() - redis_before
                    if configs[config]:
                        kept = hints.young, hints.old
                    measured.setdefault((endpoint, config), []).append(
                        (cpu / len(chunk) * 1e6, redis_used / len(chunk) * 1e6))
            print(f"# chunk {k + 1}/{CHUNKS} read", flush=True)
    finally:
        benchenv.season_cleanup(result.season, keep=args.keep, extra_keys=[key], quiet=True)

    mix = f"{readers:,} players reading again" if readers else "every read a player not read before"
    print(f"\n## read path: {players:,} players, {n:,} reads per endpoint and configuration ({mix}), "
          f"medians of {CHUNKS} chunks, CPU per read\n")
    rows = []
    for endpoint in endpoints:
        for config in configs:
            if endpoint == "baseline-lean" and config == "hints":
                continue
            cells = measured[(endpoint, config)]
            py = statistics.median(c[0] for c in cells)
            rd = statistics.median(c[1] for c in cells)
            rows.append((endpoint, config if endpoint != "baseline-lean" else "", py, rd, py + rd))
    print(benchenv.table(["endpoint", "config", "process us", "redis us", "total us"], rows))
    total = {(row[0], row[1]): row[4] for row in rows}
    for endpoint in ("rank", "neighbors"):
        if (endpoint, "hints") in total:
            print(f"{endpoint}: hints / no hints {total[(endpoint, 'hints')] / total[(endpoint, 'no-hints')]:.2f}x")
    if ("rank", "hints") in total and ("baseline-lean", "") in total:
        print(f"rank / baseline-lean: {total[('rank', 'hints')] / total[('baseline-lean', '')]:.2f}x with hints, "
              f"{total[('rank', 'no-hints')] / total[('baseline-lean', '')]:.2f}x without")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
