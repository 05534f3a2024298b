"""The metrics' counters in Redis, shared by every process: what writers increment.

Web workers, Celery workers and beat are separate processes, so in-process counters
would each see a slice. Writers increment small Redis hashes (one pipelined round trip
per batch or epoch, after commit); render.py and samples.py read them. Redis only: no
import of the views, so the write path's listener pulls nothing else in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
from django.conf import settings

from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS

log = logging.getLogger(__name__)

LAG_BOUNDS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
EPOCH_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


def metrics_key(name: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:{name}"


def metrics_outcomes_count(
    *, season_slug: str, statuses: Iterable[tuple[str, str]], r: redis.Redis | None = None
) -> None:
    """Count ingest outcomes: (status, reason) pairs of one batch."""
    by_status: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for status, reason in statuses:
        by_status[status] = by_status.get(status, 0) + 1
        if status == "rejected":
            by_reason[reason] = by_reason.get(reason, 0) + 1
    r = r or redis_get()
    with r.pipeline(transaction=False) as pipe:
        for status, n in by_status.items():
            pipe.hincrby(metrics_key("events"), f"{season_slug}|{status}", n)
        for reason, n in by_reason.items():
            pipe.hincrby(metrics_key("rejected"), f"{season_slug}|{reason}", n)
        pipe.execute()


def _observe(pipe: redis.client.Pipeline, name: str, season_slug: str, bounds: tuple[float, ...], value: float,
             weight: int = 1) -> None:
    bound = next((b for b in bounds if value <= b), None)
    field = f"{season_slug}|{'+Inf' if bound is None else bound}"
    pipe.hincrby(metrics_key(name), field, weight)
    pipe.hincrbyfloat(metrics_key(name), f"{season_slug}|sum", value * weight)
    pipe.hincrby(metrics_key(name), f"{season_slug}|count", weight)


def metrics_epoch_observe(
    *, season_slug: str, duration_ms: float, lags: Iterable[tuple[float, int]], r: redis.Redis | None = None
) -> None:
    """An epoch's duration, and the event-to-publish lag of each batch it published (seconds, events)."""
    r = r or redis_get()
    with r.pipeline(transaction=False) as pipe:
        _observe(pipe, "epoch_ms", season_slug, EPOCH_BOUNDS_MS, duration_ms)
        for lag, weight in lags:
            _observe(pipe, "lag", season_slug, LAG_BOUNDS, max(lag, 0.0), weight)
        pipe.execute()


def metrics_failure_count(*, season_slug: str, kind: str, r: redis.Redis | None = None) -> None:
    """kind: epoch_verification | checksum | reconciliation."""
    (r or redis_get()).hincrby(metrics_key("failures"), f"{season_slug}|{kind}", 1)


def batch_committed_count(*, season_slug: str, outcomes: list[tuple[str, str]], **_: object) -> None:
    """Receiver of ingest.signals.batch_committed (connected in LeaderboardConfig.ready): count
    the batch's outcomes. Metrics are best effort: the batch is committed, Redis trouble must
    not turn it into an error (it is logged)."""
    try:
        metrics_outcomes_count(season_slug=season_slug, statuses=outcomes)
    except REDIS_ERRORS:
        log.warning("could not count ingest outcomes for %s", season_slug, exc_info=True)
