"""Helpers of the failure-matrix, rebuild, reconciliation and metrics tests: bulk writes
through the real write service, exact comparison of the published version with the
ledger, and a materializer in a child process that can be killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import connection

from leaderboard import rankview
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.events import events_parse
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Standings
from leaderboard.invariants import version_check
from leaderboard.models import PlayerScore, RebuildJob
from leaderboard.redis_client import redis_get
from leaderboard.services import score_events_apply
from seasons.models import Season
from tests.readside import (
    assert_board_equals,
    change_head,
    epoch,
    keys_of,
    reader_of,
)

ROOT = Path(__file__).resolve().parent.parent
# Eleven buckets: ten of 100 points for the scores these tests use, then the rest.
NARROW = BucketLayout(layout_id=1, lower_bounds=tuple(range(0, 1001, 100)))

INVARIANT_CHECKS = {"bucket_counts", "total_players", "players_once", "bucket_ranges", "bucket_checksums",
                    "lookup_equals_index", "sampled_ranks"}


def ledger_standings(season: Season) -> Standings:
    """The reference board: CONTRACT.md 1 applied to the current-scores table."""
    return Standings(dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score")))


def current(season: Season) -> Manifest | None:
    r = redis_get()
    keys = keys_of(season)
    version = rankview.pointer_get(r, keys)
    return rankview.manifest_get(r, keys, version) if version else None


def full_check(season: Season, version: int | None = None) -> None:
    """The invariant checker with a full scan (every player once, checksums, lookup = index);
    the sampled brute-force ranks on top of it (assert_matches_ledger checks every rank)."""
    report = version_check(r=redis_get(), keys=keys_of(season), version=version, full=True, sample=300)
    assert report.ok, report.failures()
    assert {f.check for f in report.findings} >= INVARIANT_CHECKS


def assert_matches_ledger(season: Season, **kwargs: Any) -> int:
    """The current version holds every committed change and answers every read exactly
    as the ledger's standings do: top, total, each player's rank and neighbours, every
    window; then the full invariant check. Returns the version."""
    manifest = current(season)
    assert manifest is not None, "nothing published"
    head = change_head(season)
    assert head is None or head <= manifest.watermark, "the version does not cover every committed change"
    version = assert_board_equals(reader_of(season), ledger_standings(season), **kwargs)
    full_check(season, version)
    return version


def assert_board_matches_ledger(season: Season) -> int:
    """The cheaper form for big boards: the whole board and the top against the ledger's
    standings, and the full invariant check."""
    from tests.readside import board_read

    manifest = current(season)
    assert manifest is not None, "nothing published"
    head = change_head(season)
    assert head is None or head <= manifest.watermark, "the version does not cover every committed change"
    expected = ledger_standings(season)
    reader = reader_of(season)
    version, board = board_read(reader, manifest.version)
    assert board == expected.window(from_position=1, limit=len(expected) + 1)
    assert reader.top(100, version)[1] == [e.as_dict() for e in expected.top(100)]
    full_check(season, version)
    return version


def publish(season: Season) -> int:
    result = epoch(season)
    assert result.status == "published", result
    assert result.version is not None
    return result.version


def apply_events(season: Season, events: list[dict[str, Any]], *, batch: int = 1000) -> list[Any]:
    """Events through the write service itself (no HTTP): for bulk set-up."""
    outcomes = []
    for start in range(0, len(events), batch):
        parsed = events_parse({"events": events[start : start + batch]})
        outcomes.extend(score_events_apply(season=season, events=parsed, client=None).outcomes)
    return outcomes


def recovery_jobs(season: Season) -> list[RebuildJob]:
    return list(RebuildJob.objects.filter(season=season, kind=RebuildJob.Kind.RECOVERY).order_by("id"))


def board_snapshot(season: Season) -> tuple[int, list[Any], dict[str, Any]]:
    """(version, whole board, each player's rank entry) through the API's reader."""
    from tests.readside import board_read

    reader = rankview.RankReader(redis_get(), keys_of(season), deadline=3600)
    version, board = board_read(reader)
    ranks = {e.player_id: reader.rank(e.player_id, version).entry for e in board}
    return version, board, ranks


# ------------------------------------------------------------------ child processes


def child_database_url() -> str:
    """A URL of the test database this process uses, for a child process."""
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    parts = urlsplit(str(settings.DATABASE_URL))
    return str(urlunsplit(parts._replace(path=f"/{name}")))


def child_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": child_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "VAR_DIR": str(settings.VAR_DIR),
        "SECRET_KEY": settings.SECRET_KEY,
        "DEBUG": "false",
        "DB_POOL_SIZE": "0",
        "PYTHONPATH": str(ROOT),
    }
    env.update(extra)
    return env


# One epoch in a child process, as a Celery worker would run it. The epoch's internals are
# not touched: only the apply chunk is made small, so a big epoch takes long enough to be
# killed in the middle of it.
EPOCH_CHILD = """
import sys
import django

django.setup()
from leaderboard import rankview
from leaderboard.materializer import season_epoch_run
from seasons.models import Season

rankview.APPLY_CHUNK = int(sys.argv[2])
season = Season.objects.get(slug=sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
result = season_epoch_run(season=season)
print(result.status, result.version, flush=True)
"""


def epoch_child(season: Season, *, apply_chunk: int, **env: str) -> subprocess.Popen[str]:
    """A child process that runs one epoch of `season` once a line arrives on its stdin."""
    child = subprocess.Popen(
        [sys.executable, "-c", EPOCH_CHILD, season.slug, str(apply_chunk)],
        cwd=ROOT, env=child_env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        raise AssertionError(f"epoch child did not start: {line!r} {child.stderr.read() if child.stderr else ''}")
    return child


def epoch_child_killed_inside_apply(season: Season, copy: str, rnd: Any, **env: str) -> bool:
    """Run one epoch in a child applying two players per MULTI/EXEC (a few hundred chunks,
    each a moment to die in) and SIGKILL it once `copy` is being applied to. True when
    the kill landed there: the child died and left the copy half applied (False: the
    child finished first)."""
    r = redis_get()
    meta_key = keys_of(season).copy_meta(copy)
    counts_before = r.hget(meta_key, "counts")
    child = epoch_child(season, apply_chunk=2, EPOCH_LEASE_SECONDS="2", COPY_GRACE_SECONDS="0.02",
                        READ_DEADLINE_SECONDS="0.01", **env)
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        state, counts = r.hmget(meta_key, ["state", "counts"])
        if state == b"applying" and counts != counts_before:
            time.sleep(rnd.uniform(0, 0.01))  # somewhere inside the apply
            os.kill(child.pid, signal.SIGKILL)
            break
    child.wait(timeout=30)
    state, counts = r.hmget(meta_key, ["state", "counts"])
    return child.returncode == -signal.SIGKILL and state == b"applying" and counts != counts_before


def players(prefix: str, n: int) -> Iterable[str]:
    return (f"{prefix}{i:05d}" for i in range(n))
