"""Manifests in Redis: stored under the lease, read through a small per-process cache."""

from __future__ import annotations

import threading
from collections import OrderedDict

import redis
from django.conf import settings

from leaderboard.core.manifest import Manifest
from leaderboard.views.rankview.fence import _fenced
from leaderboard.views.rankview.keys import LEGACY_GROUPS, MANIFEST_TTL, Keys

# -------------------------------------------------------------------------- manifests


def manifest_store(r: redis.Redis, keys: Keys, manifest: Manifest, *, token: int | None = None) -> None:
    """Store a candidate manifest; with `token`, only while that token holds the lease.

    A coordinator that stalls after building a version can find its version number
    published by its successor: unfenced, its late write would replace the successor's
    manifest with one naming a stale copy generation. It expires after MANIFEST_TTL
    unless pointer_publish makes it current (a candidate that fails is not left behind).
    """
    raw = manifest.to_json()
    if token is None:
        r.set(keys.manifest(manifest.version), raw, ex=MANIFEST_TTL)
        return
    _fenced(r, keys, token, [("SET", keys.manifest(manifest.version), raw, "EX", MANIFEST_TTL)])


def copy_holds(r: redis.Redis, keys: Keys, manifest: Manifest) -> bool:
    """Whether the manifest's copy meta (in the control slot) still names its version.

    The meta only: whether every slot group still holds the version's generation (a
    failover can take a group's last writes) is reads.version_holds, which reads the meta
    too, in one round trip to every master. The generation alone is not enough: a dropped
    and rebuilt copy (or one rebuilt after Redis lost it) counts its generations again from
    the start, so an old manifest could match it. Version numbers are never reused;
    (generation, version) is unique.
    """
    gen, version, groups = r.hmget(keys.copy_meta(manifest.copy), ["gen", "version", "groups"])
    # A copy that records no slot groups was made before its keys were spread over them:
    # its data is under other names (keys.LEGACY_GROUPS), so it holds no version now.
    return groups is not None and int(groups) != LEGACY_GROUPS and _holds(manifest, gen, version)


def _holds(manifest: Manifest, gen: bytes | str | None, version: bytes | str | None) -> bool:
    return gen is not None and version is not None and int(gen) == manifest.gen and int(version) == manifest.version


def pointer_get(r: redis.Redis, keys: Keys) -> int | None:
    raw = r.get(keys.ptr)
    return int(raw) if raw is not None else None


# Least recently used first. Clearing it when full would send every season's readers to
# Redis at once; evicting the oldest keeps the current versions the reads actually use.
_manifest_cache: OrderedDict[tuple[str, str, int], Manifest] = OrderedDict()
# Taken by writers of the cache only: a hit, the hot path of every read, stays lock-free
# (each OrderedDict call is atomic under the GIL; a hit evicted meanwhile is just a hit).
_manifest_cache_lock = threading.Lock()
_MANIFEST_CACHE_MAX = 256


def manifest_cached(keys: Keys, version: int) -> Manifest | None:
    """The manifest of `version` if this process has it cached, without any Redis call."""
    cache_key = (keys.prefix, keys.season, version)
    cached = _manifest_cache.get(cache_key)
    if cached is not None:
        try:  # noqa: SIM105 - contextlib.suppress would cost more than the hit itself
            _manifest_cache.move_to_end(cache_key)
        except KeyError:
            pass
    return cached


def manifest_get(r: redis.Redis, keys: Keys, version: int) -> Manifest | None:
    """A manifest is immutable once published, so each process caches it by version."""
    cached = manifest_cached(keys, version)
    if cached is not None:
        return cached
    cache_key = (keys.prefix, keys.season, version)
    raw = r.get(keys.manifest(version))
    if raw is None:
        return None
    manifest = Manifest.from_json(raw)
    with _manifest_cache_lock:
        _manifest_cache[cache_key] = manifest
        while len(_manifest_cache) > _MANIFEST_CACHE_MAX:
            _manifest_cache.popitem(last=False)
    return manifest


def manifest_cache_clear() -> None:
    """Forget every manifest, and the copies' shard counts learned from them: a process
    started afresh."""
    with _manifest_cache_lock:
        _manifest_cache.clear()
        _learned_shards.clear()
        _learned_groups.clear()
        _learned_data.clear()
        _place_hints.clear()
        _latest_boards.clear()


def manifest_cache_forget(keys: Keys, version: int) -> None:
    """Forget a cached manifest that was never published (a failed candidate's number is reused)."""
    with _manifest_cache_lock:
        _manifest_cache.pop((keys.prefix, keys.season, version), None)


# The copy names each process has seen current, per season: readers pipeline the lookup
# of every one of them with the pointer read.
_learned_copies: dict[tuple[str, str], tuple[str, ...]] = {}


# Seasons seen with regional boards: their rank reads pipeline the player's region-shard
# entry with the lookup (a season without regions never pays for it).
_learned_regional: set[tuple[str, str]] = set()


# Each copy's lookup shards as this process last saw them, per (prefix, season, copy): the
# first round trip of a rank read names the player's shard in every copy before it knows
# which manifest it reads. A copy whose manifest says another count (built again since)
# costs one more round trip, which learns the count of every copy of the season.
_learned_shards: dict[tuple[str, str, str], int] = {}
# Each copy's slot groups (core.slots), learned like its lookup shards: the first round trip
# names the player's lookup group and its fence in every copy.
_learned_groups: dict[tuple[str, str, str], int] = {}
# Each copy's (index, side): where its data is, learned like its lookup shards.
_learned_data: dict[tuple[str, str, str], tuple[str, int]] = {}


# A player's last lookup reply (value, region) by (prefix, season, board's region, player),
# and the last manifest a read of each board took. A player who reads again while their
# value and the current version are the same has their place read in the first round
# trip, beside the lookup that confirms it: one round trip instead of two. A hint that no
# longer holds costs the place script sent for nothing, and the second round trip as
# before.
class PlaceHints:
    """The last READ_PLACE_HINTS / 2 to READ_PLACE_HINTS players read, in two generations of
    plain dicts: when the young one is full it becomes the old one and the oldest are
    forgotten at once. Evicting one entry at a time from the front of a dict would make
    each eviction scan the slots freed before it (CPython keeps them until a resize), and
    an OrderedDict costs more per read; a read races only to lose a hint."""

    def __init__(self) -> None:
        self.young: dict[tuple[str, str, str | None, str], tuple[bytes | None, bytes | None]] = {}
        self.old: dict[tuple[str, str, str | None, str], tuple[bytes | None, bytes | None]] = {}

    def get(self, key: tuple[str, str, str | None, str]) -> tuple[bytes | None, bytes | None] | None:
        hint = self.young.get(key)
        return hint if hint is not None else self.old.get(key)

    def keep(self, key: tuple[str, str, str | None, str], value: tuple[bytes | None, bytes | None]) -> None:
        most = settings.READ_PLACE_HINTS
        if most <= 0:
            return
        young = self.young
        young[key] = value
        if len(young) >= max(1, most // 2):
            self.old, self.young = young, {}

    def clear(self) -> None:
        self.young, self.old = {}, {}

    def __len__(self) -> int:
        return len(self.young.keys() | self.old.keys())


_place_hints = PlaceHints()
_latest_boards: dict[tuple[str, str, str | None], Manifest] = {}
