"""Publishing versions (epochs) and checking them: what a published version answers,
compared read by read with the brute-force `Standings` of the ledger (docs/rules.md,
"Ranking"), and what the invariant checker finds in its copy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
import redis

from leaderboard.api.fastpath import ReadFastPath
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, Standings
from leaderboard.recovery.rebuild import season_epoch_advance
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.epoch import EpochResult
from leaderboard.views.invariants import version_check
from leaderboard.views.season_index import season_keys
from leaderboard.views.selectors import leaderboard_reader
from seasons.models import Season
from tests.support.writes import change_head, db_standings

# Eleven buckets: ten of 100 points for the scores these tests use, then the rest.
# A season's kind as every read answer states it, for a season created with the defaults.
DEFAULT_KIND = {"mode": "best", "order": "desc", "max_score": 1_000_000, "tie_break": "shared"}
NARROW = BucketLayout(layout_id=1, lower_bounds=tuple(range(0, 1001, 100)))

INVARIANT_CHECKS = frozenset({"bucket_counts", "total_players", "players_once", "bucket_ranges",
                              "bucket_checksums", "lookup_equals_index", "sampled_ranks"})


def keys_of(season: Season) -> rankview.Keys:
    return season_keys(season)


def reader_of(season: Season | str) -> rankview.RankReader:
    slug = season if isinstance(season, str) else season.slug
    return leaderboard_reader(season_slug=slug)


def current_manifest(season: Season) -> Manifest:
    """The manifest of the version the pointer names; fails the test when nothing is published."""
    r = redis_get()
    keys = keys_of(season)
    version = rankview.pointer_get(r, keys)
    assert version is not None, "nothing published"
    manifest = rankview.manifest_get(r, keys, version)
    assert manifest is not None, f"the pointer names v{version}, whose manifest is missing"
    return manifest


# ------------------------------------------------------------------ epochs


def epoch(season: Season) -> EpochResult:
    """One epoch over every change committed so far, whatever its outcome."""
    return season_epoch_advance(season=season)


def publish(season: Season) -> int:
    """One epoch that must publish a new version (holding every change committed so far); its number."""
    result = epoch(season)
    assert result.status == "published", result
    assert result.version is not None
    return result.version


def season_in_parts(season_factory: Callable[..., Season], settings: Any, *, slug: str, prefix: str,
                    claim_seconds: float, players: int = 400) -> Season:
    """A season of 8 ledger partitions whose epochs go in 2 parts (a part no worker claims
    within `claim_seconds` is run by the coordinator), `players` players `{prefix}000`...
    with spread scores, published."""
    from tests.support.writes import Events, apply_events

    settings.EPOCH_PARTS = 2
    settings.EPOCH_PART_CLAIM_SECONDS = claim_seconds
    season = season_factory(slug=slug, partitions=8)
    apply_events(season, [Events(slug).result(f"{prefix}{i:03d}", 2_503 * i) for i in range(players)])
    publish(season)
    return season


def materialize(season: Season) -> Manifest:
    """Bring the published version up to every change committed so far, publishing only if
    one is missing (an idle epoch is fine); refreshes `season` and returns the manifest."""
    head = change_head(season)
    result = epoch(season)
    assert result.status in ("published", "idle"), result
    manifest = current_manifest(season)
    assert manifest.watermark >= head, f"v{manifest.version} does not cover {head}"
    season.refresh_from_db()
    return manifest


# ------------------------------------------------------------------ reading a version


def board_read(reader: rankview.RankReader, version: int | None = None) -> tuple[int, list[Entry]]:
    """The whole board of one version through bounded windows; (version, entries)."""
    manifest, entries = reader.window(1, 100, version)
    pinned = manifest.version
    out = list(entries)
    while len(out) < manifest.total:
        _, more = reader.window(len(out) + 1, 100, pinned)
        assert more, "a window inside the board came back empty"
        out.extend(more)
    return pinned, out


def fast_get(url: str) -> httpx.Response:
    """GET `url` from the fast read path alone: a request it would hand on to Django fails the test."""

    async def go() -> httpx.Response:
        async def behind(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError(f"the fast path handed {scope['path']!r} on")

        transport = httpx.ASGITransport(app=ReadFastPath(behind, threads=1))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.get(url)

    return asyncio.run(go())


def board_snapshot(season: Season) -> tuple[int, list[Entry], dict[str, Any]]:
    """(version, whole board, each player's rank entry) through the API's reader."""
    reader = rankview.RankReader(redis_get(), keys_of(season), deadline=3600)
    version, board = board_read(reader)
    ranks = {e.player_id: reader.rank(e.player_id, version).entry for e in board}
    return version, board, ranks


def season_data_keys(season: Season, copy: str) -> list[bytes]:
    """Every key of a copy in Redis (on a cluster, on every master): its meta, and its
    index's data and fences when the index is named after it (a build's first copy)."""
    keys = keys_of(season)
    r = redis_get()
    return sorted(set(r.scan_iter(match=f"{keys.prefix}:{{{keys.season}:{copy}:*", count=1000))
                  | set(r.scan_iter(match=keys.copy_meta(copy), count=1000)))


def copy_contents(season: Season, copy: str) -> tuple[rankview.CopyMeta, dict[str, int], list[list[tuple[str, int]]]]:
    """A copy's metadata, its whole lookup and every bucket in index order, as its side sees them."""
    r = redis_get()
    keys = keys_of(season)
    meta = rankview.copy_meta_load(r, keys, copy)
    assert meta is not None, f"copy {copy} is missing"
    lookup: dict[str, int] = {}
    for player_id, score in rankview.copy_shards_scan(r, keys, meta.index, meta.lookup_shards, groups=meta.groups,
                                                      side=meta.side):
        lookup[player_id.decode()] = int(score)
    buckets = [[(p, int(v)) for p, v in rankview.bucket_values_scan(  # type: ignore[arg-type]
        r, keys, meta.index, meta.layout, meta.ties, b, groups=meta.groups, side=meta.side)]
        for b in range(meta.layout.size)]
    return meta, lookup, buckets


