#!/usr/bin/env python
"""Epoch benchmark: time to publish a version vs. changed players and season size.

For each season size (players) the loader (bench/loader.py) fills a fresh season and
publishes version 1. Then, for each change count K, rounds of:

1. K distinct random players change score through the real write path,
   leaderboard.ingest.services.score_events_apply, in batches of 1,000 events (ledger rows,
   current scores and the change stream, one transaction per batch). Every change moves
   its player to another bucket: 70% `result` events raising the score by 10,000..100,000
   points, the rest `correction` events lowering it by at least 10,000 (players already
   in the first bucket always go up). The ingest rate is printed too.
2. After the copy grace period (COPY_GRACE_SECONDS, so the epoch never sleeps for it),
   leaderboard.views.epoch.season_epoch_run is timed: read the change stream since the
   older copy's watermark, apply it in fenced MULTI/EXEC chunks, verify counts, build
   the top 100, store the manifest, swap the pointer (`publish ms`: the version is
   served from here on, EpochResult.duration_ms), then record the manifest row, notify
   live sockets and record metrics (`task ms`: the whole call).

With R = 2 copies every change must reach both. By default (EPOCH_CATCH_UP) the
epoch applies the changes since the current version to the older copy, publishes it,
and then, once the grace period of the copy it replaced is over, brings that one up to
the new version too (`catch-up ms`, off the publication path). With --modes including
`no-catch-up` the same cells are also run the old way, as a baseline in the same run:
each epoch brings its copy up from its own watermark, applying the changes of the last
two epochs before the swap. `applied` is the players the epoch moved before the swap
(EpochResult.applied). `cpu ms` is the coordinator process's own CPU time for the whole
call (Python; Redis and PostgreSQL work is not in it), a figure less sensitive to other
load on the machine; `redis cpu ms` is the CPU time of the Redis server meanwhile (INFO
cpu; both copies' work; every client of the server counts, so run it on a quiet
server). `task ms` is the whole call; with the catch-up it includes the grace period
(COPY_GRACE_SECONDS) the catch-up waits out. One warm-up round per cell is not timed;
then --repeats timed rounds give the median and p90.
Regional boards (--scenarios): `plain` is a season without regions (the baseline);
`regional` a season with three regions (each player in one), the same K score changes
per round; `moves` that season with K changes per round of which half are region moves
(profile writes through leaderboard.profiles.player_profiles_apply, moving the player's
season score between regional boards) and half score changes. Board kinds: `sum` is a
season of mode sum, each change a result of signed points (the same moves; the change
stream carries absolute scores, so the epoch is the same work); `wide` a season over
0..1,048,576,000,000 (`--max-score`), every score and move 2^20 times the plain one's;
`asc` a season of order asc (lower first, its views holding max-score - score), the same
moves.
Each scenario loads its own season; the ratios against `plain` are printed.

Parts (--parts 1,2,4, docs/architecture.md, Parts): each cell again with EPOCH_PARTS at
each value, on seasons of --partitions ledger partitions (default 8). --workers W starts W
Celery worker processes (solo pool) for the run, which take the parts the coordinator
(this process) sends; it runs one part of each apply itself, and any no worker claims.
`serial ms` is the publish time but the wait for the publication's parts (the
coordinator's own work: heads, hand-out, verification, top 100, manifest, swap), `coord
cpu ms` this process's CPU but the parts it ran itself, `part cpu ms` the median CPU of
one part, `part ms/1k` a part's time at work per 1,000 of its changed players (one side,
not counting a grace period waited out), `parts cpu us/change` all parts' CPU (both
sides) per changed player. The figures file gets a part's time, the parts' CPU, the
coordinator's serial time and Redis's CPU from the biggest cell with the fewest parts.

The target (docs/benchmarks.md, Epoch publish time): at 10M players an epoch of 10k changes publishes in < 500 ms,
and the time follows K, not the number of players.

    SECRET_KEY=x .venv/bin/python bench/epoch.py                       # 100k,1M x 1k,10k (~3 min)
    SECRET_KEY=x .venv/bin/python bench/epoch.py --players 100k,1M,10M --changes 1k,10k,100k   # full grid (~20 min)
    SECRET_KEY=x .venv/bin/python bench/epoch.py --players 1M --changes 10k --modes catch-up \
        --scenarios plain,regional,moves                                # regional boards' cost (~6 min)
    SECRET_KEY=x .venv/bin/python bench/epoch.py --players 1M --changes 10k --modes catch-up \
        --scenarios plain,sum,wide,asc                                  # board kinds against best
    SECRET_KEY=x .venv/bin/python bench/epoch.py --players 1M --changes 10k --modes catch-up \
        --redis single,cluster                                          # one Redis vs a 3-master cluster
    SECRET_KEY=x .venv/bin/python bench/epoch.py --players 1M,10M --changes 1k,10k,100k --modes catch-up \
        --parts 1,2,4 --workers 2 --repeats 3                           # parts on 2 workers (~1 h)

--redis single,cluster measures the same cells on the one Redis server (--redis-url) and
then on a local Redis Cluster of 3 masters this run starts (config/local_cluster.py:
redis-server processes on free ports from 17000, nothing persisted, stopped at the end),
each with a season loaded for it; `redis cpu ms` is then the sum over the masters, and
the ratio cluster / single of each cell's median is printed. The Celery broker and the
channel layer stay on the single server, as a cluster deployment must have them.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from array import array
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

BATCH = 1000
BUCKET_WIDTH = 10_000
MAX_SCORE = 1_000_000
TARGET_MS = 500.0


MODES = {"catch-up": True, "no-catch-up": False}
TARGETS = ("single", "cluster")
CLUSTER_MASTERS = 3
SCENARIOS = ("plain", "regional", "moves", "sum", "wide", "asc")
REGIONS = ("na", "eu", "apac")
# The season each scenario runs on (`moves` on the one `regional` loads): its regions,
# mode, order and score scale. `sum`: a sum season whose changes are results of signed
# points; `wide`: scores 2^20 times the default's over 0..1,048,576,000,000 (--max-score);
# `asc`: a season of order asc (lower first), the same moves.
LOADS: dict[str, dict[str, Any]] = {
    "plain": {}, "regional": {"regions": REGIONS}, "sum": {"mode": "sum"}, "wide": {"scale": 2**20},
    "asc": {"order": "asc"},
}


@dataclass
class Cell:
    players: int
    changes: int
    mode: str
    scenario: str = "plain"
    redis: str = "single"
    parts: int = 1
    epoch_ms: list[float] = field(default_factory=list)  # to publication: the pointer swap
    task_ms: list[float] = field(default_factory=list)  # the whole call, its bookkeeping after the swap too
    cpu_ms: list[float] = field(default_factory=list)
    redis_ms: list[float] = field(default_factory=list)
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)
    applied: list[int] = field(default_factory=list)
    catch_up_ms: list[float] = field(default_factory=list)
    ingest_s: list[float] = field(default_factory=list)
    # The coordinator's own share: its CPU but the parts it ran itself, and the publish
    # time but the wait for the parts of the publication's apply.
    coordinator_cpu_ms: list[float] = field(default_factory=list)
    serial_ms: list[float] = field(default_factory=list)
    part_cpu_ms: list[float] = field(default_factory=list)  # each part of each apply (publication, catch-up)
    parts_cpu_ms: list[float] = field(default_factory=list)  # all parts of an epoch, added up
    # A part's time at work (not asleep for a grace period) per 1,000 of its changed
    # players, one side: what sets the apply's wall time with the changes cut into parts.
    part_ms_per_1k: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return benchenv.median(self.epoch_ms)


class ChangeMaker:
    """Distinct random players per round, each moved to another bucket with a newer score_version."""

    def __init__(self, scores: array, *, seed: int, scale: int = 1, summed: bool = False,
                 ascending: bool = False):
        # `scale`: the season's scores are the default range's times it; `summed`: a sum
        # season, where each change is a result of the signed difference in points;
        # `ascending`: an asc season, where a move down is the result and up a correction.
        self.scale, self.summed, self.ascending = scale, summed, ascending
        self.scores = array("q", scores)
        self.versions = array("q", [1]) * len(scores)
        self.rng = random.Random(seed)
        self.round = 0
        self.profile_versions: dict[int, int] = {}
        self.regions: dict[int, str] = {}  # players moved: their region now

    def region_moves(self, k: int) -> float:
        """Move k random players to another region through the profile write path; seconds taken."""
        from leaderboard.core.profiles import ProfileWrite
        from leaderboard.profiles import player_profiles_apply

        writes = []
        for i in self.rng.sample(range(len(self.scores)), k):
            version = self.profile_versions.get(i, 0) + 1
            self.profile_versions[i] = version
            here = self.regions.get(i) or loader.region_of(i, REGIONS)
            region = REGIONS[(REGIONS.index(here) + 1) % len(REGIONS)]
            self.regions[i] = region
            writes.append(ProfileWrite(player_id=loader.player_id(i), region=region, profile_version=version))
        started = time.perf_counter()
        for start in range(0, len(writes), BATCH):
            player_profiles_apply(profiles=writes[start : start + BATCH], client=None)
        return time.perf_counter() - started

    def events(self, k: int) -> list[Any]:
        from leaderboard.core.events import KIND_CORRECTION, KIND_RESULT, ScoreEvent

        self.round += 1
        rng = self.rng
        now = datetime.now(UTC)
        out = []
        width, top = BUCKET_WIDTH * self.scale, MAX_SCORE * self.scale
        for j, i in enumerate(rng.sample(range(len(self.scores)), k)):
            cur = self.scores[i]
            version = self.versions[i] + 1
            if cur < width or (cur <= top - width and rng.random() < 0.7):
                new = min(top, cur + rng.randint(BUCKET_WIDTH, 10 * BUCKET_WIDTH) * self.scale)
                kind, reason = KIND_RESULT, ""
            else:
                new = rng.randint(0, cur - width)
                kind, reason = KIND_CORRECTION, "bench: score revoked"
            if self.ascending:
                kind, reason = (KIND_RESULT, "") if new < cur else (KIND_CORRECTION, "bench: score revoked")
            self.scores[i] = new
            self.versions[i] = version
            event = ScoreEvent(event_id=f"r{self.round}-{j}", match_id=f"m{self.round}-{j}",
                               player_id=loader.player_id(i), best_score=new, score_version=version,
                               completed_at=now, kind=kind, reason=reason)
            if self.summed:
                # The same move as a result of signed points (a sum season's corrections
                # amend one result; a move down is a negative result here).
                event = replace(event, best_score=0, score_version=0, kind=KIND_RESULT, reason="", points=new - cur)
            out.append(event)
        return out


def redis_servers(r: Any) -> list[Any]:
    """A plain client of each server holding the views: `r`, or every master of a cluster."""
    from leaderboard.redis_client import redis_cluster_of

    cluster = redis_cluster_of(r)
    if cluster is None:
        return [r]
    return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]


def redis_commandstats(r: Any) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) the Redis servers executed so far (all clients: INFO commandstats)."""
    out: dict[str, tuple[int, int]] = {}
    for server in redis_servers(r):
        for k, v in server.info("commandstats").items():
            if k != "cmdstat_info":
                calls, usec = out.get(k.removeprefix("cmdstat_"), (0, 0))
                out[k.removeprefix("cmdstat_")] = (calls + int(v["calls"]), usec + int(v["usec"]))
    return out


