#!/usr/bin/env python
"""What each shape of rank index costs in Redis: memory per player and a rank read's CPU.

The views keep R = 2 complete copies of the bucketed index (docs/architecture.md): a copy
is mutated only once no reader can see it. This measures, on a Redis server of its own,
the shapes that trade-off is weighed against (`plain` and `copies` built with plain Redis
commands and the layout's rules from leaderboard.core; `shared` with the shared index's
own plan, writes and read script):

- `plain`: one sorted set of every player (the single-key baseline);
- `copies`: two complete copies, each its score-range buckets (the default 101 x 10,000
  layout) and its lookup (player -> score, listpack-sized shards), as the views hold them;
- `shared`: the shared index (leaderboard.core.shared_index): ONE physical set of
  buckets, in which the players whose score differs between the two versions
  (`--changes`, one epoch's) have an entry per version, per copy and bucket a small set
  of the entries that copy must not see (lex-ordered, so the hidden entries before a
  player are one ZLEXCOUNT however many share their score), and one lookup whose changed
  players hold both versions' values. Built as the views would: every player's shared
  entry, then copy 1's epoch planned by the core and written by
  leaderboard.views.rankview.shared's fenced bucket writes.

Memory is the `used_memory` delta of building each shape (bytes per player). The read
cost is the Redis server's CPU (INFO cpu) of a rank read's second round
trip, sent one read a round trip (as a request does: the server's cost per round trip
included) and 100 a round trip (that cost spread thin: the commands' own). The trip is
the bucket step, ZCOUNT + ZRANK in `copies`; in `shared` the same plus two ZLEXCOUNTs of
the hidden entries above the score and before the player, read atomically (an epoch
writes the shared buckets while the other version is read), as one script or as
MULTI/EXEC (the script is rankview.shared's, sent as it sends
it); then, in both, the two seqlock reads the views send with it. Every answer
(the player's higher scores and position in the bucket) is checked. `copies` and
`shared` are built and read `--rounds` times (medians); `plain` is built once (its
bytes do not vary between builds) unless `--rounds-memory`.

    .venv/bin/python bench/index_designs.py                      # 1M players, ~3 min
    .venv/bin/python bench/index_designs.py --players 1M,10M     # ~3 GB of Redis at 10M, ~15 min

Player ids are `p%08d` and scores follow bench/loader.py's skewed law.
"""

from __future__ import annotations

import argparse
import bisect
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchenv import parse_counts, port_free, table  # noqa: E402
from epoch import redis_cpu_seconds  # noqa: E402
from loader import player_id, redis_used_memory, scores_generate  # noqa: E402

from leaderboard.core.buckets import MAX_SCORE, BucketLayout  # noqa: E402
from leaderboard.core.manifest import lookup_shards_for  # noqa: E402
from leaderboard.core.shared_index import (  # noqa: E402
    BucketOp,
    Seen,
    Views,
    change_plan,
    entry_name,
    hidden_member,
    lookup_encode,
)
from leaderboard.core.tiebreak import index_key  # noqa: E402
from leaderboard.views.rankview.fence import group_write_call  # noqa: E402
from leaderboard.views.rankview.keys import shards_of  # noqa: E402
from leaderboard.views.rankview.shared import bucket_writes, bucket_writes_expected, place_call  # noqa: E402

PIPELINE = 200
# The views' default layout (101 buckets of 10,000 points).
LAYOUT = BucketLayout.uniform()
bucket_of = LAYOUT.bucket_of
# The rank step of each shape whose reads are measured.
STEPS = {"copies": ("pipeline",), "shared": ("script", "transaction")}
SHARED = "{s}"


