"""Helpers of the read-side tests (rank views, materializer, read API): writing through the
real write API, running epochs, and comparing a published version with the brute-force
`Standings` of CONTRACT.md 1."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection

from leaderboard import rankview
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, Standings
from leaderboard.materializer import season_keys
from leaderboard.models import PlayerScore, ScoreChange
from leaderboard.redis_client import redis_get
from leaderboard.selectors import leaderboard_reader
from seasons.models import Season

Post = Callable[..., Any]

COMPLETED_AT = "2026-11-15T12:00:00Z"


class Events:
    """Builds valid score events with unique ids and increasing score versions."""

    _ids = itertools.count(1)

    def __init__(self, tag: str = "e"):
        self.tag = tag
        self.versions: dict[str, int] = {}
        self.sent: list[dict[str, Any]] = []

    def result(self, player_id: str, best_score: int) -> dict[str, Any]:
        return self._make(player_id, best_score, kind="result")

    def correction(self, player_id: str, best_score: int, reason: str = "dispute upheld") -> dict[str, Any]:
        return self._make(player_id, best_score, kind="correction", reason=reason)

    def stale(self, player_id: str, best_score: int) -> dict[str, Any]:
        """A result older than the last one this builder sent for the player: recorded, ignored."""
        n = next(self._ids)
        event = {"event_id": f"{self.tag}-{n}", "match_id": f"m-{n}", "player_id": player_id,
                 "best_score": best_score, "score_version": max(1, self.versions[player_id] - 1),
                 "completed_at": COMPLETED_AT}
        self.sent.append(event)
        return event

    def _make(self, player_id: str, best_score: int, **extra: Any) -> dict[str, Any]:
        # One counter for ids and versions, shared by every builder: versions increase per
        # player whichever builder sent the previous event.
        n = next(self._ids)
        version = n
        self.versions[player_id] = version
        event = {"event_id": f"{self.tag}-{n}", "match_id": f"m-{n}", "player_id": player_id,
                 "best_score": best_score, "score_version": version, "completed_at": COMPLETED_AT, **extra}
        self.sent.append(event)
        return event


def post_ok(post_scores: Post, season: Season | str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    slug = season if isinstance(season, str) else season.slug
    response = post_scores(slug, {"events": events})
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    assert len(results) == len(events)
    return results


def db_scores(season: Season) -> dict[str, int]:
    return dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score"))


def db_standings(season: Season) -> Standings:
    return Standings(db_scores(season))


def change_head(season: Season) -> tuple[int, int] | None:
    """The (txid, id) cursor of the season's newest committed change."""
    row = ScoreChange.objects.filter(season=season).order_by("-txid", "-id").values_list("txid", "id").first()
    return (int(row[0]), int(row[1])) if row else None


def scores_at_watermark(season: Season, watermark: tuple[int, int]) -> dict[str, int]:
    """The board a version with this watermark must hold, replayed from the change stream
    alone: per player, the newest (highest score_version) change at or below the cursor."""
    newest: dict[str, tuple[int, int]] = {}
    for txid, ident, player_id, score, version in ScoreChange.objects.filter(season=season).values_list(
        "txid", "id", "player_id", "new_score", "score_version"
    ):
        if (txid, ident) > watermark:
            continue
        seen = newest.get(player_id)
        if seen is None or version > seen[1]:
            newest[player_id] = (score, version)
    return {p: s for p, (s, _) in newest.items()}


def keys_of(season: Season) -> rankview.Keys:
    return season_keys(season)


def reader_of(season: Season | str) -> rankview.RankReader:
    slug = season if isinstance(season, str) else season.slug
    return leaderboard_reader(season_slug=slug)


def current_manifest(season: Season) -> Manifest:
    r = redis_get()
    keys = keys_of(season)
    version = rankview.pointer_get(r, keys)
    assert version is not None, "nothing published"
    manifest = rankview.manifest_get(r, keys, version)
    assert manifest is not None
    return manifest


def copy_contents(season: Season, copy: str) -> tuple[rankview.CopyMeta, dict[str, int], list[list[tuple[str, int]]]]:
    """A copy's metadata, its whole lookup and every bucket in index order."""
    r = redis_get()
    keys = keys_of(season)
    meta = rankview.copy_meta_load(r, keys, copy)
    assert meta is not None, f"copy {copy} is missing"
    lookup: dict[str, int] = {}
    for shard in range(rankview.LOOKUP_SHARDS):
        raw: dict[bytes, bytes] = r.hgetall(keys.lookup(copy, shard))  # type: ignore[assignment]
        lookup.update({p.decode(): int(s) for p, s in raw.items()})
    buckets = []
    for b in range(meta.layout.size):
        members: list[tuple[bytes, float]] = r.zrange(  # type: ignore[assignment]
            keys.bucket(copy, meta.layout.layout_id, b), 0, -1, withscores=True)
        buckets.append([(p.decode(), -int(s)) for p, s in members])
    return meta, lookup, buckets


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
    assert top == [e.as_dict() for e in expected.top(100)], f"top of v{pinned}"

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


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def settle(season: Season, *, timeout: float = 120.0) -> None:
    """Wait until every committed change of the season is visible to the change stream.

    On PostgreSQL the stream returns a change only once every older transaction of the
    whole server has ended (selectors.score_changes_after), so unrelated sessions on the
    same server (another test run, a benchmark) delay it by their transactions' length.
    Waiting here keeps the tests exact about which version holds what. SQLite: no wait.
    """
    if not is_postgres():
        return
    head = change_head(season)
    if head is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            xmin = int(cursor.fetchone()[0])
        if xmin > head[0]:
            return
        assert time.monotonic() < deadline, f"transaction {head[0]} still not visible after {timeout} s"
        time.sleep(0.01)


def epoch(season: Season) -> Any:
    """One epoch, once every change committed so far can be seen."""
    from leaderboard.materializer import season_epoch_run

    settle(season)
    return season_epoch_run(season=season)
