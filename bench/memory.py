#!/usr/bin/env python
"""Redis memory per player: everything the views hold (one index, both copies its sides:
buckets, hidden sets, lookup shards, manifests and metas) vs. one plain sorted set.

For each size, the loader (bench/loader.py) fills a fresh season, builds its index and
publishes version 1; used_memory (INFO memory) is read before the build and after the
publication. Then an epoch of --changes players (moved across buckets, as bench/epoch.py
moves them) is applied to the other copy and published without the catch-up, so the two
sides differ by one epoch (entries of both values, hidden sets, two-part lookup fields:
the most the views hold between two epochs), and used_memory is read again. MEMORY USAGE
of every key of the index splits the figure into buckets, hidden sets and lookup shards
(OBJECT ENCODING says how many shards are listpacks), and the same players are put in
ONE plain sorted set (what a single-index design would hold) to measure it the same way.

    SECRET_KEY=x .venv/bin/python bench/memory.py                 # 1M players (~1 min)
    SECRET_KEY=x .venv/bin/python bench/memory.py --players 1M,10M  # ~2 GB of Redis at 10M

Redis 7.0 here measured ~109 bytes per member of a sorted set with ~9-byte members,
~56 bytes per entry of a hashtable-encoded hash and ~15 of a listpack-encoded one
(docs/benchmarks.md, Memory); player ids here are 9 bytes (`p%08d`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import epoch as epoch_bench  # noqa: E402
import loader  # noqa: E402

BATCH = 10_000  # commands per pipeline (a 10M-player copy has ~260,000 lookup shards)


def keys_usage(r: Any, keys: list[str], samples: int) -> int:
    total = 0
    for start in range(0, len(keys), BATCH):
        with r.pipeline(transaction=False) as pipe:
            for key in keys[start:start + BATCH]:
                pipe.memory_usage(key, samples=samples)
            total += sum(int(usage or 0) for usage in pipe.execute())
    return total


def keys_listpacks(r: Any, keys: list[str]) -> int:
    """How many of `keys` are listpack-encoded."""
    listpacks = 0
    for start in range(0, len(keys), BATCH):
        with r.pipeline(transaction=False) as pipe:
            for key in keys[start:start + BATCH]:
                pipe.object("encoding", key)
            listpacks += sum(1 for encoding in pipe.execute() if encoding in (b"listpack", "listpack"))
    return listpacks


def measure(players: int, args: argparse.Namespace) -> dict[str, Any]:
    from leaderboard.recovery.rebuild import season_epoch_advance
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys

    r = redis_get()
    result = loader.load_season(players=players, seed=args.seed, kind="memory", verbose=True)
    season = result.season
    keys = season_keys(season)
    extra: list[str] = []
    try:
        # Published: memory_after_copy[-1] was read after the build, before version 1.
        out: dict[str, Any] = {"players": players, "used_before": result.memory_before,
                               "used_built": result.memory_after_copy[-1],
                               "used_published": loader.redis_used_memory(r)}
        maker = epoch_bench.ChangeMaker(result.scores, seed=args.seed + players)
        epoch_bench.ingest(season, maker.events(args.changes))
        outcome = season_epoch_advance(season=season, r=r, catch_up=False)
        if outcome.status != "published":
            raise SystemExit(f"the epoch of {args.changes:,} changes did not publish: {outcome}")
        out["used_pending"] = loader.redis_used_memory(r)
        manifest = rankview.manifest_get(r, keys, outcome.version or 0)
        assert manifest is not None
        layout, index, groups = manifest.layout, manifest.index, manifest.groups
        started = time.perf_counter()
        buckets = [keys.bucket(index, layout.layout_id, b, groups=groups) for b in range(layout.size)]
        hidden = [keys.hidden(index, side, layout.layout_id, b, groups=groups)
                  for b in range(layout.size) for side in rankview.SIDES]
        lookups = [keys.lookup(index, k, groups=groups) for k in range(manifest.lookup_shards)]
        control = [keys.ptr, *(keys.copy_meta(copy) for copy in rankview.copies_get(r, keys)),
                   keys.manifest(outcome.version or 0), keys.manifest((outcome.version or 0) - 1)]
        out["zsets"] = keys_usage(r, buckets, args.samples)
        out["hidden"] = keys_usage(r, hidden, args.samples)
        out["hashes"] = keys_usage(r, lookups, args.samples)
        out["control"] = keys_usage(r, control, args.samples)
        out["shards"] = manifest.lookup_shards
        out["listpacks"] = keys_listpacks(r, lookups)
        out["usage_seconds"] = time.perf_counter() - started
        # One plain sorted set with the same players, measured the same way.
        before = loader.redis_used_memory(r)
        key = f"{keys.prefix}:memory-baseline:{season.slug}"
        extra.append(key)
        batch = 20_000
        scores = result.scores
        for start in range(0, players, batch):
            stop = min(players, start + batch)
            r.zadd(key, {loader.player_id(i): scores[i] for i in range(start, stop)})
        out["baseline_delta"] = loader.redis_used_memory(r) - before
        out["baseline_usage"] = keys_usage(r, [key], args.samples)
        return out
    finally:
        benchenv.season_cleanup(season, keep=args.keep, extra_keys=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M", help="season sizes, comma-separated (e.g. 1M,10M)")
    parser.add_argument("--samples", type=int, default=5,
                        help="MEMORY USAGE SAMPLES (0 = every element: exact, slow on big keys)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--changes", type=int, default=10_000,
                        help="players of the epoch applied to one copy only before measuring (the sides' difference)")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    sizes = benchenv.parse_counts(args.players)
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from leaderboard.redis_client import redis_get

    info = redis_get().info("server")
    print(f"# redis {info['redis_version']}, maxmemory policy {redis_get().config_get('maxmemory-policy')}")
    results = [measure(n, args) for n in sizes]

    print()
    print("## Redis memory per player (bytes; used_memory deltas unless noted)")
    print()
    rows = []
    for m in results:
        n = m["players"]
        usage = m["zsets"] + m["hidden"] + m["hashes"] + m["control"]
        rows.append((benchenv.human(n), (m["used_published"] - m["used_before"]) / n,
                     (m["used_pending"] - m["used_before"]) / n, m["baseline_delta"] / n,
                     (m["used_pending"] - m["used_before"]) / m["baseline_delta"],
                     m["zsets"] / n, m["hidden"] / n, m["hashes"] / n, usage / n, m["baseline_usage"] / n,
                     (m["used_pending"] - m["used_before"]) / 2**30))
    print(benchenv.table(["players", "both copies, published", f"one epoch of {args.changes:,} pending",
                          "one plain zset", "pending / plain", "MEMORY USAGE: buckets", "hidden sets", "lookup",
                          "everything", "plain zset", "GiB"], rows))
    print()
    print(benchenv.table(["players", "lookup shards", "players/shard", "listpack shards"],
                         [(benchenv.human(m["players"]), m["shards"], m["players"] / m["shards"],
                           f"{m['listpacks'] / m['shards']:.1%}") for m in results]))
    print()
    print("used_memory columns: INFO memory deltas from before the build (server-wide: run on a Redis of its own).")
    print("'published': the index built and version 1 published, both copies seeing every entry; 'pending':")
    print("then one epoch applied to the other copy and published, the catch-up not run, so both versions are")
    print("held. MEMORY USAGE columns (SAMPLES as given) split the pending state: bucket sorted sets, hidden")
    print("sets, lookup shards, and everything with the pointer, copy metas and manifests.")
    biggest = max(results, key=lambda m: m["players"])
    benchenv.figures_record(
        "redis_bytes_per_player", (biggest["used_pending"] - biggest["used_before"]) / biggest["players"],
        "bytes",
        note=(f"{biggest['players']:,} players, used_memory of everything the views hold (one index, both copies "
              f"its sides) with one epoch of {args.changes:,} changes pending on one side; 9-byte player ids"),
        path=args.figures,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