@contextmanager
def private_redis() -> Iterator[redis.Redis]:
    """A redis-server of this run's own (no persistence), so used_memory counts our keys alone."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH")
    port = next(p for p in range(6480, 6580) if port_free(p))
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", workdir, "--lua-time-limit", "5000"],
                                stdout=subprocess.DEVNULL)
        try:
            r = redis.Redis(port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    if int(r.info("server")["process_id"]) == proc.pid:
                        break
                    sys.exit(f"port {port} answers for another Redis server; not flushing it")
                except redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"redis-server did not start on port {port}")
                    time.sleep(0.05)
            yield r
        finally:
            proc.terminate()
            proc.wait()


class Season:
    """The players' scores in two versions: `old` (the lagging copy's) and `new`."""

    def __init__(self, players: int, changes: int, seed: int):
        self.old = scores_generate(players, seed=seed)
        self.new = list(self.old)
        rng = random.Random(seed + 1)
        self.changed = sorted(rng.sample(range(players), changes))
        for i in self.changed:
            self.new[i] = min(MAX_SCORE, self.old[i] + 10 * rng.randint(1, 50))
        self.shards = lookup_shards_for(players=players)
        # What both copies see of each changed player once copy 1 applied the epoch.
        self.views: dict[int, Views] = {}

    def name(self, i: int) -> str:
        """Player i's entry name in copy 1 (the new version) of the shared index."""
        view = self.views.get(i)
        return entry_name(player_id(i), view is not None and view[1] is not None and view[1].second)


def place(value: str) -> tuple[int, int]:
    """A shared board's (bucket, sorted-set key) of a value's lookup text."""
    return index_key(LAYOUT, None, int(value))


def bucket_key(bucket: int) -> str:
    return f"{SHARED}:z:{bucket}"


def hidden_key(copy: int, bucket: int) -> str:
    return f"{SHARED}:x{copy}:{bucket}"


def buckets_write(r: redis.Redis, prefix: str, entries: Iterator[tuple[str, int]]) -> None:
    by_bucket: dict[int, dict[str, int]] = {}
    pipe = r.pipeline(transaction=False)
    for name, score in entries:
        members = by_bucket.setdefault(bucket_of(score), {})
        members[name] = -score
        if len(members) >= 5000:
            pipe.zadd(f"{prefix}:z:{bucket_of(score)}", members)
            by_bucket[bucket_of(score)] = {}
            if len(pipe) >= PIPELINE:
                pipe.execute()
    for bucket, members in by_bucket.items():
        if members:
            pipe.zadd(f"{prefix}:z:{bucket}", members)
    pipe.execute()


def lookup_write(r: redis.Redis, prefix: str, season: Season, values: Iterator[tuple[int, str | int]]) -> None:
    fields = {player_id(i): value for i, value in values}
    pipe = r.pipeline(transaction=False)
    for shard, players in shards_of(fields, season.shards).items():
        pipe.hset(f"{prefix}:h:{shard}", mapping={pid: fields[pid] for pid in players})
        if len(pipe) >= PIPELINE * 10:
            pipe.execute()
    pipe.execute()


def shape_build(r: redis.Redis, shape: str, season: Season) -> None:
    n = len(season.old)
    if shape == "plain":
        for start in range(0, n, 5000):
            r.zadd("plain", {player_id(i): -season.old[i] for i in range(start, min(n, start + 5000))})
        return
    if shape == "copies":
        for copy, scores in (("{s:0}", season.old), ("{s:1}", season.new)):
            buckets_write(r, copy, ((player_id(i), s) for i, s in enumerate(scores)))
            lookup_write(r, copy, season, enumerate(scores))
        return
    # shared: every player's entry, seen by both copies, then copy 1's epoch.
    buckets_write(r, SHARED, ((player_id(i), s) for i, s in enumerate(season.old)))
    ops: list[BucketOp] = []
    for i in season.changed:
        old = Seen(str(season.old[i]))
        planned, season.views[i] = change_plan(copy=1, player_id=player_id(i), views=(old, old),
                                               value=str(season.new[i]), place=place)
        ops += planned
    fence = f"{SHARED}:f"
    pipe = r.pipeline(transaction=False)
    expected: list[list[int]] = []
    for writes in bucket_writes(ops, bucket_key=bucket_key, hidden_key=hidden_key).values():
        pipe.execute_command(*group_write_call(fence, 1, None, writes))
        expected.append(bucket_writes_expected(writes))
    if pipe.execute() != expected:
        sys.exit("the shared index's epoch did not write what its plan expected")
    lookup_write(r, SHARED, season, ((i, lookup_encode(season.views[i]) or "" if i in season.views else s)
                                     for i, s in enumerate(season.old)))


