"""Prometheus metrics (text exposition at /metrics), shared by every process through Redis.

Web workers, Celery workers and beat are separate processes, so in-process counters
would each see a slice. Writers increment small Redis hashes (one pipelined round trip
per batch or epoch, after commit); the scrape renders them together with gauges read
from the current manifests and the database.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count

from leaderboard import rankview
from leaderboard.redis_client import redis_get

LAG_BOUNDS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
EPOCH_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


def _key(name: str) -> str:
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
            pipe.hincrby(_key("events"), f"{season_slug}|{status}", n)
        for reason, n in by_reason.items():
            pipe.hincrby(_key("rejected"), f"{season_slug}|{reason}", n)
        pipe.execute()


def _observe(pipe: redis.client.Pipeline, name: str, season_slug: str, bounds: tuple[float, ...], value: float,
             weight: int = 1) -> None:
    bound = next((b for b in bounds if value <= b), None)
    field = f"{season_slug}|{'+Inf' if bound is None else bound}"
    pipe.hincrby(_key(name), field, weight)
    pipe.hincrbyfloat(_key(name), f"{season_slug}|sum", value * weight)
    pipe.hincrby(_key(name), f"{season_slug}|count", weight)


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
    (r or redis_get()).hincrby(_key("failures"), f"{season_slug}|{kind}", 1)


def _histogram_lines(name: str, help_text: str, raw: dict[Any, Any], bounds: tuple[float, ...]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    seasons: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        season, _, part = field.decode().partition("|")
        seasons.setdefault(season, {})[part] = float(value)
    for season, parts in sorted(seasons.items()):
        running = 0.0
        for bound in bounds:
            running += parts.get(str(bound), 0.0)
            lines.append(f'{name}_bucket{{season="{season}",le="{bound}"}} {running:g}')
        running += parts.get("+Inf", 0.0)
        lines.append(f'{name}_bucket{{season="{season}",le="+Inf"}} {running:g}')
        lines.append(f'{name}_sum{{season="{season}"}} {parts.get("sum", 0.0):g}')
        lines.append(f'{name}_count{{season="{season}"}} {parts.get("count", 0.0):g}')
    return lines


def _counter_lines(name: str, help_text: str, raw: dict[Any, Any], label: str) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    for field, value in sorted(raw.items()):
        season, _, part = field.decode().partition("|")
        lines.append(f'{name}{{season="{season}",{label}="{part}"}} {int(value)}')
    return lines


def metrics_render() -> str:
    from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob, ReconciliationRun
    from seasons.models import Season

    r = redis_get()
    lines: list[str] = []
    lines += _histogram_lines("leaderboard_event_to_publish_seconds",
                              "Time from a change's commit to the first published version holding it.",
                              r.hgetall(_key("lag")), LAG_BOUNDS)
    lines += _histogram_lines("leaderboard_epoch_duration_milliseconds", "Duration of epochs that published.",
                              r.hgetall(_key("epoch_ms")), EPOCH_BOUNDS_MS)  # the bounds _observe counted by
    lines += _counter_lines("leaderboard_events_total", "Ingested events by outcome.", r.hgetall(_key("events")),
                            "status")
    lines += _counter_lines("leaderboard_rejected_events_total", "Rejected events by reason.",
                            r.hgetall(_key("rejected")), "reason")
    lines += _counter_lines("leaderboard_failures_total",
                            "Epoch verification, checksum and reconciliation failures.",
                            r.hgetall(_key("failures")), "kind")

    now = time.time()
    age = ["# HELP leaderboard_version_age_seconds Age of the current published version.",
           "# TYPE leaderboard_version_age_seconds gauge"]
    current = ["# HELP leaderboard_version Current published version.", "# TYPE leaderboard_version gauge"]
    sizes = ["# HELP leaderboard_bucket_players Players per score bucket in the current version.",
             "# TYPE leaderboard_bucket_players gauge"]
    skew = ["# HELP leaderboard_bucket_skew Largest bucket over the mean non-empty bucket.",
            "# TYPE leaderboard_bucket_skew gauge"]
    for slug in Season.objects.values_list("slug", flat=True):
        keys = rankview.Keys(settings.REDIS_KEY_PREFIX, slug)
        version = rankview.pointer_get(r, keys)
        manifest = rankview.manifest_get(r, keys, version) if version else None
        if manifest is None:
            continue
        current.append(f'leaderboard_version{{season="{slug}"}} {manifest.version}')
        age.append(f'leaderboard_version_age_seconds{{season="{slug}"}} '
                   f'{now - datetime.fromisoformat(manifest.as_of).timestamp():.3f}')
        for bucket, count in enumerate(manifest.counts):
            if count:
                sizes.append(f'leaderboard_bucket_players{{season="{slug}",bucket="{bucket}"}} {count}')
        filled = [c for c in manifest.counts if c]
        if filled:
            skew.append(f'leaderboard_bucket_skew{{season="{slug}"}} {max(filled) / (sum(filled) / len(filled)):.3f}')
    lines += current + age + sizes + skew

    lines += ["# HELP leaderboard_rebuild_progress_ratio Progress of shadow builds in flight (0..1).",
              "# TYPE leaderboard_rebuild_progress_ratio gauge"]
    for job in RebuildJob.objects.filter(status__in=ACTIVE_REBUILD_STATUSES).select_related("season"):
        lines.append(f'leaderboard_rebuild_progress_ratio{{season="{job.season.slug}",job="{job.pk}",'
                     f'kind="{job.kind}"}} {job.percent / 100:.4f}')
    lines += ["# HELP leaderboard_reconciliation_runs_total Reconciliation runs by result.",
              "# TYPE leaderboard_reconciliation_runs_total counter"]
    for row in ReconciliationRun.objects.values("season__slug", "ok").annotate(n=Count("id")).order_by():
        lines.append(f'leaderboard_reconciliation_runs_total{{season="{row["season__slug"]}",'
                     f'ok="{str(row["ok"]).lower()}"}} {row["n"]}')
    return "\n".join(lines) + "\n"
