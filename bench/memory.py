#!/usr/bin/env python
"""Redis memory per player: both copies of the views (sorted buckets + lookup hashes) vs. one plain sorted set.

For each size, the loader (bench/loader.py) fills a fresh season and builds both copies;
used_memory (INFO memory) is read before the build and after each copy. Then MEMORY
USAGE of every key of each copy splits the figure into the bucket sorted sets and the
lookup hash shards (as many as the copy was built with; OBJECT ENCODING says how many
are listpacks), and the same players are put in ONE plain sorted set (what a
single-index design would hold) to measure it the same way (used_memory delta).

    SECRET_KEY=x .venv/bin/python bench/memory.py                 # 1M players (~1 min)
    SECRET_KEY=x .venv/bin/python bench/memory.py --players 1M,10M  # ~3.5 GB of Redis at 10M

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
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.materializer import COPIES, season_keys

    r = redis_get()
    result = loader.load_season(players=players, seed=args.seed, kind="memory", verbose=True)
    season = result.season
    keys = season_keys(season)
    extra: list[str] = []
    try:
        out: dict[str, Any] = {"players": players, "used_before": result.memory_before,
                               "used_after": list(result.memory_after_copy)}
        layout = season.bucket_layout
        started = time.perf_counter()
        for copy in COPIES:
            meta = rankview.copy_meta_load(r, keys, copy)
            assert meta is not None
            buckets = [keys.bucket(copy, layout.layout_id, b, groups=meta.groups) for b in range(layout.size)]
            lookups = [keys.lookup(copy, k, groups=meta.groups) for k in range(meta.lookup_shards)]
            out[f"zsets_{copy}"] = keys_usage(r, buckets, args.samples)
            out[f"hashes_{copy}"] = keys_usage(r, lookups, args.samples)
            out[f"shards_{copy}"] = meta.lookup_shards
            out[f"listpacks_{copy}"] = keys_listpacks(r, lookups)
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
        copy0 = m["used_after"][0] - m["used_before"]
        copy1 = m["used_after"][1] - m["used_after"][0]
        usage = m["zsets_0"] + m["hashes_0"] + m["zsets_1"] + m["hashes_1"]
        rows.append((benchenv.human(n), m["zsets_0"] / n, m["hashes_0"] / n, usage / n, m["baseline_usage"] / n,
                     usage / m["baseline_usage"], copy0 / n, copy1 / n, m["baseline_delta"] / n, usage / 2**30))
    print(benchenv.table(["players", "buckets/copy", "lookup/copy", "both copies", "one plain zset",
                          "ours / plain", "used_memory: copy 0", "copy 1", "plain zset", "both copies GiB"], rows))
    print()
    print(benchenv.table(["players", "lookup shards/copy", "players/shard", "listpack shards: copy 0", "copy 1"],
                         [(benchenv.human(m["players"]), m["shards_0"], m["players"] / m["shards_0"],
                           f"{m['listpacks_0'] / m['shards_0']:.1%}", f"{m['listpacks_1'] / m['shards_1']:.1%}")
                          for m in results]))
    print()
    print("buckets, lookup, both copies and one plain zset: MEMORY USAGE of the keys (exact per key, without")
    print("allocator fragmentation). used_memory columns: INFO memory deltas while building, server-wide, so")
    print("other clients of the same Redis server add noise to them.")
    biggest = max(results, key=lambda m: m["players"])
    copies = [key.removeprefix("zsets_") for key in biggest if key.startswith("zsets_")]
    per_copy = sum(biggest[f"zsets_{c}"] + biggest[f"hashes_{c}"] for c in copies) / len(copies) / biggest["players"]
    benchenv.figures_record(
        "redis_bytes_per_player_per_copy", per_copy, "bytes",
        note=(f"{biggest['players']:,} players, MEMORY USAGE (SAMPLES {args.samples}) of one copy's bucket sorted "
              f"sets and lookup hashes, mean of {len(copies)} copies; 9-byte player ids"),
        path=args.figures,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