def expected_places(season: Season, reads: list[int]) -> dict[int, tuple[int, int]]:
    """Each read player's (higher scores, position) within its bucket in the new version."""
    wanted = {bucket_of(season.new[i]) for i in reads}
    order: dict[int, list[tuple[int, str]]] = {b: [] for b in wanted}
    for i, s in enumerate(season.new):
        if bucket_of(s) in order:
            order[bucket_of(s)].append((-s, player_id(i)))
    for entries in order.values():
        entries.sort()
    out: dict[int, tuple[int, int]] = {}
    for i in reads:
        entries = order[bucket_of(season.new[i])]
        out[i] = (bisect.bisect_left(entries, (-season.new[i], "")),
                  bisect.bisect_left(entries, (-season.new[i], player_id(i))))
    return out


def read_cost(r: redis.Redis, step: str, season: Season, reads: list[int], batch: int) -> float:
    """Redis CPU (microseconds, INFO cpu) of one rank read's second round
    trip in copy 1, every answer checked: the bucket step, then the two reads of the
    seqlock that tell a reader its copy did not change meanwhile (the group fence's and
    the copy meta's generation), as the views send them. The bucket step: "pipeline" (the
    copies' ZCOUNT + ZRANK), "script" (the shared index's place script, sent as
    rankview.shared sends it: EVAL, whose body Redis hashes on every call) or
    "transaction" (its four commands in MULTI/EXEC, which a single Redis and one slot of a
    cluster both run atomically). `batch` reads share a round trip (1: each read its own, as a request's)."""
    expected = expected_places(season, reads)
    base = "{s:1}" if step == "pipeline" else SHARED
    r.hset(f"{base}:f", mapping={"token": 1, "gen": 1})
    r.hset(f"{base}:copy:1", mapping={"gen": 1, "version": 1})
    answers: list[Any] = []
    before = redis_cpu_seconds(r)
    for start in range(0, len(reads), batch):
        pipe = r.pipeline(transaction=False)
        for i in reads[start:start + batch]:
            bucket, key = place(str(season.new[i]))
            name = season.name(i)
            if step == "pipeline":
                pipe.execute_command("ZCOUNT", f"{base}:z:{bucket}", "-inf", f"({key}")
                pipe.execute_command("ZRANK", f"{base}:z:{bucket}", player_id(i))
            elif step == "script":
                pipe.execute_command(*place_call(bucket=bucket_key(bucket), hidden=hidden_key(1, bucket), key=key,
                                                 name=name))
            else:
                prefix = hidden_member(key)
                pipe.execute_command("MULTI")
                pipe.execute_command("ZCOUNT", bucket_key(bucket), "-inf", f"({key}")
                pipe.execute_command("ZRANK", bucket_key(bucket), name)
                pipe.execute_command("ZLEXCOUNT", hidden_key(1, bucket), "-", f"({prefix}")
                pipe.execute_command("ZLEXCOUNT", hidden_key(1, bucket), "-", f"({prefix}{name}")
                pipe.execute_command("EXEC")
            pipe.execute_command("HGET", f"{base}:f", "gen")
            pipe.execute_command("HMGET", f"{base}:copy:1", "gen", "version")
        replies = pipe.execute()
        per_read = {"pipeline": 4, "script": 3, "transaction": 8}[step]
        for k in range(0, len(replies), per_read):
            reply = replies[k:k + per_read]
            if step == "pipeline":
                answers.append(tuple(reply[:2]))
            elif step == "script":
                answers.append(tuple(reply[0]))
            else:
                higher, index, above, before_me = reply[5]
                answers.append((higher - above, index - before_me))
    spent = redis_cpu_seconds(r) - before
    wrong = [i for i, got in zip(reads, answers, strict=True) if got != expected[i]]
    if wrong:
        sys.exit(f"{step}: {len(wrong)} wrong answers, first player {wrong[0]}: "
                 f"{answers[reads.index(wrong[0])]} != {expected[wrong[0]]}")
    return spent * 1e6 / len(reads)


