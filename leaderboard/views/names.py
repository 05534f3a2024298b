"""Players' names and countries as the read path serves them (docs/api.md, Names and countries).

One Redis hash, `{P}:{names}`: player_id -> "CC<US>name" (country, unit separator, name;
either part empty when unset; no field when both are). Names are the current ones, not
versioned with the board, so the board's copies do not hold them: a page of entries gets
its names with one HMGET, in the read's next round trip (or, for the top, in its first).
PlayerProfile in the database is the record; `names_refill` writes this hash from it
(after a Redis outage lost it, or on a new Redis), and a profile write or a reset stores
its players here once it commits.

The hash is one key, so on a cluster it lives in one slot: 81 bytes a named player (4 GB
at 50M; docs/benchmarks.md, Names on every read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry
from leaderboard.views.rankview.wire import round_trip

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


def names_call(prefix: str, player_ids: Sequence[str]) -> tuple[Any, ...]:
    """The one command that reads a page's names (to send in a read's round trip)."""
    return ("HMGET", names_key(prefix), *player_ids)


def names_of(player_ids: Sequence[str], reply: Sequence[bytes | None]) -> dict[str, Name]:
    """The players' (name, country) from a names_call reply; players without either are
    left out (readers take NO_NAME for them). A live round decodes tens of thousands:
    the decoding is inlined."""
    out: dict[str, Name] = {}
    separator = SEPARATOR.encode()
    for player_id, raw in zip(player_ids, reply, strict=True):
        if raw is not None:
            country, _, name = raw.partition(separator)
            out[player_id] = (name.decode() or None, country.decode() or None)
    return out


def names_read(r: redis.Redis, *, prefix: str, player_ids: Sequence[str]) -> dict[str, Name]:
    """The players' names in a round trip of their own (a page's players are known only once
    its entries are read); one command."""
    if not player_ids:
        return {}
    (reply,) = round_trip(r, [names_call(prefix, player_ids)])
    return names_of(player_ids, reply)


def top_names_read(r: redis.Redis, *, prefix: str, manifest: Manifest) -> list[bytes | None]:
    """The names_call reply for a version's top (top_shown takes it), in a round trip of its own."""
    ids = top_ids(manifest)
    return round_trip(r, [names_call(prefix, ids)])[0] if ids else []


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


def entry_dict(manifest: Manifest, entry: Entry, names: Mapping[str, Name]) -> dict[str, object]:
    """An entry as players see it everywhere (reads, the live board): its score as shown
    (the caller turned an asc board's back: core.ranking.entry_shown), the player's current
    name and country, and the tier of its rank on this board."""
    name, country = names.get(entry.player_id, NO_NAME)
    return {"position": entry.position, "rank": entry.rank, "player_id": entry.player_id, "score": entry.score,
            "display_name": name, "country": country, "tier": manifest.tier_of(entry.rank)}


def top_shown(manifest: Manifest, names: Sequence[bytes | None]) -> list[dict[str, Any]]:
    """The version's top as players see it (Manifest.shown_top) with the names of `names`,
    the reply of names_call for top_ids. Names change seldom beside the reads: the last
    list is kept with the names it has, and serves every read that finds the same."""
    key = tuple(names)
    held: tuple[tuple[bytes | None, ...], list[dict[str, Any]]] | None = manifest.memo.get("top_shown")
    if held is not None and held[0] == key:
        return held[1]
    named = names_of(top_ids(manifest), names)
    shown = []
    for entry in manifest.shown_top:
        name, country = named.get(entry["player_id"], NO_NAME)
        shown.append({**entry, "display_name": name, "country": country})
    manifest.memo["top_shown"] = (key, shown)
    return shown


def top_ids(manifest: Manifest) -> list[str]:
    """The players of a version's top 100, whose names a top read asks for (names_call)."""
    ids: list[str] | None = manifest.memo.get("top_ids")
    if ids is None:
        ids = manifest.memo["top_ids"] = [entry["player_id"] for entry in manifest.top]
    return ids
