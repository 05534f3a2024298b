"""Writes of player profiles and friend lists (docs/rules.md, Regional and friends boards).

Each write is one transaction. Writers of the same player are serialized by a per-player
lock taken before anything is read, so a version only moves forward and the history of
profile changes is in version order, whichever writer commits first. Neither write is
audited (a reviewer's name reset is): like score events they come from a trusted service
in volume, and a profile's history is its own append-only table.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from leaderboard.core.errors import DomainError
from leaderboard.core.lifecycle import ACCEPTING_STATES
from leaderboard.core.profiles import (
    ProfileOutcome,
    ProfileWrite,
    StaleGraphVersion,
    StoredProfile,
    friends_stale,
    profiles_plan,
)
from leaderboard.ingest import ledger_store
from leaderboard.models import ApiClient, FriendList, PlayerProfile, PlayerProfileChange
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views.names import NAMES_FILLED, REFILL_BATCH, names_key, names_store
from seasons.models import Season

log = logging.getLogger(__name__)

# The seasons whose players follow their profile's region: open ones (a sealed season keeps
# the regions it was sealed with).
REGION_MOVE_STATES = [str(s) for s in ACCEPTING_STATES]

# Namespaces of the per-player advisory locks (pg_advisory_xact_lock(int, int)); the
# season writers' locks are 0x5C0E, 0x5C11 and above 0x5C0E << 15 (leaderboard/ingest/ledger_store.py).
_PROFILE_LOCK = 0x5C0F
_FRIENDS_LOCK = 0x5C10


def _lock_key(player_id: str) -> int:
    # A 32-bit key per player: two players sharing one only wait for each other.
    return int.from_bytes(hashlib.blake2b(player_id.encode(), digest_size=4).digest(), "big", signed=True)


def _player_locks_take(*, namespace: int, player_ids: Iterable[str]) -> None:
    """Lock these players until the transaction ends, in ascending key order (every writer
    takes them in that order, so two batches sharing players never deadlock); one round
    trip. On SQLite, BEGIN IMMEDIATE (settings) already serializes every writer."""
    if connection.vendor != "postgresql":
        return
    keys = sorted({_lock_key(player_id) for player_id in player_ids})
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_advisory_xact_lock(%s, k)) FROM unnest(%s::int[]) AS k",
                       [namespace, keys])


def _region_of(stored: str) -> str | None:
    return stored or None


def player_profiles_apply(*, profiles: list[ProfileWrite], client: ApiClient | None) -> list[ProfileOutcome]:
    """Apply one validated batch of profile writes in order, in one transaction: each item
    `applied`, `unchanged` or `stale` (core.profiles.profile_status); every applied or
    unchanged item appends a PlayerProfileChange row."""
    now = timezone.now()
    player_ids = {p.player_id for p in profiles}
    with transaction.atomic():
        _player_locks_take(namespace=_PROFILE_LOCK, player_ids=player_ids)
        stored = {
            player_id: StoredProfile(region=_region_of(region), profile_version=version, display_name=name,
                                     country=country, name_blocked=blocked)
            for player_id, region, version, name, country, blocked in PlayerProfile.objects.filter(
                player_id__in=player_ids).values_list("player_id", "region", "profile_version", "display_name",
                                                      "country", "name_blocked")
        }
        plan = profiles_plan(writes=profiles, stored=stored)
        if plan.writes:
            PlayerProfile.objects.bulk_create(
                [PlayerProfile(player_id=player_id, region=state.region or "", profile_version=state.profile_version,
                               display_name=state.display_name, country=state.country,
                               name_blocked=state.name_blocked, updated_at=now)
                 for player_id, state in plan.writes.items()],
                update_conflicts=True, unique_fields=["player_id"],
                update_fields=["region", "profile_version", "display_name", "country", "updated_at"],
            )
            PlayerProfileChange.objects.bulk_create(
                PlayerProfileChange(player_id=c.player_id, old_region=c.old_region or "", region=c.region or "",
                                    profile_version=c.profile_version, display_name=c.display_name,
                                    country=c.country, client=client, recorded_at=now)
                for c in plan.changes
            )
            named = [(player_id, state.display_name, state.country) for player_id, state in plan.writes.items()
                     if _name_of(stored.get(player_id)) != (state.display_name, state.country)]
            if named:
                transaction.on_commit(lambda: names_publish(names=named))
            _seasons_follow(moves={
                player_id: (state.region or "", state.profile_version)
                for player_id, state in plan.writes.items()
                if (stored[player_id].region if player_id in stored else None) != state.region
            }, now=now)
    return plan.outcomes


def _name_of(profile: StoredProfile | None) -> tuple[str | None, str | None]:
    return (None, None) if profile is None else (profile.display_name, profile.country)


class NameResetRefused(DomainError):
    code = "name_reset_refused"


def names_publish(*, names: list[tuple[str, str | None, str | None]]) -> None:
    """Store committed names where reads find them (leaderboard.views.names). A Redis that
    does not answer loses only this copy: the database holds the names, and `manage.py
    names_refill` writes them all again."""
    try:
        names_store(redis_get(), prefix=settings.REDIS_KEY_PREFIX, names=names)
    except REDIS_OUTAGES:
        log.warning("names of %d players not stored in Redis; run manage.py names_refill", len(names))


def player_name_reset(*, player_id: str, actor: Actor, reason: str) -> PlayerProfile:
    """A reviewer clears a player's display name (audited `player.name.reset`, with a reason):
    the name is blocked, so a later profile write naming it again keeps no name. Raises
    PlayerProfile.DoesNotExist for a player without a profile; a player without a name
    is refused (nothing to reset)."""
    if not reason.strip():
        raise NameResetRefused("a reason is required to reset a name")
    with transaction.atomic():
        _player_locks_take(namespace=_PROFILE_LOCK, player_ids=[player_id])
        profile = PlayerProfile.objects.select_for_update().get(player_id=player_id)
        if profile.display_name is None:
            raise NameResetRefused(f"{player_id} has no display name to reset")
        before = profile.display_name
        profile.name_blocked, profile.display_name = before, None
        profile.save(update_fields=["display_name", "name_blocked"])
        audit_log(actor=actor, action="player.name.reset", target_type="player", target_id=player_id,
                  before={"display_name": before}, after={"display_name": None}, reason=reason)
        country = profile.country
        transaction.on_commit(lambda: names_publish(names=[(player_id, None, country)]))
    return profile


def _seasons_follow(*, moves: dict[str, tuple[str, int]], now: datetime) -> None:
    """Players whose region changed move to it in every unsealed season with regions where
    they have a score, in this transaction: the next version shows them on their new
    regional board and never on two. A sealed season keeps the regions it was sealed
    with, like its scores. Seasons are locked in id order, after the players' locks."""
    if not moves:
        return
    seasons = Season.objects.filter(state__in=REGION_MOVE_STATES).order_by("pk").values_list("pk", "regions")
    for season_id, season_regions in seasons:
        if not season_regions:
            continue
        ledger_store.season_write_lock(season_id=season_id)
        ledger_store.season_players_region_move(season_id=season_id, season_regions=season_regions, moves=moves,
                                                now=now)


