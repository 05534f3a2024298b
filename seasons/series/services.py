"""Recurring seasons (docs/rules.md, Recurring seasons): creating a series, and the clock's
part, opening every window a series owes. Each window is a season of its own, created
with the series' options; the lifecycle tick moves it through its states like any other
(seasons.services.seasons_lifecycle_tick), seals it `grace` after its cutoff and builds
its FINAL candidate, approved by the system in a series with `approval` auto."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import SYSTEM, Actor, audit_log
from leaderboard.core.buckets import MAX_SCORE, BucketLayout, LayoutError
from leaderboard.core.events import EventValidationError, ScoreEvent
from leaderboard.core.ledger import Outcome
from leaderboard.core.season_options import (
    MODE_BEST,
    ORDER_DESC,
    TIE_BREAK_SHARED,
    mode_problem,
    order_problem,
    regions_problem,
)
from leaderboard.core.series import (
    APPROVAL_TWO_PERSON,
    approval_problem,
    every_problem,
    series_id_problem,
    window_bounds,
    window_of,
    windows_due,
)
from leaderboard.core.tiers import TiersError, tiers_parse
from leaderboard.ingest.services import score_events_apply
from leaderboard.models import ApiClient
from seasons.models import Season, Series
from seasons.services import SeasonError, season_create

log = logging.getLogger(__name__)


def series_create(*, slug: str, name: str, every: str, anchor: datetime, actor: Actor, grace_seconds: int = 600,
                  approval: str = APPROVAL_TWO_PERSON, mode: str = MODE_BEST, order: str = ORDER_DESC,
                  tie_break: str = TIE_BREAK_SHARED,
                  regions: Sequence[str] = (), bucket_width: int | None = None, max_score: int = MAX_SCORE,
                  tiers: str = "", now: datetime | None = None) -> Series:
    """A new series (audited `series.created`), and the windows it owes by `now`: a series
    anchored in the past opens its windows since, late, none skipped. Every window's
    scores are in 0..`max_score`, in buckets of `bucket_width` (default: the range's), and
    its entries named by `tiers` (core.tiers, refused with the reason when malformed)."""
    try:
        parsed_tiers = tiers_parse(tiers)
    except TiersError as exc:
        raise SeasonError(f"--tiers: {exc}") from exc
    problem = (series_id_problem(slug) or every_problem(every) or approval_problem(approval) or mode_problem(mode)
               or order_problem(order) or regions_problem(regions))
    if problem:
        raise SeasonError(problem)
    if grace_seconds < 0:
        raise SeasonError(f"the grace must not be negative, got {grace_seconds} s")
    try:
        layout = BucketLayout.uniform(width=bucket_width, max_score=max_score)
    except LayoutError as exc:
        raise SeasonError(str(exc)) from exc
    bucket_width = layout.range_of(0)[1] + 1 if layout.size > 1 else max_score + 1
    if Series.objects.filter(slug=slug).exists():
        raise SeasonError(f"a series {slug!r} already exists")
    with transaction.atomic():
        series = Series.objects.create(
            slug=slug, name=name, every=every, anchor=anchor, grace_seconds=grace_seconds, approval=approval,
            mode=mode, order=order, tie_break=tie_break, regions=list(regions), bucket_width=bucket_width,
            max_score=max_score, tiers=parsed_tiers.text() if parsed_tiers is not None else "")
        audit_log(actor=actor, action="series.created", target_type="series", target_id=slug,
                  after={"name": name, "every": every, "anchor": anchor.isoformat(), "grace_seconds": grace_seconds,
                         "approval": approval, "mode": mode, "order": order, "tie_break": tie_break,
                         "regions": list(regions),
                         "bucket_width": bucket_width, "max_score": max_score, **({"tiers": series.tiers}
                                                                                    if series.tiers else {})})
    series_windows_open(series=series, now=now)
    return series


def series_windows_open(*, series: Series, now: datetime | None = None) -> list[Season]:
    """Create every window season the series owes by `now` that does not exist yet (every
    window started so far and the next one), oldest first; the ones created.

    Idempotent and safe to run from two clocks at once: a window is one row under a
    unique (series, window), so the loser of a race finds it created and moves on."""
    now = now or timezone.now()
    have = set(Season.objects.filter(series=series).values_list("series_window", flat=True))
    created: list[Season] = []
    for n in windows_due(every=series.every, anchor=series.anchor, now=now):
        if n in have:
            continue
        starts_at, cutoff = window_bounds(every=series.every, anchor=series.anchor, n=n)
        try:
            with transaction.atomic():
                created.append(season_create(
                    slug=f"{series.slug}-{n}", name=f"{series.name} #{n}", starts_at=starts_at, cutoff=cutoff,
                    actor=SYSTEM, layout=BucketLayout.uniform(width=series.bucket_width, max_score=series.max_score),
                    regions=series.regions,
                    tie_break=series.tie_break, mode=series.mode, order=series.order, series=series, series_window=n,
                    seal_after_seconds=series.grace_seconds, tiers=series.tiers))
        except IntegrityError:
            log.info("series %s: window %d was opened by another clock", series.slug, n)
        except SeasonError as exc:
            # A season created on its own under the window's id: this window cannot open,
            # the others still do, and the tick reports it every time until staff act.
            log.warning("series %s: window %d cannot open: %s", series.slug, n, exc)
    return created


def series_tick(*, now: datetime | None = None) -> list[str]:
    """The clock's part for every series (Celery beat, before the seasons' lifecycle)."""
    done: list[str] = []
    for series in Series.objects.all():
        try:
            done += [f"{series.slug}: opened {s.slug}" for s in series_windows_open(series=series, now=now)]
        except SeasonError as exc:
            done.append(f"{series.slug}: {exc}")
    return done


@dataclass(frozen=True)
class SeriesApplyResult:
    """Each event's outcome with the window season it was filed in, and each of those
    seasons' published version."""

    outcomes: list[tuple[str, Outcome]]
    versions: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return {"results": [{**outcome.as_dict(), "season_id": slug} for slug, outcome in self.outcomes],
                "leaderboard_versions": self.versions}