class RoundTrips:
    """What this process sends Redis about one season, one entry per round trip: the packed
    commands that name its keys, joined over every node written to before a reply to them
    is read (on a cluster a round trip is a send to each node it needs; a reply read starts
    the next one). Spied where redis-py writes to and reads from a socket; nothing is faked.
    `nodes`: the ports each round trip of the last `during` went to."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, season: Season) -> None:
        # "{slug:" names the season's data keys (not the pointer's or a manifest's slot).
        self.marker = f"{{{season.slug}:".encode()
        self.sent: list[bytes] = []
        self.nodes: list[set[int]] = []
        waiting: set[int] = set()  # connections whose reply to a season send is unread
        replied = [True]
        send = redis.connection.AbstractConnection.send_packed_command
        read = redis.connection.AbstractConnection.read_response

        def spy_send(conn: Any, command: Any, check_health: bool = True) -> None:
            chunks = [command] if isinstance(command, bytes | str) else list(command)
            packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
            # Sent first: a new connection's handshake (read inside) is no round trip of the read's.
            send(conn, command, check_health)
            if self.marker in packed:
                if replied[0]:
                    self.sent.append(b"")
                    self.nodes.append(set())
                    replied[0] = False
                self.sent[-1] += packed
                self.nodes[-1].add(int(conn.port))
                waiting.add(id(conn))

        def spy_read(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if id(conn) in waiting:
                waiting.discard(id(conn))
                replied[0] = True
            return read(conn, *args, **kwargs)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", spy_send)
        monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", spy_read)

    def during(self, read: Callable[[], object]) -> list[bytes]:
        self.sent.clear()
        self.nodes.clear()
        read()
        return list(self.sent)


def builds_counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the index builds from the current scores from here on (`["n"]`)."""
    from leaderboard.views import build

    builds = {"n": 0}
    real_build = build.season_copies_build

    def counted(**kwargs: Any) -> Any:
        builds["n"] += 1
        return real_build(**kwargs)

    monkeypatch.setattr(build, "season_copies_build", counted)
    return builds


# ------------------------------------------------------------------ checks