def redis_cpu_seconds(r: Any) -> float:
    """CPU time the Redis server processes used so far (INFO cpu: user + system, summed)."""
    total = 0.0
    for server in redis_servers(r):
        cpu = server.info("cpu")
        total += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return total


def redis_target_use(target: str, single_url: str) -> Any:
    """Point the rank views at `target` ("single": the --redis-url server; "cluster": a
    local 3-master cluster started now), as a deployment's settings would; returns the
    started cluster (None for single), for `cluster_stop`."""
    from django.conf import settings

    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview

    started = None
    if target == "cluster":
        from config.local_cluster import cluster_start

        started = cluster_start(masters=CLUSTER_MASTERS)
        print(f"# Redis Cluster of {CLUSTER_MASTERS} masters on ports {started.master_ports()}", flush=True)
    settings.REDIS_CLUSTER = started is not None
    settings.REDIS_URL = started.url if started is not None else single_url
    redis_get.cache_clear()
    rankview.manifest_cache_clear()
    return started


def commandstats_delta(before: dict[str, tuple[int, int]],
                       after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            out[name] = (calls - c0, usec - u0)
    return out


def ingest(season: Any, events: list[Any]) -> float:
    from leaderboard.ingest.services import score_events_apply

    started = time.perf_counter()
    applied = 0
    for start in range(0, len(events), BATCH):
        result = score_events_apply(season=season, events=events[start : start + BATCH], client=None)
        applied += sum(1 for o in result.outcomes if o.status == "applied")
    if applied != len(events):
        raise SystemExit(f"only {applied} of {len(events)} events were applied")
    return time.perf_counter() - started


def run_size(players: int, changes: list[int], args: argparse.Namespace, profile_dir: Path | None,
             target: str = "single") -> list[Cell]:
    from leaderboard.redis_client import redis_get

    r = redis_get()
    cells: list[Cell] = []
    # `moves` runs on the season `regional` loaded (or loads one itself).
    for loaded in dict.fromkeys("regional" if s == "moves" else s for s in args.scenarios):
        load = LOADS[loaded]
        result = loader.load_season(players=players, seed=args.seed, kind="epoch", layout=args.layout,
                                    verbose=True, **load)
        season = result.season
        print(f"# loaded {players:,} players ({loaded}): COPY {result.copy_seconds:.1f}s, builds "
              f"{' + '.join(f'{s:.1f}s' for s in result.build_seconds)}", flush=True)
        maker = ChangeMaker(result.scores, seed=args.seed + players, scale=load.get("scale", 1),
                            summed=load.get("mode") == "sum", ascending=load.get("order") == "asc")
        del result
        try:
            for scenario in [s for s in args.scenarios if ("regional" if s == "moves" else s) == loaded]:
                for k in changes:
                    if k > players:
                        print(f"# skip {k:,} changes at {players:,} players")
                        continue
                    for mode in args.modes:
                        for parts in args.parts:
                            cell = Cell(players=players, changes=k, mode=mode, scenario=scenario, redis=target,
                                        parts=parts)
                            cells.append(run_cell(season, maker, r, cell, args, profile_dir))
        finally:
            benchenv.season_cleanup(season, keep=args.keep)
    return cells


def run_cell(season: Any, maker: ChangeMaker, r: Any, cell: Cell, args: argparse.Namespace,
             profile_dir: Path | None) -> Cell:
    from django.conf import settings

    from leaderboard.views.invariants import version_check
    from leaderboard.views.season_index import season_keys
    from leaderboard.views.signals import epoch_parts_applied

    settings.EPOCH_PARTS = cell.parts
    reports: list[Any] = []

    def reported(report: Any, **_: Any) -> None:
        reports.append(report)

    epoch_parts_applied.connect(reported, dispatch_uid="bench-epoch-parts")
    try:
        _rounds(season, maker, r, cell, args, profile_dir, reports)
    finally:
        epoch_parts_applied.disconnect(dispatch_uid="bench-epoch-parts")
    check = version_check(r=r, keys=season_keys(season), sample=100, seed=cell.changes)
    if not check.ok:
        raise SystemExit(f"invariants failed after the {cell.changes:,}-change epochs: {check.failures()}")
    print(f"# {cell.players:,} players x {cell.changes:,} changes, {cell.mode}, {cell.scenario}, {cell.redis}, "
          f"{cell.parts} part(s): median {cell.median_ms:.0f} ms "
          f"(runs: {', '.join(f'{m:.0f}' for m in cell.epoch_ms)}; applied "
          f"{', '.join(str(a) for a in cell.applied)}); invariants ok", flush=True)
    # EXEC's time includes the commands it ran: leave it out.
    busiest = sorted(((n, v) for n, v in cell.commands.items() if n != "exec"), key=lambda item: -item[1][1])
    print("#   redis commands, last epoch: " + ", ".join(f"{name} {calls}x {usec / 1000:.1f} ms"
                                               for name, (calls, usec) in busiest[:6]), flush=True)
    return cell


def _rounds(season: Any, maker: ChangeMaker, r: Any, cell: Cell, args: argparse.Namespace,
            profile_dir: Path | None, reports: list[Any]) -> None:
    from django.conf import settings

    from leaderboard.recovery.rebuild import season_epoch_advance

    catch_up = MODES[cell.mode]
    here = f":{os.getpid()}:"
    grace = settings.COPY_GRACE_SECONDS + 0.05
    last_epoch_end = time.monotonic()
    moves = cell.changes // 2 if cell.scenario == "moves" else 0
    for round_no in range(args.warmup + args.repeats):
        events = maker.events(cell.changes - moves)
        ingest_s = ingest(season, events) + (maker.region_moves(moves) if moves else 0.0)
        wait = last_epoch_end + grace - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        profiler = None
        if profile_dir is not None and round_no == args.warmup + args.repeats - 1:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
        reports.clear()
        stats_before = redis_commandstats(r)
        redis_cpu_before = redis_cpu_seconds(r)
        started = time.perf_counter()
        cpu_started = time.process_time()
        outcome = season_epoch_advance(season=season, r=r, catch_up=catch_up)
        elapsed_ms = (time.perf_counter() - started) * 1000
        cpu_ms = (time.process_time() - cpu_started) * 1000
        redis_ms = (redis_cpu_seconds(r) - redis_cpu_before) * 1000
        delta = commandstats_delta(stats_before, redis_commandstats(r))
        last_epoch_end = time.monotonic()
        if profiler is not None:
            profiler.stop()
            assert profile_dir is not None
            path = profile_dir / (f"epoch-{benchenv.human(cell.players)}-{benchenv.human(cell.changes)}-{cell.mode}"
                                  f"-{cell.parts}p.txt")
            path.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
            print(f"# profile written to {path}")
        if outcome.status != "published":
            raise SystemExit(f"epoch did not publish: {outcome}")
        if catch_up and outcome.catch_up_ms is None:
            raise SystemExit(f"the older copy was not caught up: {outcome}")
        if round_no >= args.warmup:
            cell.epoch_ms.append(outcome.duration_ms)
            cell.task_ms.append(elapsed_ms)
            cell.cpu_ms.append(cpu_ms)
            cell.redis_ms.append(redis_ms)
            cell.commands = delta
            cell.applied.append(outcome.applied)
            cell.catch_up_ms.append(outcome.catch_up_ms or 0.0)
            cell.ingest_s.append(ingest_s)
            parts = [p for report in reports for p in report.parts]
            inline_ms = sum(p.cpu_seconds for p in parts if here in p.runner) * 1000
            cell.coordinator_cpu_ms.append(cpu_ms - inline_ms)
            cell.serial_ms.append(outcome.duration_ms - outcome.parts_seconds * 1000)
            cell.part_cpu_ms += [p.cpu_seconds * 1000 for p in parts]
            cell.parts_cpu_ms.append(sum(p.cpu_seconds for p in parts) * 1000)
            at_work = sum(p.seconds - p.waited for p in parts)
            cell.part_ms_per_1k.append(at_work * 1e6 / max(1, sum(p.players for p in parts)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="100k,1M", help="season sizes, comma-separated (full grid: 100k,1M,10M)")
    parser.add_argument("--changes", default="1k,10k", help="changed players per epoch (full grid: 1k,10k,100k)")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per cell")
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs per cell first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="catch-up,no-catch-up",
                        help="catch-up (the default behaviour) and/or no-catch-up (the baseline), comma-separated")
    parser.add_argument("--layout", choices=["uniform", "split"], default="uniform",
                        help="bucket layout of the season (bench/loader.py --help)")
    parser.add_argument("--scenarios", default="plain",
                        help="plain (no regions), regional (3 regions), moves (3 regions, half the changes are "
                             "region moves), sum (a sum season), wide (scores over 0..2^40), asc (order asc), "
                             "comma-separated")
    parser.add_argument("--redis", default="single",
                        help="single (the --redis-url server) and/or cluster (a local 3-master Redis Cluster "
                             "started for the run), comma-separated")
    parser.add_argument("--parts", default="1",
                        help="EPOCH_PARTS values to measure, comma-separated (e.g. 1,2,4): parts per apply")
    parser.add_argument("--workers", type=int, default=0,
                        help="Celery worker processes (solo pool) started for the run to take the parts the "
                             "coordinator sends; 0: the coordinator runs every part itself")
    parser.add_argument("--partitions", type=int, default=8, help="ledger partitions of the loaded seasons")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="write a pyinstrument profile of each cell's last epoch into DIR")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not args.scenarios or any(s not in SCENARIOS for s in args.scenarios):
        parser.error(f"--scenarios takes {', '.join(SCENARIOS)}")
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    args.redis = [t.strip() for t in args.redis.split(",") if t.strip()]
    if not args.redis or any(t not in TARGETS for t in args.redis):
        parser.error(f"--redis takes {', '.join(TARGETS)}")
    try:
        args.parts = [int(p) for p in args.parts.split(",") if p.strip()]
    except ValueError:
        parser.error("--parts takes whole numbers, comma-separated")
    if not args.parts or min(args.parts) < 1 or args.workers < 0:
        parser.error("--parts >= 1 and --workers >= 0")
    sizes = benchenv.parse_counts(args.players)
    changes = benchenv.parse_counts(args.changes)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats >= 1 and --warmup >= 0")
    env = benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    from django.conf import settings

    single_url = settings.REDIS_URL
    settings.SEASON_PARTITIONS = args.partitions
    cells: list[Cell] = []
    workers = benchenv.CeleryWorkers(count=args.workers, env=env)
    if args.workers:
        workers.start()
        print(f"# {args.workers} Celery worker process(es) take the parts: pids {workers.pids()}")
    try:
        cells = run_targets(args, sizes, changes, profile_dir, single_url)
    finally:
        workers.stop()
    report(args, sizes, changes, cells)
    figures_record(args, cells)
    return 0


