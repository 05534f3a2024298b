"""Players' names and countries as the read path serves them (docs/api.md, Names and countries).

One Redis hash, `{P}:{names}`: player_id -> "CC<US>name" (country, unit separator, name;
either part empty when unset; no field when both are). Names are the current ones, not
versioned with the board, so the board's copies do not hold them: a page of entries gets
its names with one HMGET, in the read's next round trip (or, for the top, in its first).
PlayerProfile in the database is the record; `names_refill` writes this hash from it
(after a Redis outage lost it, or on a new Redis), and a profile write or a reset stores
its players here once it commits.

The hash is one key, so on a cluster it lives in one slot: ~40 bytes a named player,
about 2 GB at 50M (docs/operations.md, Names).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

SEPARATOR = "\x1f"
REFILL_BATCH = 10_000
# A field no player id can be (ids have no NUL): set by the last refill, gone with the
# hash when Redis loses it (leaderboard.profiles.names_recover).
NAMES_FILLED = "\x00filled"

Name = tuple[str | None, str | None]  # (display_name, country)
NO_NAME: Name = (None, None)


def names_key(prefix: str) -> str:
    return f"{prefix}:{{names}}"


def name_encode(display_name: str | None, country: str | None) -> str | None:
    if display_name is None and country is None:
        return None
    return f"{country or ''}{SEPARATOR}{display_name or ''}"


def name_decode(raw: bytes | str | None) -> Name:
    if raw is None:
        return NO_NAME
    text = raw.decode() if isinstance(raw, bytes) else raw
    country, _, name = text.partition(SEPARATOR)
    return (name or None, country or None)


def names_call(prefix: str, player_ids: Sequence[str]) -> tuple[Any, ...]:
    """The one command that reads a page's names (to send in a read's round trip)."""
    return ("HMGET", names_key(prefix), *player_ids)


def names_of(player_ids: Sequence[str], reply: Sequence[bytes | None]) -> dict[str, Name]:
    return {player_id: name_decode(raw) for player_id, raw in zip(player_ids, reply, strict=True)}


def names_store(r: redis.Redis, *, prefix: str, names: Iterable[tuple[str, str | None, str | None]]) -> None:
    """Store (player_id, display_name, country) triples: set, or delete when both are None."""
    sets: dict[str, str] = {}
    deletes: list[str] = []
    for player_id, display_name, country in names:
        encoded = name_encode(display_name, country)
        if encoded is None:
            deletes.append(player_id)
            sets.pop(player_id, None)
        else:
            sets[player_id] = encoded
    key = names_key(prefix)
    pipe = r.pipeline(transaction=False)
    if deletes:
        pipe.hdel(key, *deletes)
    if sets:
        pipe.hset(key, mapping=sets)  # type: ignore[arg-type]
    pipe.execute()
