"""Hourly snapshots (docs/rules.md, Movement and history): beat takes each accepting
season's snapshot of the last full hour, and of any hour of the last day it missed."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from leaderboard.core.history import HOURLY_KEPT, MOVEMENT_HOURS, histogram_chunks, hour_floor, hourly_expired
from leaderboard.core.lifecycle import ACCEPTING_STATES
from leaderboard.ledger_reads import ledger_snapshot
from leaderboard.models import Manifest, SeasonSnapshot, SnapshotChunk
from leaderboard.recovery.reconcile import ledger_value_counts
from leaderboard.redis_client import redis_get
from leaderboard.views.rankview.keys import Keys
from seasons.models import Season

log = logging.getLogger(__name__)


def snapshot_kept(season: Season) -> bool:
    """Whether the season keeps snapshots: a first_reached board ranks ties by when each
    player reached the score, which a score histogram cannot tell (docs/rules.md)."""
    return season.tie_break != "first_reached"


def season_snapshot_take(*, season: Season, taken_for: datetime) -> SeasonSnapshot | None:
    """The season's snapshot of the full hour `taken_for`: the version current at that
    instant and its histogram, from the ledger as of that version's watermark. Idempotent:
    a snapshot taken already is returned as it is. None when no version was published by
    then, or the season keeps none."""
    taken_for = hour_floor(taken_for)
    existing = SeasonSnapshot.objects.filter(season=season, taken_for=taken_for).first()
    if existing is not None or not snapshot_kept(season):
        return existing
    manifest = (Manifest.objects.filter(season=season, published_at__lte=taken_for)
                .order_by("-version").only("version", "watermark_txid", "watermark_id", "watermark_vector").first())
    if manifest is None:
        return None
    started = time.perf_counter()
    with ledger_snapshot(season=season):
        counts, hidden = ledger_value_counts(season=season, watermark=manifest.watermark)
    chunks = histogram_chunks(counts)
    took_ms = (time.perf_counter() - started) * 1000
    with transaction.atomic():
        snapshot, created = SeasonSnapshot.objects.get_or_create(
            season=season, taken_for=taken_for,
            defaults={"version": manifest.version, "total_players": sum(counts.values()),
                      "distinct_values": len(counts), "hidden": hidden, "taken_at": timezone.now(),
                      "took_ms": took_ms})
        if created:
            rows = []
            for chunk in chunks:
                values, players = chunk.encoded()
                rows.append(SnapshotChunk(snapshot=snapshot, low=chunk.low, above=chunk.above,
                                          chunk_values=values, chunk_counts=players))
            SnapshotChunk.objects.bulk_create(rows, batch_size=500)
    if created:
        log.info("season %s: snapshot of %s is version %d, %d players, %d values in %.0f ms", season.slug,
                 taken_for.isoformat(), manifest.version, snapshot.total_players, len(counts), took_ms)
    return snapshot


def season_snapshots_prune(*, season: Season) -> int:
    """Delete the season's hourly snapshots no longer read (core.history.hourly_expired):
    midnight's stay for the history."""
    latest = SeasonSnapshot.objects.filter(season=season).order_by("-taken_for").values_list(
        "taken_for", flat=True).first()
    if latest is None:
        return 0
    old = SeasonSnapshot.objects.filter(season=season, taken_for__lt=latest - HOURLY_KEPT)
    expired = [pk for pk, taken_for in old.values_list("pk", "taken_for") if hourly_expired(taken_for, latest=latest)]
    if not expired:
        return 0
    with transaction.atomic():
        SnapshotChunk.objects.filter(snapshot_id__in=expired).delete()
        SeasonSnapshot.objects.filter(pk__in=expired).delete()
    return len(expired)


# One taker at a time (a lock in Redis, like the names' refill): a snapshot of a large
# season outlasts beat's tick, and two takers would count the same histogram twice (the
# unique hour keeps the second one's rows out either way).
SNAPSHOTS_LOCK_SECONDS = 900


def snapshots_due_take(*, now: datetime | None = None) -> int | None:
    """Each accepting season's snapshots of the full hours of the last day it does not have
    yet (beat runs this every SNAPSHOT_CHECK_SECONDS; a beat that was down catches up), then
    its expired hourly ones pruned. Returns how many it took; None when another process is
    taking them."""
    r = redis_get()
    lock, token = f"{settings.REDIS_KEY_PREFIX}:snapshots:lock", uuid.uuid4().hex
    if not r.set(lock, token, nx=True, ex=SNAPSHOTS_LOCK_SECONDS):
        return None
    try:
        return _snapshots_due_take(now=now or timezone.now())
    finally:
        if r.get(lock) == token.encode():
            r.delete(lock)


def _snapshots_due_take(*, now: datetime) -> int:
    last = hour_floor(now)
    hours = [last - timedelta(hours=back) for back in range(MOVEMENT_HOURS, -1, -1)]
    taken = 0
    for season in Season.objects.filter(state__in=list(ACCEPTING_STATES)).order_by("pk"):
        if not snapshot_kept(season):
            continue
        have = set(SeasonSnapshot.objects.filter(season=season, taken_for__gte=hours[0]).values_list(
            "taken_for", flat=True))
        for hour in hours:
            if hour in have or hour < hour_floor(season.starts_at):
                continue
            if season_snapshot_take(season=season, taken_for=hour) is not None:
                taken += 1
        season_snapshots_prune(season=season)
        movement_snapshot_name(season=season)
    return taken


def movement_snapshot_name(*, season: Season) -> int | None:
    """Name in Redis the snapshot rank_24h_ago reads: the one taken MOVEMENT_HOURS before the
    season's latest (none: the name removed). A change, or a Redis that lost the name,
    starts the ranks kept beside it over; an unchanged name keeps them. Returns its id."""
    latest = SeasonSnapshot.objects.filter(season=season).order_by("-taken_for").values_list(
        "taken_for", flat=True).first()
    target = None if latest is None else SeasonSnapshot.objects.filter(
        season=season, taken_for=latest - timedelta(hours=MOVEMENT_HOURS)).values_list("pk", flat=True).first()
    r = redis_get()
    key = Keys(settings.REDIS_KEY_PREFIX, season.slug).moved
    named = r.hget(key, "")
    if (None if named is None else int(named)) == target:
        return target
    pipe = r.pipeline(transaction=True)
    pipe.unlink(key)
    if target is not None:
        pipe.hset(key, "", str(target))
    pipe.execute()
    return target
