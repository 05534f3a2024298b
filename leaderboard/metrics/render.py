"""The /metrics scrape: Prometheus text exposition of the counters in Redis (counters.py),
together with gauges read from the current manifests (the rank views) and the database.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db.models import Count

from leaderboard.metrics.counters import EPOCH_BOUNDS_MS, LAG_BOUNDS, metrics_key
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.season_index import season_keys


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
                              r.hgetall(metrics_key("lag")), LAG_BOUNDS)
    lines += _histogram_lines("leaderboard_epoch_duration_milliseconds", "Duration of epochs that published.",
                              r.hgetall(metrics_key("epoch_ms")), EPOCH_BOUNDS_MS)  # the bounds _observe counted by
    lines += _counter_lines("leaderboard_events_total", "Ingested events by outcome.", r.hgetall(metrics_key("events")),
                            "status")
    lines += _counter_lines("leaderboard_rejected_events_total", "Rejected events by reason.",
                            r.hgetall(metrics_key("rejected")), "reason")
    lines += _counter_lines("leaderboard_failures_total",
                            "Epoch verification, checksum and reconciliation failures.",
                            r.hgetall(metrics_key("failures")), "kind")

    now = time.time()
    age = ["# HELP leaderboard_version_age_seconds Age of the current published version.",
           "# TYPE leaderboard_version_age_seconds gauge"]
    current = ["# HELP leaderboard_version Current published version.", "# TYPE leaderboard_version gauge"]
    sizes = ["# HELP leaderboard_bucket_players Players per score bucket in the current version.",
             "# TYPE leaderboard_bucket_players gauge"]
    skew = ["# HELP leaderboard_bucket_skew Largest bucket over the mean non-empty bucket.",
            "# TYPE leaderboard_bucket_skew gauge"]
    for slug in Season.objects.values_list("slug", flat=True):
        keys = season_keys(slug)
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
