"""Writes of player profiles and friend lists (docs/rules.md, Regional and friends boards).

Each write is one transaction. Writers of the same player are serialized by a per-player
lock taken before anything is read, so a version only moves forward and the history of
profile changes is in version order, whichever writer commits first. Neither write is
audited: like score events they come from a trusted service in volume, and a profile's
history is its own append-only table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

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
from seasons.models import Season

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
            player_id: StoredProfile(region=_region_of(region), profile_version=version)
            for player_id, region, version in PlayerProfile.objects.filter(player_id__in=player_ids).values_list(
                "player_id", "region", "profile_version")
        }
        plan = profiles_plan(writes=profiles, stored=stored)
        if plan.writes:
            PlayerProfile.objects.bulk_create(
                [PlayerProfile(player_id=player_id, region=state.region or "", profile_version=state.profile_version,
                               updated_at=now)
                 for player_id, state in plan.writes.items()],
                update_conflicts=True, unique_fields=["player_id"],
                update_fields=["region", "profile_version", "updated_at"],
            )
            PlayerProfileChange.objects.bulk_create(
                PlayerProfileChange(player_id=c.player_id, old_region=c.old_region or "", region=c.region or "",
                                    profile_version=c.profile_version, client=client, recorded_at=now)
                for c in plan.changes
            )
            _seasons_follow(moves={
                player_id: (state.region or "", state.profile_version)
                for player_id, state in plan.writes.items()
                if (stored[player_id].region if player_id in stored else None) != state.region
            }, now=now)
    return plan.outcomes


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