def measure(r: redis.Redis, players: int, args: argparse.Namespace) -> dict[Any, Any]:
    season = Season(players, args.changes, args.seed)
    rng = random.Random(args.seed + 2)
    out: dict[Any, Any] = {"players": players}  # a shape's bytes, a (step, batch)'s microseconds
    for shape in ("plain", "copies", "shared"):
        sizes: list[float] = []
        costs: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds if shape in ("copies", "shared") or args.rounds_memory else 1):
            r.flushall()  # synchronous: used_memory below counts none of the last build
            before = redis_used_memory(r)
            started = time.perf_counter()
            shape_build(r, shape, season)
            sizes.append((redis_used_memory(r) - before) / players)
            print(f"  {players:,} {shape}: {sizes[-1]:.1f} B/player, built in {time.perf_counter() - started:.0f} s",
                  flush=True)
            for step in STEPS.get(shape, ()):
                for batch in args.read_batch:
                    reads = [rng.randrange(players) for _ in range(args.reads)]
                    costs.setdefault((step, batch), []).append(read_cost(r, step, season, reads, batch))
                    print(f"    {step}, {batch} a round trip: {costs[step, batch][-1]:.1f} us of Redis CPU a read",
                          flush=True)
        out[shape] = statistics.median(sizes)
        out.update({key: statistics.median(values) for key, values in costs.items()})
    r.flushall()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--players", default="1M", help="comma-separated sizes (1M, 10M)")
    parser.add_argument("--changes", type=int, default=10_000, help="players whose score differs between copies")
    parser.add_argument("--reads", type=int, default=20_000, help="rank reads per round")
    parser.add_argument("--read-batch", type=lambda text: [int(n) for n in text.split(",")], default=[1, 100],
                        help="reads per round trip, comma-separated (1: each its own, as a request's; 100: the "
                             "server's per-round-trip cost spread over them, the commands' own cost)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the copies and shared shapes")
    parser.add_argument("--rounds-memory", action="store_true", help="repeat the other shapes' builds too")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sizes: list[list[str]] = []
    reads: list[list[str]] = []
    with private_redis() as r:
        version = r.info("server")["redis_version"]
        for players in parse_counts(args.players):
            result = measure(r, players, args)
            plain = result["plain"]
            sizes.append([f"{players:,}", f"{plain:.1f}"] + [f"{result[s]:.1f} ({result[s] / plain:.2f}x)"
                                                             for s in ("copies", "shared")])
            for batch in args.read_batch:
                copies = result["pipeline", batch]
                reads.append([f"{players:,}", str(batch), f"{copies:.1f}"]
                             + [f"{result[step, batch]:.1f} ({result[step, batch] / copies:.2f}x)"
                                for step in ("script", "transaction")])
    print(f"\nRedis {version}, {args.changes:,} players differ between the copies. Bytes a player (used_memory):")
    print(table(["players", "one sorted set", "copies", "shared"], sizes))
    print("\nA rank read's second round trip, microseconds of Redis CPU a read:")
    print(table(["players", "reads a round trip", "copies", "shared, script", "shared, MULTI/EXEC"], reads))


if __name__ == "__main__":
    main()