def assert_idle_copy_caught_up(season: Season) -> None:
    """The copy that is not current holds exactly what the current one holds, at its watermark."""
    current = current_manifest(season)
    idle = next(c for c in rankview.copies_get(redis_get(), keys_of(season)) if c != current.copy)
    meta, lookup, buckets = copy_contents(season, idle)
    _, current_lookup, current_buckets = copy_contents(season, current.copy)
    assert (meta.state, meta.watermark) == (rankview.STATE_READY, current.watermark)
    assert (meta.counts, meta.checksums) == (current.counts, current.checksums)
    assert lookup == current_lookup
    assert buckets == current_buckets


def top_entries(top: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A manifest's top without what only the service reads (a first_reached entry's
    reached_ms, where its cursor starts)."""
    return [{k: v for k, v in entry.items() if k != "reached_ms"} for entry in top]


def assert_board_equals(reader: rankview.RankReader, expected: Standings, *, version: int | None = None,
                        players: Iterable[str] = (), absent: Iterable[str] = (), radius: int = 10,
                        window_limits: tuple[int, ...] = (1, 3)) -> int:
    """Every read of the version against the reference: top, total, the rank and the
    neighbours of every player, a window at every position, and the empty tail.
    Returns the version that answered (pinned for all reads after the first)."""
    manifest, top = reader.top(100, version)
    pinned = manifest.version
    everything = expected.window(from_position=1, limit=len(expected) + 1)
    assert manifest.total == len(expected)
    assert top_entries(top) == [e.as_dict() for e in expected.top(100)], f"top of v{pinned}"

    got_version, board = board_read(reader, pinned)
    assert got_version == pinned
    assert board == everything, f"board of v{pinned}"

    for player_id in set(players) | {e.player_id for e in everything}:
        view = reader.rank(player_id, pinned)
        assert view.manifest.version == pinned
        assert view.entry == expected.entry(player_id), f"rank of {player_id} in v{pinned}"
        _, me, around = reader.neighbors(player_id, radius, pinned)
        assert me == expected.entry(player_id)
        assert around == expected.neighbors(player_id, radius), f"neighbours of {player_id} in v{pinned}"
    for player_id in absent:
        assert reader.rank(player_id, pinned).entry is None
        assert reader.neighbors(player_id, radius, pinned)[1:] == (None, [])
    for limit in window_limits:
        for position in range(1, len(expected) + 1):
            _, window = reader.window(position, limit, pinned)
            assert window == everything[position - 1 : position - 1 + limit], f"window {position}+{limit}"
    assert reader.window(len(expected) + 1, 100, pinned)[1] == []
    return pinned


def full_check(season: Season, version: int | None = None, *, sample: int = 10_000) -> None:
    """The invariant checker with a full scan (every player once, checksums, lookup = index)
    and brute-force ranks of up to `sample` players (all of them on the boards tests build)."""
    report = version_check(r=redis_get(), keys=keys_of(season), version=version, full=True, sample=sample)
    assert report.ok, report.failures()
    assert {f.check for f in report.findings} >= INVARIANT_CHECKS


def assert_matches_ledger(season: Season, *, exhaustive: bool = True, **kwargs: Any) -> int:
    """The current version holds every committed change and answers as the ledger's
    standings do, then passes the full invariant check; returns the version.

    `exhaustive`: every read (assert_board_equals, which takes the other keywords).
    Otherwise, cheaper for big boards: the whole board and the top, and the ranks the
    invariant checker samples."""
    manifest = current_manifest(season)
    head = change_head(season)
    assert head <= manifest.watermark, "the version does not cover every committed change"
    expected = db_standings(season)
    reader = reader_of(season)
    if exhaustive:
        version = assert_board_equals(reader, expected, **kwargs)
    else:
        version, board = board_read(reader, manifest.version)
        assert board == expected.window(from_position=1, limit=len(expected) + 1), f"board of v{version}"
        assert top_entries(reader.top(100, version)[1]) == [e.as_dict() for e in expected.top(100)], \
            f"top of v{version}"
    full_check(season, version)
    return version


@contextlib.contextmanager
def announcements_muted() -> Iterator[None]:
    """Versions published in the block reach no live socket, as if their announcement were lost."""
    from leaderboard.live.announce import live_version_published
    from leaderboard.views.signals import version_published

    uid = "leaderboard.live.version_published"
    version_published.disconnect(dispatch_uid=uid)
    try:
        yield
    finally:
        version_published.connect(live_version_published, dispatch_uid=uid)
