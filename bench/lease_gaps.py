#!/usr/bin/env python
"""The season's lease during a build under it: how late its renewals come, and why.

Loads a season (bench/loader.py: COPY, both copies, version 1 published), then for each
run drops the copy that is not current, writes one score and runs the epoch that builds
that copy from the scores under the season's lease (`season_epoch_advance`), as the
first epoch with changes after a recovery does. Meanwhile it records:

- every lease renewal (`fence.lease_renew`, from the keeper thread or the build's own
  thread): when it was sent, answered, and whether it still held the lease; the largest
  gap between two renewals that held it, against the lease (`--lease-seconds`);
- the build's steps in its own thread (each batch's fetch and sort, its encoding, the
  checks at the end), to name the step running during the largest gap;
- a probe thread that asks for the interpreter every 5 ms: how late it got it is how
  long another thread held it (one C call: a fetch converting its rows, a sort), and
  the build thread's frame when it got it says where;
- the cyclic collector's collections (gc.callbacks) and Redis's SLOWLOG (commands over
  50 ms).

Each run alternates the build as it is with the build as it was before the lease's fix
(`--modes baseline,current`; the baseline patched in by this script: the short lease
throughout, each batch fetched and sorted whole, the collector off only while a batch
is encoded), so both meet the same load.

    SECRET_KEY=x .venv/bin/python bench/lease_gaps.py --players 2M --batch 1M --runs 6 --keep \\
        --database-url postgres://postgres@127.0.0.1:5432/leasebench --redis-url redis://127.0.0.1:6394/0 \\
        --redis-db 0      # then --reuse SLUG to measure the same season again

`--batch 1M` is about the batch a build of 50M players reads (BUILD_BATCH_MAX): a smaller
season then holds the interpreter per batch as long as a 50M one does. The outcome of
each run: published, or FenceLost (the lease was lost).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402
import psycopg  # noqa: E402

KIND = "lease"


@dataclass
class Trace:
    """What one run recorded, in time.monotonic() seconds."""

    renewals: list[tuple[float, float, bool, str]] = field(default_factory=list)  # sent, answered, held, thread
    steps: list[tuple[str, float, float]] = field(default_factory=list)  # label, start, end (build thread)
    late: list[tuple[float, float, str]] = field(default_factory=list)  # woke, late by, build thread's place
    collections: list[tuple[int, float, float]] = field(default_factory=list)  # generation, start, end
    lock: threading.Lock = field(default_factory=threading.Lock)


def _patch(owner: Any, name: str, wrap: Callable[[Any], Any], undo: list[tuple[Any, str, Any]]) -> None:
    real = getattr(owner, name)
    undo.append((owner, name, real))
    setattr(owner, name, wrap(real))


def _constant(value: Any) -> Callable[[Any], Any]:
    return lambda real: value


def instrument(trace: Trace, *, baseline: bool) -> list[tuple[Any, str, Any]]:
    from leaderboard.core.gc_pause import gc_paused
    from leaderboard.views import build, rankview
    from leaderboard.views.rankview import fence

    undo: list[tuple[Any, str, Any]] = []
    if baseline:
        # The build as it was: the short lease throughout, each batch fetched and sorted
        # whole, the collector off only while a batch is encoded (back on while it is alive).
        for name, value in (("BUILD_LEASE_SECONDS", 0.0), ("BUILD_FETCH_PIECE", 1 << 40),
                            ("gc_paused", contextlib.nullcontext)):
            _patch(build, name, _constant(value), undo)

        def paused(real: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with gc_paused():
                    return real(*args, **kwargs)
            return wrapper

        _patch(build, "_build_writes", paused, undo)
        _patch(rankview, "nodes_pack", paused, undo)

    def renew(real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sent = time.monotonic()
            held = real(*args, **kwargs)
            with trace.lock:
                trace.renewals.append((sent, time.monotonic(), bool(held), threading.current_thread().name))
            return held
        return wrapper

    def step(label: str) -> Callable[[Any], Any]:
        def wrap(real: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                started = time.monotonic()
                try:
                    return real(*args, **kwargs)
                finally:
                    trace.steps.append((label, started, time.monotonic()))
            return wrapper
        return wrap

    def batches(real: Any) -> Any:
        def wrapper(**kwargs: Any) -> Iterator[Any]:
            it = real(**kwargs)
            while True:
                started = time.monotonic()
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    trace.steps.append(("fetch+sort a batch of scores", started, time.monotonic()))
                yield item
        return wrapper

    _patch(fence, "lease_renew", renew, undo)
    _patch(psycopg.ServerCursor, "fetchmany", step("fetchmany (psycopg converts the rows)"), undo)
    _patch(build, "_score_batches", batches, undo)
    _patch(build, "_build_writes", step("encode a batch (_build_writes)"), undo)
    _patch(rankview, "nodes_pack", step("pack a batch (nodes_pack)"), undo)
    _patch(rankview, "copy_verify_counts", step("verify counts + shard sizes"), undo)
    _patch(rankview, "copy_drop", step("drop the old copy"), undo)
    _patch(rankview, "copy_apply", step("apply the changes"), undo)
    _patch(rankview, "copy_finish", step("finish the copy"), undo)
    return undo


def probe(trace: Trace, stop: threading.Event, build_thread: threading.Thread, every: float = 0.005) -> None:
    """Ask for the interpreter every `every` s; note each time it came more than 50 ms late."""
    while not stop.is_set():
        asked = time.monotonic()
        time.sleep(every)
        woke = time.monotonic()
        late = woke - asked - every
        if late > 0.05:
            frame = sys._current_frames().get(build_thread.ident or 0)
            where: list[str] = []
            while frame is not None and len(where) < 3:
                where.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            trace.late.append((woke, late, " < ".join(where)))


def copy_drop_idle(season: Any) -> str:
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.epoch import season_lease_acquire
    from leaderboard.views.season_index import season_keys

    r = redis_get()
    keys = season_keys(season)
    token = season_lease_acquire(season=season, r=r, ttl_ms=600_000)
    if token is None:
        raise SystemExit("the season's lease is held")
    try:
        current = rankview.manifest_get(r, keys, rankview.pointer_get(r, keys))  # type: ignore[arg-type]
        assert current is not None
        idle = next(c for c in rankview.copies_get(r, keys) if c != current.copy)
        meta = rankview.copy_meta_load(r, keys, idle)
        if meta is not None:
            rankview.copy_drop(r, keys, meta, token=token)
        return idle
    finally:
        rankview.lease_release(r, keys, token)


def run_once(season: Any, run: int, lease_seconds: float, *, baseline: bool) -> dict[str, Any]:
    from datetime import UTC, datetime

    from django.conf import settings
    from django.db import connection

    from leaderboard.core.events import KIND_RESULT, ScoreEvent
    from leaderboard.ingest.services import score_events_apply
    from leaderboard.recovery.rebuild import season_epoch_advance
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys

    r = redis_get()
    idle = copy_drop_idle(season)
    player = f"lease-gaps-{run}-{time.time_ns()}"
    score_events_apply(season=season, client=None, events=[ScoreEvent(
        event_id=player, match_id=player, player_id=player, best_score=1, score_version=1,
        completed_at=datetime.now(UTC), kind=KIND_RESULT, reason="")])
    connection.close()
    r.execute_command("CONFIG", "SET", "slowlog-log-slower-than", "50000")
    r.execute_command("SLOWLOG", "RESET")
    settings.EPOCH_LEASE_SECONDS = lease_seconds
    trace = Trace()
    undo = instrument(trace, baseline=baseline)
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(trace, stop, threading.current_thread()), daemon=True)
    prober.start()
    gc_started: list[float] = []

    def gc_watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started.append(time.monotonic())
        elif gc_started:
            trace.collections.append((info["generation"], gc_started.pop(), time.monotonic()))

    gc.callbacks.append(gc_watch)
    started = time.monotonic()
    outcome, error = "published", ""
    try:
        result = season_epoch_advance(season=season, r=r)
        if result.status != "published":
            outcome = result.status
    except rankview.FenceLost as exc:
        outcome, error = "FenceLost", str(exc)
    finally:
        ended = time.monotonic()
        stop.set()
        prober.join()
        gc.callbacks.remove(gc_watch)
        for owner, name, real in reversed(undo):
            setattr(owner, name, real)
    slow = r.execute_command("SLOWLOG", "GET", 20)
    meta = rankview.copy_meta_load(r, season_keys(season), idle)
    return summarize(trace, started, ended, lease_seconds, outcome, error, slow,
                     meta.state if meta is not None else "none")


def summarize(trace: Trace, started: float, ended: float, lease_seconds: float, outcome: str, error: str,
              slow: list[Any], state: str) -> dict[str, Any]:
    held = sorted(answered for _, answered, ok, _ in trace.renewals if ok)
    marks = [started, *held]
    gaps = [(b - a, a, b) for a, b in zip(marks, marks[1:], strict=False)]
    if trace.renewals and not trace.renewals[-1][2]:
        lost_at = trace.renewals[-1][1]
        gaps.append((lost_at - marks[-1], marks[-1], lost_at))
    worst = max(gaps, default=(0.0, started, started))
    during = sorted({label for label, a, b in trace.steps if a < worst[2] and b > worst[1]})
    during += [f"gc gen{g} {b - a:.2f}s" for g, a, b in trace.collections
               if a < worst[2] and b > worst[1] and b - a > 0.05]
    gen2 = [b - a for g, a, b in trace.collections if g == 2]
    longest: dict[str, float] = {}
    for label, a, b in trace.steps:
        longest[label] = max(longest.get(label, 0.0), b - a)
    return {
        "outcome": outcome, "error": error, "copy_state": state, "seconds": ended - started,
        "renewals": len(trace.renewals), "renewal_threads": sorted({t for *_, t in trace.renewals}),
        "lost": any(not ok for _, _, ok, _ in trace.renewals),
        "max_gap_s": worst[0], "max_gap_at_s": worst[1] - started, "lease_s": lease_seconds,
        "steps_during_max_gap": during,
        "slowest_renewal_reply_s": max((b - a for a, b, _, _ in trace.renewals), default=0.0),
        "longest_step_s": dict(sorted(longest.items(), key=lambda kv: -kv[1])),
        "probe_late": sorted(trace.late, key=lambda x: -x[1])[:5],
        "gc_gen2": f"{len(gen2)} collections, longest {max(gen2, default=0.0):.2f}s, total {sum(gen2):.2f}s",
        "probe_late_max_s": max((late for _, late, _ in trace.late), default=0.0),
        "redis_slowlog": [(int(entry[2]) / 1e6, " ".join(str(a)[:40] for a in entry[3][:2])) for entry in slow][:5],
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="2M")
    parser.add_argument("--batch", default="1M", help="rows a build batch reads (BUILD_BATCH and BUILD_BATCH_MAX)")
    parser.add_argument("--lease-seconds", type=float, default=2.0, help="EPOCH_LEASE_SECONDS for the runs")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode")
    parser.add_argument("--modes", default="baseline,current",
                        help="baseline: the build as before the fix (bench-side patches); current: the code as it is")
    parser.add_argument("--reuse", default="", help="a season this script loaded before (with --keep)")
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (players,) = benchenv.parse_counts(args.players)
    (batch,) = benchenv.parse_counts(args.batch)
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from leaderboard.views import build
    from seasons.models import Season

    if args.reuse:
        season = Season.objects.get(slug=args.reuse)
    else:
        season = loader.load_season(players=players, seed=args.seed, kind=KIND).season
    print(f"# season {season.slug}; build batches of {batch:,} rows; lease {args.lease_seconds} s", flush=True)
    build.BUILD_BATCH = build.BUILD_BATCH_MAX = batch
    try:
        modes = args.modes.split(",")
        outcomes: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for run, mode in ((run, mode) for run in range(1, args.runs + 1) for mode in modes):
            out = run_once(season, run, args.lease_seconds, baseline=mode == "baseline")
            outcomes[mode].append(out)
            print(f"# {mode} run {run}: {out['outcome']} in {out['seconds']:.1f}s, load {out['load']:.1f}; "
                  f"max gap between held renewals {out['max_gap_s']:.2f}s (lease {out['lease_s']}s) "
                  f"at +{out['max_gap_at_s']:.1f}s during {out['steps_during_max_gap']}", flush=True)
            for key in ("error", "copy_state", "renewals", "renewal_threads", "slowest_renewal_reply_s",
                        "longest_step_s", "gc_gen2", "probe_late_max_s", "probe_late", "redis_slowlog"):
                print(f"#   {key}: {out[key]}", flush=True)
        print()
        print(benchenv.table(
            ["mode", "runs", "lease lost", "max gap between held renewals s (median, max)",
             "longest interpreter hold s (median, max)", "build s (median)", "load"],
            [(mode, len(outs), sum(o["lost"] or o["outcome"] == "FenceLost" for o in outs),
              f"{benchenv.median([o['max_gap_s'] for o in outs]):.2f}, {max(o['max_gap_s'] for o in outs):.2f}",
              f"{benchenv.median([o['probe_late_max_s'] for o in outs]):.2f}, "
              f"{max(o['probe_late_max_s'] for o in outs):.2f}",
              f"{benchenv.median([o['seconds'] for o in outs]):.1f}",
              " ".join(f"{o['load']:.1f}" for o in outs)) for mode, outs in outcomes.items()]))
    finally:
        if not args.reuse:
            benchenv.season_cleanup(season, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