def run_targets(args: argparse.Namespace, sizes: list[int], changes: list[int], profile_dir: Path | None,
                single_url: str) -> list[Cell]:
    cells: list[Cell] = []
    for target in args.redis:
        started = redis_target_use(target, single_url)
        try:
            for players in sizes:
                cells += run_size(players, changes, args, profile_dir, target)
        finally:
            if started is not None:
                from config.local_cluster import cluster_stop

                cluster_stop(started)
                redis_target_use("single", single_url)
    return cells


def report(args: argparse.Namespace, sizes: list[int], changes: list[int], cells: list[Cell]) -> None:
    print()
    print(f"## epoch publish time ({args.repeats} timed epochs per cell after {args.warmup} warm-up)")
    print()
    rows = []
    for c in cells:
        ingest_rate = c.changes / benchenv.median(c.ingest_s)
        rows.append((c.redis, benchenv.human(c.players), benchenv.human(c.changes), c.mode, c.scenario, c.parts,
                     int(benchenv.median(c.applied)),
                     c.median_ms, benchenv.percentile(c.epoch_ms, 90),
                     benchenv.median(c.catch_up_ms) if MODES[c.mode] else "-",
                     benchenv.median(c.task_ms), benchenv.median(c.cpu_ms), benchenv.median(c.serial_ms),
                     benchenv.median(c.coordinator_cpu_ms), benchenv.median(c.part_cpu_ms),
                     benchenv.median(c.part_ms_per_1k),
                     benchenv.median(c.parts_cpu_ms) * 1000 / c.changes, benchenv.median(c.redis_ms),
                     benchenv.median(c.redis_ms) * 1000 / c.changes, ingest_rate))
    print(benchenv.table(["redis", "players", "changes", "mode", "scenario", "parts", "applied", "publish ms",
                          "p90 ms", "catch-up ms", "task ms", "process cpu ms", "serial ms", "coord cpu ms",
                          "part cpu ms", "part ms/1k", "parts cpu us/change", "redis cpu ms", "redis us/change",
                          "ingest events/s"], rows))
    print()
    print("serial ms: publish ms but the wait for the publication's parts; coord cpu ms: this process's CPU but "
          "the parts it ran itself; part cpu ms: median CPU of one part (publication and catch-up); part ms/1k: a "
          "part's time at work per 1,000 of its changed players, one side; parts cpu us/change: every part of an "
          "epoch (both sides), per changed player")
    for c in cells:
        small = min((b for b in cells if (b.players, b.mode, b.scenario, b.redis, b.parts) ==
                     (c.players, c.mode, c.scenario, c.redis, c.parts)), key=lambda b: b.changes)
        if c.changes > small.changes:
            serial = benchenv.median(c.serial_ms) / benchenv.median(small.serial_ms)
            own = benchenv.median(c.coordinator_cpu_ms) / benchenv.median(small.coordinator_cpu_ms)
            print(f"{benchenv.human(c.players)}, {c.parts} part(s): at {benchenv.human(c.changes)} changes the "
                  f"coordinator's serial time is {serial:.2f}x and its own CPU {own:.2f}x those at "
                  f"{benchenv.human(small.changes)}")
    for c in cells:
        one = next((b for b in cells if (b.players, b.changes, b.mode, b.scenario, b.redis, b.parts) ==
                    (c.players, c.changes, c.mode, c.scenario, c.redis, 1)), None)
        if c.parts > 1 and one is not None:
            print(f"{benchenv.human(c.players)} x {benchenv.human(c.changes)}, {c.parts} parts: publish "
                  f"{c.median_ms / one.median_ms:.2f}x, one part's CPU "
                  f"{benchenv.median(c.part_cpu_ms) / benchenv.median(one.part_cpu_ms):.2f}x, all parts' CPU "
                  f"{benchenv.median(c.parts_cpu_ms) / benchenv.median(one.parts_cpu_ms):.2f}x those of 1 part")
    print()
    smallest = min(sizes)
    for scenario in args.scenarios:
        for mode in args.modes:
            for k in changes:
                base = next((c for c in cells if (c.changes, c.players, c.mode, c.scenario, c.redis, c.parts) ==
                             (k, smallest, mode, scenario, args.redis[0], args.parts[0])), None)
                if base is None or len(sizes) < 2:
                    continue
                ratios = [f"{benchenv.human(c.players)}: {c.median_ms / base.median_ms:.2f}x"
                          for c in cells if (c.changes, c.mode, c.scenario, c.redis, c.parts) ==
                          (k, mode, scenario, args.redis[0], args.parts[0])]
                print(f"{mode}, {scenario}, {benchenv.human(k)} changes, median vs {benchenv.human(smallest)} "
                      f"players: {', '.join(ratios)}")
    for c in cells:
        plain = next((b for b in cells if (b.players, b.changes, b.mode, b.scenario, b.redis, b.parts) ==
                      (c.players, c.changes, c.mode, "plain", c.redis, c.parts)), None)
        if c.scenario != "plain" and plain is not None:
            print(f"{benchenv.human(c.players)} x {benchenv.human(c.changes)}, {c.mode}: {c.scenario} publishes in "
                  f"{c.median_ms / plain.median_ms:.2f}x the time of a season without regions (same run)")
    for c in cells:
        baseline = next((b for b in cells if (b.players, b.changes, b.mode, b.scenario, b.redis, b.parts) ==
                         (c.players, c.changes, "no-catch-up", c.scenario, c.redis, c.parts)), None)
        if c.mode == "catch-up" and baseline is not None:
            print(f"{benchenv.human(c.players)} x {benchenv.human(c.changes)}: publish with catch-up "
                  f"{c.median_ms / baseline.median_ms:.2f}x the no-catch-up baseline of the same run")
    for c in cells:
        single = next((b for b in cells if (b.players, b.changes, b.mode, b.scenario, b.redis, b.parts) ==
                       (c.players, c.changes, c.mode, c.scenario, "single", c.parts)), None)
        if c.redis == "cluster" and single is not None:
            print(f"{benchenv.human(c.players)} x {benchenv.human(c.changes)}, {c.mode}, {c.scenario}: on the "
                  f"{CLUSTER_MASTERS}-master cluster publish {c.median_ms / single.median_ms:.2f}x, task "
                  f"{benchenv.median(c.task_ms) / benchenv.median(single.task_ms):.2f}x, coordinator CPU "
                  f"{benchenv.median(c.cpu_ms) / benchenv.median(single.cpu_ms):.2f}x, Redis CPU (all masters) "
                  f"{benchenv.median(c.redis_ms) / benchenv.median(single.redis_ms):.2f}x the single Redis "
                  f"of the same run")
    target = [c for c in cells if (c.changes, c.players, c.mode, c.scenario, c.redis) ==
              (10_000, 10_000_000, args.modes[0], "plain", args.redis[0])][-1:]
    if target:
        ok = target[0].median_ms < TARGET_MS and benchenv.percentile(target[0].epoch_ms, 90) < TARGET_MS
        print(f"target (10M players, 10k changes, {target[0].mode}, < {TARGET_MS:.0f} ms): median "
              f"{target[0].median_ms:.0f} ms, p90 {benchenv.percentile(target[0].epoch_ms, 90):.0f} ms -> "
              f"{'met' if ok else 'MISSED'}")