def player_friends_put(*, player_id: str, friends: list[str], graph_version: int) -> FriendList:
    """Replace the player's friend list with a validated one (core.profiles.friends_parse),
    only with a newer graph_version: otherwise StaleGraphVersion (409) and nothing changes."""
    with transaction.atomic():
        _player_locks_take(namespace=_FRIENDS_LOCK, player_ids=[player_id])
        stored = FriendList.objects.filter(player_id=player_id).values_list("graph_version", flat=True).first()
        if friends_stale(stored_version=stored, graph_version=graph_version):
            assert stored is not None
            raise StaleGraphVersion(stored=stored, sent=graph_version)
        row, _ = FriendList.objects.update_or_create(
            player_id=player_id,
            defaults={"friends": friends, "graph_version": graph_version, "updated_at": timezone.now()},
        )
    return row


def names_refill(*, progress: Callable[[int], None] | None = None) -> int:
    """Write every profile's name and country to where reads find them, from the database
    (after Redis lost them, or onto a new Redis), a batch at a time; a profile without
    either has its field removed. Idempotent; a profile write meanwhile stores its own
    name once it commits, so running this during writes leaves nothing stale for longer
    than that write's commit. Returns the profiles gone through."""
    r = redis_get()
    done = 0
    rows = PlayerProfile.objects.order_by("player_id").values_list("player_id", "display_name", "country")
    batch: list[tuple[str, str | None, str | None]] = []
    for row in rows.iterator(chunk_size=REFILL_BATCH):
        batch.append(row)
        if len(batch) == REFILL_BATCH:
            names_store(r, prefix=settings.REDIS_KEY_PREFIX, names=batch)
            done += len(batch)
            batch = []
            if progress is not None:
                progress(done)
    if batch:
        names_store(r, prefix=settings.REDIS_KEY_PREFIX, names=batch)
        done += len(batch)
    r.hset(names_key(settings.REDIS_KEY_PREFIX), NAMES_FILLED, "1")
    return done


def names_recover() -> int | None:
    """Refill the names (`names_refill`) when Redis has lost them: the hash's mark, set by
    the last refill, is gone with the hash (a flush, a restart without persistence, a new
    Redis). One refill at a time (a lock with the hash, in its slot); None when nothing
    was to do or another process is at it."""
    r = redis_get()
    key = names_key(settings.REDIS_KEY_PREFIX)
    if r.hexists(key, NAMES_FILLED):
        return None
    lock = f"{key}:refill"
    if not r.set(lock, "1", nx=True, ex=3600):
        return None
    try:
        done = names_refill()
    finally:
        r.delete(lock)
    log.info("names: Redis had lost them; %d profiles written again", done)
    return done
