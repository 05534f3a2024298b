"""GET /metrics (leaderboard/metrics/render.py): every metric family, in Prometheus text format as
the reference parser reads it, with values that follow from what happened: the
event-to-publish lag of each published change, epoch durations, version age, bucket
sizes and skew, ingest outcomes and rejections, rebuild progress, reconciliation and
checksum failures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from leaderboard.models import RebuildJob, ScoreChange
from leaderboard.recovery.rebuild import rebuild_run, season_rebuild_start
from leaderboard.recovery.reconcile import reconciliation_run
from leaderboard.redis_client import redis_get
from leaderboard.views import epoch as views_epoch
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import NARROW, TEST_ACTOR, Events, current_manifest, epoch, keys_of, ledger_rows, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]

FAMILIES = {
    # name as the parser reports it (counters lose "_total") -> type
    "leaderboard_event_to_publish_seconds": "histogram",
    "leaderboard_epoch_duration_milliseconds": "histogram",
    "leaderboard_events": "counter",
    "leaderboard_rejected_events": "counter",
    "leaderboard_failures": "counter",
    "leaderboard_version": "gauge",
    "leaderboard_version_age_seconds": "gauge",
    "leaderboard_bucket_players": "gauge",
    "leaderboard_bucket_skew": "gauge",
    "leaderboard_rebuild_progress_ratio": "gauge",
    "leaderboard_reconciliation_runs": "counter",
}


def scrape() -> dict[str, Any]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.content.decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert {name: families[name].type for name in FAMILIES if name in families} == FAMILIES, sorted(families)
    for family in families.values():
        if family.type == "histogram":
            histogram_valid(family)
    return families


def histogram_valid(family: Any) -> None:
    """Per season: cumulative buckets in increasing `le`, the last one +Inf equal to _count."""
    by_season: dict[str, dict[str, list[Any]]] = {}
    for sample in family.samples:
        by_season.setdefault(sample.labels["season"], {}).setdefault(sample.name, []).append(sample)
    for parts in by_season.values():
        buckets = parts[f"{family.name}_bucket"]
        bounds = [float(s.labels["le"]) for s in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
        values = [s.value for s in buckets]
        assert values == sorted(values), values
        [count] = parts[f"{family.name}_count"]
        assert values[-1] == count.value
        [total] = parts[f"{family.name}_sum"]
        assert total.value >= 0


def samples(families: dict[str, Any], name: str, sample_name: str | None = None, **labels: str) -> list[Any]:
    family = families.get(name)
    if family is None:
        return []
    return [s for s in family.samples if (sample_name is None or s.name == sample_name)
            and all(s.labels.get(k) == v for k, v in labels.items())]


def value(families: dict[str, Any], name: str, sample_name: str | None = None, **labels: str) -> float | None:
    found = samples(families, name, sample_name, **labels)
    assert len(found) <= 1, found
    return found[0].value if found else None


def lag_buckets(families: dict[str, Any], slug: str) -> dict[float, float]:
    return {float(s.labels["le"]): s.value for s in samples(
        families, "leaderboard_event_to_publish_seconds", "leaderboard_event_to_publish_seconds_bucket", season=slug)}


def test_metrics_render_every_family_with_values_that_follow_from_events(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season = season_factory(slug="metrics", layout=NARROW)
    slug = season.slug
    ev = Events(tag="met")
    families = scrape()  # every family is declared even before anything happened
    assert value(families, "leaderboard_version", season=slug) is None

    first = [ev.result(f"p{i:02d}", 10 * i) for i in range(20)]
    results = post_ok(post_scores, season, first + [first[0], dict(first[1], best_score=1)])
    assert [r["status"] for r in results[-2:]] == ["duplicate", "conflict"]
    post_ok(post_scores, season, [ev.result("p00", 0), ev.stale("p01", 999),
                                  dict(ev.result("x", 5), completed_at="2099-01-01T00:00:00Z"),
                                  dict(ev.result("y", 5), completed_at="2020-01-01T00:00:00Z")])
    time.sleep(0.3)  # every change waits at least this long for its version
    assert publish(season) == 1
    families = scrape()
    assert value(families, "leaderboard_events", "leaderboard_events_total", season=slug, status="applied") == 20
    for status, count in [("duplicate", 1), ("conflict", 1), ("unchanged", 1), ("stale", 1), ("rejected", 2)]:
        assert value(families, "leaderboard_events", "leaderboard_events_total", season=slug, status=status) == count
    assert value(families, "leaderboard_rejected_events", "leaderboard_rejected_events_total", season=slug,
                 reason="after_cutoff") == 1
    assert value(families, "leaderboard_rejected_events", "leaderboard_rejected_events_total", season=slug,
                 reason="before_season_start") == 1
    # The lag of each published change, counted once.
    assert value(families, "leaderboard_event_to_publish_seconds", "leaderboard_event_to_publish_seconds_count",
                 season=slug) == 20
    buckets = lag_buckets(families, slug)
    assert buckets[0.25] == 0 and buckets[60.0] == 20
    lag_sum = value(families, "leaderboard_event_to_publish_seconds", "leaderboard_event_to_publish_seconds_sum",
                    season=slug)
    assert lag_sum is not None and 20 * 0.3 <= lag_sum < 20 * 60
    assert value(families, "leaderboard_epoch_duration_milliseconds",
                 "leaderboard_epoch_duration_milliseconds_count", season=slug) == 1
    assert value(families, "leaderboard_version", season=slug) == 1
    age = value(families, "leaderboard_version_age_seconds", season=slug)
    assert age is not None and 0 <= age < 60
    manifest = current_manifest(season)
    assert manifest is not None
    sizes = {int(s.labels["bucket"]): s.value for s in samples(families, "leaderboard_bucket_players", season=slug)}
    assert sizes == {b: c for b, c in enumerate(manifest.counts) if c}
    filled = [c for c in manifest.counts if c]
    assert value(families, "leaderboard_bucket_skew", season=slug) == pytest.approx(
        max(filled) / (sum(filled) / len(filled)), abs=1e-3)

    # An idle epoch observes nothing; the next version adds only its own changes.
    assert epoch(season).status == "idle"
    post_ok(post_scores, season, [ev.result("p05", 905), ev.result("p06", 906), ev.result("new", 1)])
    assert publish(season) == 2
    families = scrape()
    assert value(families, "leaderboard_event_to_publish_seconds", "leaderboard_event_to_publish_seconds_count",
                 season=slug) == 23 == len(ledger_rows(ScoreChange, season, "id"))
    assert value(families, "leaderboard_epoch_duration_milliseconds",
                 "leaderboard_epoch_duration_milliseconds_count", season=slug) == 2
    assert value(families, "leaderboard_version", season=slug) == 2


def test_rebuild_progress_and_failure_counters(season_factory: Callable[..., Season], post_scores: Post,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="metrics-rb", layout=NARROW)
    slug = season.slug
    ev = Events(tag="metrb")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", 10 * i) for i in range(30)])
    publish(season)
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    families = scrape()
    labels = {"season": slug, "job": str(job.pk), "kind": "rebuild"}
    assert value(families, "leaderboard_rebuild_progress_ratio", **labels) == 0.0
    ratios: list[float | None] = []

    def on_progress(update: RebuildJob) -> None:
        ratios.append(value(scrape(), "leaderboard_rebuild_progress_ratio", **labels))

    assert rebuild_run(job_id=job.pk, on_progress=on_progress).status == "published"
    # The scrape shows the persisted progress, up to the whole build; nothing once finished.
    assert ratios[0] == 0.0 and ratios[-1] == 1.0 and ratios == sorted(ratios), ratios  # type: ignore[type-var]
    assert value(scrape(), "leaderboard_rebuild_progress_ratio", **labels) is None

    # A corrupted copy fails the reconciliation (and its checksums): both are counted.
    r = redis_get()
    manifest = current_manifest(season)
    assert manifest is not None
    r.zadd(rankview.Keys(keys_of(season).prefix, slug).bucket(manifest.copy, manifest.layout.layout_id, 0,
                                                              groups=manifest.groups),
           {"stray": -5})
    assert reconciliation_run(season=season, full=True, sample=100).ok is False
    families = scrape()
    assert value(families, "leaderboard_failures", "leaderboard_failures_total", season=slug,
                 kind="reconciliation") == 1
    assert value(families, "leaderboard_failures", "leaderboard_failures_total", season=slug, kind="checksum") == 1
    assert value(families, "leaderboard_reconciliation_runs", "leaderboard_reconciliation_runs_total", season=slug,
                 ok="false") == 1


def test_metrics_are_best_effort_for_the_epoch(season_factory: Callable[..., Season], post_scores: Post,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="metrics-down", layout=NARROW)
    ev = Events(tag="metdown")
    post_ok(post_scores, season, [ev.result("a", 1)])

    def down(**kwargs: Any) -> None:
        raise redis.ConnectionError("metrics Redis is down")

    monkeypatch.setattr(views_epoch, "metrics_epoch_observe", down)
    assert publish(season) == 1  # published all the same
    assert rankview.pointer_get(redis_get(), keys_of(season)) == 1
    monkeypatch.undo()
    assert value(scrape(), "leaderboard_epoch_duration_milliseconds", "leaderboard_epoch_duration_milliseconds_count",
                 season=season.slug) is None