def figures_record(args: argparse.Namespace, cells: list[Cell]) -> None:
    """From the biggest cell in the default mode (the most players, then changes, then the
    fewest parts: a part alone on its core): a part's time at work per 1,000 changes on one
    side, every part's CPU per 1,000 changes on both sides, the coordinator's serial time
    per epoch, and the Redis server's CPU per 1,000 changes on both sides."""
    mode = "catch-up" if "catch-up" in args.modes else args.modes[0]
    plain = [c for c in cells if c.mode == mode and c.scenario == "plain" and c.redis == "single"]
    if not plain:
        return
    cell = max(plain, key=lambda c: (c.players, c.changes, -c.parts))
    per_1k = 1000 / cell.changes
    note = (f"{cell.players:,} players x {cell.changes:,} changes per epoch, {mode}, {cell.parts} part(s), "
            f"{args.workers} worker(s), median of {len(cell.epoch_ms)} epochs")
    benchenv.figures_record("epoch_part_ms_per_1k_changes", benchenv.median(cell.part_ms_per_1k), "ms",
                            note=f"{note}; a part's time at work (not waiting out a grace period) per 1,000 of "
                                 "its changed players, one side", path=args.figures)
    benchenv.figures_record("epoch_parts_cpu_ms_per_1k_changes", benchenv.median(cell.parts_cpu_ms) * per_1k,
                            "ms", note=f"{note}; CPU of every part, both sides", path=args.figures)
    benchenv.figures_record("epoch_serial_ms", benchenv.median(cell.serial_ms), "ms",
                            note=f"{note}; the coordinator's time to publish but the wait for the parts, per "
                                 "epoch", path=args.figures)
    benchenv.figures_record("epoch_redis_cpu_ms_per_1k_changes", benchenv.median(cell.redis_ms) * per_1k, "ms",
                            note=f"{note}; Redis server CPU (INFO cpu), both sides", path=args.figures)


if __name__ == "__main__":
    raise SystemExit(main())