def series_events_apply(*, series: Series, events: list[ScoreEvent], client: ApiClient | None,
                        now: datetime | None = None) -> SeriesApplyResult:
    """File each event in the window whose span holds its completed_at and apply each
    window's events as one batch there (seasons' own rules: a closed window's late rules
    included), in window order; the outcomes in the events' order. An event no window can
    hold (before the anchor, or past the next window) refuses the whole request with
    EventValidationError, nothing written."""
    placed = [window_of(every=series.every, anchor=series.anchor, instant=e.completed_at) or 0 for e in events]
    windows = {s.series_window: s for s in Season.objects.filter(series=series, series_window__in=set(placed))}
    if set(placed) - {0} - windows.keys():
        # A window the clock has not opened yet (beat behind or down): open what is due.
        series_windows_open(series=series, now=now)
        windows = {s.series_window: s for s in Season.objects.filter(series=series)}
    errors = {f"events[{i}].completed_at": [
        f"no window of series {series.slug!r} holds it: the first starts {series.anchor.isoformat()}, "
        "and windows open on schedule up to the next one"] for i, n in enumerate(placed) if n not in windows}
    if errors:
        raise EventValidationError(errors)
    outcomes: list[tuple[str, Outcome] | None] = [None] * len(events)
    versions: dict[str, int] = {}
    for n in sorted(set(placed)):
        at = [i for i, w in enumerate(placed) if w == n]
        season = windows[n]
        result = score_events_apply(season=season, events=[events[i] for i in at], client=client)
        versions[season.slug] = result.leaderboard_version
        for i, outcome in zip(at, result.outcomes, strict=True):
            outcomes[i] = (season.slug, outcome)
    return SeriesApplyResult(outcomes=[o for o in outcomes if o is not None], versions=versions)
