"""Reconciliation of a published version against the ledger (docs/rules.md, FINAL candidate and approval).

The invariant checker proves a version is internally consistent; this proves it equals
the source of truth, on each board (the global one, and in a season with regions each
region's, from the ledger's players grouped by region): player count, top 100,
stratified sampled ranks recomputed on the ledger as 1 + count(higher) (and on a regional
board the player's region), and per-bucket checksums recomputed from the current-scores
table. Used for the FINAL candidate; it reads the whole season, so it is not per epoch.

A recovery's candidate, built by the same job a moment before from one read of the
ledger, is reconciled without reading the season again (`recovery_reconcile`): exact
per-bucket counts from the ledger instead of its checksums, every player the catch-up
replayed checked one by one, and the invariant checker's counts and sampled ranks instead
of its full scan (docs/architecture.md, Reconciling a recovery, says why that is enough).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import redis
from django.conf import settings
from django.db import connection, connections
from django.db.models import Count
from django.utils import timezone

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import checksum_add
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import Entry
from leaderboard.core.reconciliation import (
    Report,
    board_check,
    board_sample,
    first_mismatch,
    stratified_positions,
    version_boards,
)
from leaderboard.core.shared_index import entry_name
from leaderboard.core.tiebreak import FirstReached, IndexValue, index_key, lookup_value, value_score, value_token
from leaderboard.ingest.selectors import changes_after_q
from leaderboard.ledger_reads import (
    ledger_databases_list,
    ledger_players_group,
    ledger_querysets_each,
    ledger_rows_list,
    ledger_snapshot,
)
from leaderboard.models import PlayerScore, ReconciliationRun, ScoreChange
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import sampled_reads, version_check
from leaderboard.views.rankview.shared import lookup_seen, seen_key_call
from seasons.models import Season

_ORDER_PG = 'ORDER BY score DESC, player_id COLLATE "C"'
# SQLite compares text with BINARY collation by default: byte order, as docs/rules.md (Ranking) says.
_ORDER_SQLITE = "ORDER BY score DESC, player_id"
# First_reached seasons (docs/rules.md, Ties decided by who got there first); rows from
# before reached_at was recorded count as reached at the start (core.tiebreak).
_ORDER_REACHED_PG = 'ORDER BY score DESC, reached_at ASC NULLS FIRST, player_id COLLATE "C"'
# (SQLite sorts nulls first in ascending order.)
_ORDER_REACHED_SQLITE = "ORDER BY score DESC, reached_at ASC, player_id"

# What the reconciliation compares per player: the score, or (score, reached_ms).
Moved = dict[str, tuple[IndexValue | None, IndexValue | None]]


@dataclass(frozen=True, slots=True)
class LedgerMoves:
    """Players changed after a version's watermark (a score, or a region move): their
    current value and their value at the watermark (None: not in the season then), and in
    a season with regions their current region and their region at the watermark ("" none)."""

    values: Moved
    regions: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The moved players staff had hidden at the watermark (their value there is None).
    hidden: set[str] = field(default_factory=set)

    def on_board(self, board: str) -> Moved:
        """The moves as one board sees them ("" the global board): on a regional board a
        player's value counts only while their region was that board's."""
        if not board:
            return self.values
        moved: Moved = {}
        for player_id, (now, then) in self.values.items():
            now_region, then_region = self.regions.get(player_id, ("", ""))
            seen = (now if now_region == board else None, then if then_region == board else None)
            if seen != (None, None):
                moved[player_id] = seen
        return moved


def display_order_sql(*, first_reached: bool = False, ascending: bool = False) -> str:
    """The display order over the current scores (an asc board's: lower scores first)."""
    if connection.vendor == "postgresql":
        order = _ORDER_REACHED_PG if first_reached else _ORDER_PG
    else:
        order = _ORDER_REACHED_SQLITE if first_reached else _ORDER_SQLITE
    return order.replace("score DESC", "score ASC") if ascending else order


def _rank_key(value: IndexValue) -> Any:
    """Larger is ahead: the score, or (score, -reached_ms) (earlier is ahead)."""
    return value if isinstance(value, int) else (value[0], -value[1])


class ScoreHistogram:
    """One board of the ledger as of a version's watermark, in counts: its players, its
    players per bucket of `layout`, and count(ahead of v) for each value v of `queries`
    (players with a higher score, or on a first_reached board the same score reached
    earlier), the values asked for being known before the rows are read.

    Fed (value, players) rows of a GROUP BY over the current scores one at a time (`add`),
    then `finish`ed with `moved`: players whose value on this board changed after the
    watermark, with their current value and their value at the watermark (None: not on
    the board then). It holds a count per value asked for and per bucket, never the rows:
    a first_reached season has about a row per player.
    """

    def __init__(self, *, queries: Iterable[IndexValue] = (), layout: BucketLayout | None = None):
        self._keys = sorted({_rank_key(value) for value in queries})
        # _slots[i]: the players ahead of exactly the values _keys[:i] (bisect_left of theirs).
        self._slots = [0] * (len(self._keys) + 1)
        self._ahead: dict[Any, int] = {}
        self.layout = layout
        self._counts = [0] * layout.size if layout is not None else []
        self.total = 0

    def add(self, value: IndexValue, players: int) -> None:
        self._slots[bisect_left(self._keys, _rank_key(value))] += players
        if self.layout is not None:
            self._counts[self.layout.bucket_of(value_score(value))] += players
        self.total += players

    def finish(self, moved: Moved | None = None) -> ScoreHistogram:
        for now, then in (moved or {}).values():
            if now is not None:
                self.add(now, -1)
            if then is not None:
                self.add(then, 1)
        running = 0
        for i in range(len(self._keys), 0, -1):
            running += self._slots[i]
            self._ahead[self._keys[i - 1]] = running
        return self

    def higher_than(self, value: IndexValue) -> int:
        """count(ahead of `value`): one of the values it was made for."""
        return self._ahead[_rank_key(value)]

    def bucket_counts(self, layout: BucketLayout) -> list[int]:
        """The players in each bucket of `layout` (the one it was made with): exact, from
        the same rows as the ranks."""
        assert self.layout is not None and layout.lower_bounds == self.layout.lower_bounds
        return list(self._counts)


def ledger_moved_since(*, season: Season, watermark: Watermark, ties: FirstReached | None = None,
                       regions: bool = False) -> LedgerMoves:
    """Players changed after `watermark`, with their values (and with `regions`, their
    regions) now and at the watermark.

    The first change after the watermark carries the value before it (old_score, and
    old_reached_at) and the region before it (old_region), so the ledger as of any
    retained watermark is the current table plus these few rows. Read in (txid, id)
    order: partition after partition, each in commit order, which is every player's
    order (a player's changes are in one partition, or after a repartition in partitions
    numbered in the order they were used). With several ledger databases, each database's
    changes in that order: a player's changes all live in one of them.
    """
    moved: dict[str, IndexValue | None] = {}
    was_in: dict[str, str] = {}
    hidden_then: set[str] = set()
    after = (
        ScoreChange.objects.filter(season_id=season.pk)
        .filter(changes_after_q(watermark))
        .order_by("txid", "id")
        .values_list("player_id", "old_score", "old_reached_at", "old_region", "old_hidden")
    )
    flip = season.board_kind.flip
    for rows in ledger_querysets_each(season=season, queryset=after):
        for player_id, old_score, old_reached, old_region, old_hidden in rows.iterator(chunk_size=20_000):
            if player_id not in moved:
                # Hidden then: on no board at the watermark.
                moved[player_id] = (_value(ties, old_score, old_reached, flip)
                                    if old_score is not None and not old_hidden else None)
                if old_hidden:
                    hidden_then.add(player_id)
                was_in[player_id] = old_region
    current = {p: (value, region) for p, value, region in _scores(season, ties, players=list(moved),
                                                                  regions=regions)}
    values = {p: (current[p][0] if p in current else None, then) for p, then in moved.items()}
    if not regions:
        return LedgerMoves(values=values, hidden=hidden_then)
    return LedgerMoves(values=values, regions={p: (current[p][1] if p in current else "", was_in[p]) for p in moved},
                       hidden=hidden_then)


def _value(ties: FirstReached | None, score: int, reached_at: datetime | None, flip: int | None) -> IndexValue:
    """A ledger row's value as the board holds it: its score (max_score - score on an asc
    board, `flip`), with the reached_ms on a first_reached one."""
    if flip is not None:
        score = flip - score
    return score if ties is None else (score, ties.reached_ms(reached_at))


def ledger_histograms(*, season: Season, ties: FirstReached | None, moves: LedgerMoves,
                      boards: Sequence[Manifest], queries: dict[str, list[IndexValue]]) -> dict[str, ScoreHistogram]:
    """Each board's histogram of the ledger as of the version's watermark ("" the global
    board, then each regional one of `boards`), for the values `queries` names per board,
    from one GROUP BY over the current scores of each ledger database, streamed."""
    histograms = {board.board: ScoreHistogram(queries=queries.get(board.board, ()), layout=board.layout)
                  for board in boards}
    by_region = len(histograms) > 1
    everyone = histograms[""]
    for region, value, n in _histogram(season, ties, by_region=by_region):
        everyone.add(value, n)
        if region and region in histograms:
            histograms[region].add(value, n)
    return {name: histogram.finish(moves.on_board(name)) for name, histogram in histograms.items()}


def ledger_value_counts(*, season: Season, watermark: Watermark) -> tuple[dict[int, int], list[str]]:
    """The global board of a shared-ties season as of `watermark`, value -> players (zero
    counts left out): one GROUP BY over the current scores of each ledger database, less
    the players' values changed after it; and the players staff had hidden then (left out
    of the counts). Call it inside `ledger_snapshot`, so the reads describe one moment."""
    moves = ledger_moved_since(season=season, watermark=watermark)
    hidden = {p for p in ledger_rows_list(season=season, queryset=PlayerScore.objects.filter(
        season_id=season.pk, hidden=True).values_list("player_id", flat=True)) if p not in moves.values}
    counts: dict[int, int] = {}
    for _, value, n in _histogram(season):
        assert isinstance(value, int)  # shared ties: a value is a score
        counts[value] = counts.get(value, 0) + n
    for now, then in moves.values.values():
        if now is not None:
            counts[now] -= 1  # type: ignore[index]
        if then is not None:
            counts[then] = counts.get(then, 0) + 1  # type: ignore[index, arg-type]
    return {value: n for value, n in counts.items() if n}, sorted(hidden | moves.hidden)


def _histogram(season: Season, ties: FirstReached | None = None, *, by_region: bool = False
               ) -> Iterator[tuple[str, IndexValue, int]]:
    """(region, value, players) rows, from each ledger database on a server-side cursor;
    the region is "" unless `by_region`."""
    fields = ("score", *(("reached_at",) if ties is not None else ()))
    fields = ("region", *fields) if by_region else fields
    grouped = (PlayerScore.objects.filter(season_id=season.pk, hidden=False).values(*fields)
               .annotate(n=Count("id")).order_by().values_list(*fields, "n"))
    flip = season.board_kind.flip
    for rows in ledger_querysets_each(season=season, queryset=grouped):
        for row in rows.iterator(chunk_size=20_000):
            value = _value(None, int(row[-2]), None, flip) if ties is None else _value(ties, row[-3], row[-2], flip)
            yield (str(row[0]) if by_region else "", value, int(row[-1]))


def ledger_top(*, season: Season, limit: int = 100, moved: Moved | None = None,
               ties: FirstReached | None = None, region: str = "") -> list[tuple[str, IndexValue]]:
    """The first `limit` players of a board ("" the global one, else `region`'s) in display
    order, as of the watermark `moved` was taken at (its moves as that board sees them):
    each ledger database's first ones, merged by the sort below."""
    moved = moved or {}
    where = "season_id = %s AND NOT hidden AND region = %s" if region else "season_id = %s AND NOT hidden"
    params: list[Any] = [season.pk, region] if region else [season.pk]
    rows: list[tuple[str, IndexValue]] = []
    flip = season.board_kind.flip
    for alias in ledger_databases_list(season=season):
        if ties is None:
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT player_id, score FROM leaderboard_playerscore WHERE {where} "
                    f"{display_order_sql(ascending=flip is not None)} LIMIT %s", [*params, limit + len(moved)],
                )
                rows += [(p, _value(None, int(score), None, flip)) for p, score in cursor.fetchall() if p not in moved]
        else:
            top = PlayerScore.objects.using(alias).raw(
                f"SELECT id, player_id, score, reached_at FROM leaderboard_playerscore WHERE {where} "
                f"{display_order_sql(first_reached=True, ascending=flip is not None)} LIMIT %s",
                [*params, limit + len(moved)])
            rows += [(row.player_id, _value(ties, row.score, row.reached_at, flip)) for row in top
                     if row.player_id not in moved]
    rows += [(p, then) for p, (_, then) in moved.items() if then is not None]
    rows.sort(key=lambda row: (tuple(-x for x in _as_tuple(_rank_key(row[1]))), row[0].encode()))
    return rows[:limit]


def _as_tuple(key: Any) -> tuple[int, ...]:
    return key if isinstance(key, tuple) else (key,)


def ledger_bucket_checksums(*, season: Season, manifest: Manifest, moves: LedgerMoves
                            ) -> dict[str, tuple[list[int], list[int]]]:
    """Each board's (counts, checksums) per bucket of the manifest's layout ("" the global
    board, then each of its regions), of the ledger as of its watermark, in one scan."""
    size = manifest.layout.size
    boards = {board: ([0] * size, [0] * size) for board in ("", *manifest.regions)}

    def add(board: str, player_id: str, value: IndexValue) -> None:
        counts, checksums = boards[board]
        bucket = manifest.layout.bucket_of(value_score(value))
        counts[bucket] += 1
        checksums[bucket] = checksum_add(checksums[bucket], player_id, value_token(value))

    def place(player_id: str, value: IndexValue, region: str) -> None:
        add("", player_id, value)
        if region and region in boards:
            add(region, player_id, value)

    for player_id, value, region in _scores(season, manifest.ties, regions=bool(manifest.regions)):
        if player_id not in moves.values:
            place(player_id, value, region)
    for player_id, (_, then) in moves.values.items():
        if then is not None:
            place(player_id, then, moves.regions.get(player_id, ("", ""))[1])
    return boards


def _scores(season: Season, ties: FirstReached | None = None, players: list[str] | None = None,
            regions: bool = False) -> Iterator[tuple[str, IndexValue, str]]:
    """(player_id, value, region) of the season's current scores (of `players` only, when
    given, each asked of the database holding it); the region is read only with `regions`
    ("" otherwise)."""
    columns = ("player_id", "score", *(("reached_at",) if ties is not None else ()), *(("region",) if regions else ()))
    # A hidden player is on no board (docs/rules.md, Hidden players): no value.
    rows = PlayerScore.objects.filter(season_id=season.pk, hidden=False)
    if players is None:
        querysets = ledger_querysets_each(season=season, queryset=rows)
    else:
        querysets = [rows.using(alias).filter(player_id__in=names)
                     for alias, names in ledger_players_group(season=season, player_ids=players).items()]
    flip = season.board_kind.flip
    for queryset in querysets:
        for row in queryset.values_list(*columns).iterator(chunk_size=20_000):
            value = _value(ties, row[1], row[2] if ties is not None else None, flip)
            yield row[0], value, row[-1] if regions else ""


def version_reconcile(
    *, r: redis.Redis, keys: rankview.Keys, season_id: int, version: int, sample: int = 1000, seed: int | None = None,
    season: Season | None = None,
) -> Report:
    """Every check of docs/rules.md (FINAL candidate and approval) on one version, on each
    of its boards (the global one and every region's); each finding says what differs and
    by how much, and names its board (core.reconciliation.board_check). In bounded
    memory: the index is scanned a chunk at a time (invariants.version_check), the ledger
    on server-side cursors into per-bucket counts and checksums."""
    return _reconcile(r=r, keys=keys, season=season or Season.objects.get(pk=season_id), version=version,
                      sample=sample, seed=seed, replayed=None)


def recovery_reconcile(
    *, r: redis.Redis, keys: rankview.Keys, season_id: int, version: int, replayed: Collection[str],
    sample: int = 1000, seed: int | None = None, season: Season | None = None,
) -> Report:
    """A recovery's candidate against the ledger, without a full read of either side.

    Only for a version whose copy the caller built from the current-scores table itself
    (build.season_copies_build: bucket counts and checksums taken from the rows it
    sent, every write's reply and every bucket's size checked) and then caught up with the
    change stream, `replayed` being the players that catch-up applied. Per board: the
    player count, each bucket's count, the top 100 and the sampled ranks against the ledger
    as of the watermark (one GROUP BY); each replayed player's value, buckets and region
    against it one by one; the invariant checker's bucket sizes and sampled ranks.
    """
    return _reconcile(r=r, keys=keys, season=season or Season.objects.get(pk=season_id), version=version,
                      sample=sample, seed=seed, replayed=replayed)


def _reconcile(*, r: redis.Redis, keys: rankview.Keys, season: Season, version: int, sample: int,
               seed: int | None, replayed: Collection[str] | None) -> Report:
    report = version_check(r=r, keys=keys, version=version, sample=sample, full=replayed is None, seed=seed)
    manifest = rankview.manifest_get(r, keys, version)
    unreadable = any(f.check in ("manifest", "copy", "published") for f in report.failures())
    if manifest is None or unreadable:
        return report

    # One snapshot per ledger database for every ledger read below: the table and the
    # changes made after the version's watermark then describe the same moment of each
    # database's partitions (a player's rows all live in one database).
    with ledger_snapshot(season=season):
        _ledger_checks(r=r, keys=keys, season=season, manifest=manifest, sample=sample, seed=seed,
                       report=report, replayed=replayed)
    return report


@dataclass(frozen=True, slots=True)
class _Sampled:
    """A board's sampled entries and their ledger values as of the watermark (value, region)."""

    entries: list[Entry]
    ledger: dict[str, tuple[IndexValue | None, str]]
    unreadable: list[str]


def _ledger_checks(*, r: redis.Redis, keys: rankview.Keys, season: Season, manifest: Manifest, sample: int,
                   seed: int | None, report: Report, replayed: Collection[str] | None) -> None:
    """`replayed` None: every check, the per-bucket checksums recomputed from every row;
    else a recovery's (recovery_reconcile): per-bucket counts, and the replayed players."""
    # The ledger keeps moving while a version stands still: compare with the ledger as of
    # the version's watermark (a recovery under sustained writes must still publish).
    ties = manifest.ties
    regions = list(manifest.regions)
    boards = version_boards(manifest)
    moves = ledger_moved_since(season=season, watermark=manifest.watermark, ties=ties, regions=bool(regions))
    reader = rankview.RankReader(r, keys, deadline=3600)
    # The values whose ranks are checked are read first, so the histograms are counted for
    # them in one pass over the ledger and never held whole.
    tops = {board.board: ledger_top(season=season, limit=100, moved=moves.on_board(board.board), ties=ties,
                                    region=board.board) for board in boards}
    sampled = {board.board: _ledger_sampled(reader=reader, season=season, board=board, moves=moves,
                                            sample=board_sample(sample, board=board, regions=len(regions)),
                                            seed=seed) for board in boards}
    queries = {name: [value for _, value in tops[name]]
               + [value for value, _ in sampled[name].ledger.values() if value is not None] for name in tops}
    histograms = ledger_histograms(season=season, ties=ties, moves=moves, boards=boards, queries=queries)
    ledger_boards = (ledger_bucket_checksums(season=season, manifest=manifest, moves=moves)
                     if replayed is None else None)
    for board in boards:
        name = board.board
        histogram = histograms[name]
        report.add(
            board_check("player_count", name),
            histogram.total == board.total,
            f"ledger {histogram.total}, version {board.total} (difference {board.total - histogram.total})",
        )
        report.add(board_check("bucket_count_sum", name), sum(board.counts) == board.total,
                   f"sum of bucket counts {sum(board.counts)}, total {board.total}")
        expected_top = [
            {"position": i + 1, "rank": histogram.higher_than(value) + 1, "player_id": p, "score": value_score(value),
             # A first_reached board's top keeps when each reached their score (a cursor's place).
             **({} if isinstance(value, int) else {"reached_ms": value[1]})}
            for i, (p, value) in enumerate(tops[name])
        ]
        report.add(board_check("top_100", name), board.top == expected_top, first_mismatch(expected_top, board.top))
        _ledger_sampled_ranks(board=board, sampled=sampled[name], histogram=histogram, report=report)
        if ledger_boards is None:
            counts = histogram.bucket_counts(board.layout)
            bad = [f"bucket {b}: ledger {counts[b]} players, version {board.counts[b]}"
                   for b in range(board.layout.size) if counts[b] != board.counts[b]]
            report.add(board_check("ledger_bucket_counts", name), not bad, "; ".join(bad[:10]))
            continue
        counts, checksums = ledger_boards[name]
        bad = [
            f"bucket {b}: ledger {counts[b]} players/{checksums[b]:016x}, "
            f"version {board.counts[b]}/{board.checksums[b]:016x}"
            for b in range(board.layout.size)
            if counts[b] != board.counts[b] or checksums[b] != board.checksums[b]
        ]
        report.add(board_check("ledger_bucket_checksums", name), not bad, "; ".join(bad[:10]))
    if replayed is not None:
        _ledger_replayed_players(r=r, keys=keys, season=season, manifest=manifest, moves=moves,
                                 players=replayed, report=report)


def _ledger_sampled(*, reader: rankview.RankReader, season: Season, board: Manifest, moves: LedgerMoves,
                    sample: int, seed: int | None) -> _Sampled:
    """Sampled entries of one board, and their players' values and regions in the ledger
    as of the watermark."""
    def entries_at(position: int) -> list[Entry] | str:
        try:
            return reader.entries_at(board, position, 1)
        except rankview.Torn:
            return f"position {position}: unreadable"

    read = sampled_reads(entries_at, stratified_positions(board.total, sample, seed=seed))
    unreadable = [found for found in read if isinstance(found, str)]
    entries = [entry for found in read if not isinstance(found, str) for entry in found]
    players = [e.player_id for e in entries]
    ledger: dict[str, tuple[IndexValue | None, str]] = {
        p: (value, region) for p, value, region in _scores(season, board.ties, players=players,
                                                           regions=bool(board.board))}
    ledger.update({p: (then, moves.regions.get(p, ("", ""))[1]) for p, (_, then) in moves.values.items()})
    return _Sampled(entries=entries, ledger=ledger, unreadable=unreadable)


def _ledger_sampled_ranks(*, board: Manifest, sampled: _Sampled, histogram: ScoreHistogram, report: Report) -> None:
    """Sampled entries of one board against the ledger as of the watermark: the score, on a
    regional board the player's region, and the rank as 1 + count(ahead) on that board."""
    wrong = list(sampled.unreadable)
    for entry in sampled.entries:
        value, region = sampled.ledger.get(entry.player_id, (None, ""))
        if value is None or value_score(value) != entry.score:
            wrong.append(f"{entry.player_id}: version score {entry.score}, ledger {value}")
            continue
        if board.board and region != board.board:
            wrong.append(f"{entry.player_id}: on the board of {board.board}, ledger region {region or 'none'}")
            continue
        # With the tie rule: 1 + the players with a higher score or the same one reached earlier.
        ledger_rank = histogram.higher_than(value) + 1
        if ledger_rank != entry.rank:
            wrong.append(f"{entry.player_id}: version rank {entry.rank}, ledger 1 + count(higher) = {ledger_rank}")
    report.add(board_check("ledger_sampled_ranks", board.board), not wrong,
               f"{len(sampled.entries)} sampled; " + "; ".join(wrong[:10]))


# Replayed players read from the ledger per query, and their checks sent per round trip.
REPLAYED_BATCH = 10_000


def _ledger_replayed_players(*, r: redis.Redis, keys: rankview.Keys, season: Season, manifest: Manifest,
                             moves: LedgerMoves, players: Collection[str], report: Report) -> None:
    """Each player a recovery's catch-up replayed, against the ledger as of the watermark,
    one by one: the lookup's value, the member in the bucket of that value (by its sort
    key), and with regions the region-shard entry and the member on their region's board.
    Theirs are the values the copy did not take from the build's read of the table."""
    ties = manifest.ties
    boards = manifest.regions
    wanted = sorted(set(players))
    ledger: dict[str, tuple[IndexValue | None, str]] = {}
    for start in range(0, len(wanted), REPLAYED_BATCH):
        ledger.update({p: (value, region) for p, value, region in _scores(
            season, ties, players=wanted[start:start + REPLAYED_BATCH], regions=bool(boards))})
    expected = {p: ledger.get(p, (None, "")) for p in wanted}
    expected.update({p: (then, moves.regions.get(p, ("", ""))[1])
                     for p, (_, then) in moves.values.items() if p in expected})
    # Each check's commands: one read, or (a key in a bucket) one per name of the player's
    # entry, as the version's side sees the bucket.
    commands: list[list[tuple[Any, ...]]] = []
    checks: list[tuple[str, str, str, int | str | None]] = []  # (board, player, what, ledger's)
    on_board = dict.fromkeys(("", *boards), 0)
    layout_id, side = manifest.layout.layout_id, manifest.side
    for player_id, (value, region) in expected.items():
        shard = rankview.lookup_shard(player_id, manifest.lookup_shards)
        commands.append([("HGET", keys.lookup(manifest.index, shard, groups=manifest.groups), player_id)])
        checks.append(("", player_id, "lookup", None if value is None else value_token(value)))
        on_board[""] += 1
        board = region if value is not None and region in boards else None
        if value is not None:
            bucket, key = index_key(manifest.layout, ties, value)
            for name in ("", board) if board else ("",):
                bucket_key = keys.bucket(manifest.index, layout_id, bucket, name, groups=manifest.groups)
                hidden = keys.hidden(manifest.index, side, layout_id, bucket, name, groups=manifest.groups)
                commands.append([seen_key_call(bucket=bucket_key, hidden=hidden, name=entry)
                                 for entry in (player_id, entry_name(player_id, True))])
                checks.append((name, player_id, f"key in bucket {bucket}", key))
        if boards:
            commands.append([("HGET", keys.region(manifest.index, shard, groups=manifest.groups), player_id)])
            checks.append((board or "", player_id, "region shard", board))
            on_board[board or ""] += bool(board)
    wrong: dict[str, list[str]] = {}
    for start in range(0, len(commands), REPLAYED_BATCH):
        batch = commands[start:start + REPLAYED_BATCH]
        flat = rankview.round_trip(r, [command for reads in batch for command in reads])
        at = 0
        for (board, player_id, what, want), reads in zip(checks[start:start + REPLAYED_BATCH], batch, strict=True):
            replies, at = flat[at:at + len(reads)], at + len(reads)
            got = _replayed_reply(what, replies, ties, side)
            if got != want:
                wrong.setdefault(board, []).append(f"{player_id}: {what} {got!r}, ledger {want!r}")
    for board, count in on_board.items():
        found = wrong.get(board, [])
        report.add(board_check("ledger_replayed_players", board), not found,
                   f"{count} replayed players; " + "; ".join(found[:10]))


def _replayed_reply(what: str, replies: list[Any], ties: FirstReached | None, side: int
                    ) -> int | float | str | None:
    """What a check's replies say: a lookup's or region shard's value as `side` sees it, or
    the key of the player's entry `side` sees in the bucket (either of its names)."""
    if what in ("lookup", "region shard"):
        seen = lookup_seen(replies[0], side)
        if seen is None:
            return None
        return value_token(lookup_value(ties, seen.value)) if what == "lookup" else seen.value
    keys = [float(reply) for reply in replies if reply is not None]
    # A member's sort key (an integer below 2**53: exact as a float); both names seen
    # would be a broken index, shown as both keys.
    return keys[0] if len(keys) == 1 else (None if not keys else str(keys))


def reconciliation_run(*, season: Season, full: bool | None = None, sample: int | None = None) -> ReconciliationRun:
    """The continuous reconciliation: invariants of the current version, and its scores against the ledger.

    The ledger moves on while the version stands still, so a sampled player is compared
    only when the change stream has nothing newer for them than the version's watermark.
    """
    from leaderboard.metrics.counters import metrics_failure_count
    from leaderboard.views.season_index import season_keys

    full = settings.RECONCILE_FULL if full is None else full
    sample = settings.RECONCILE_SAMPLE_SIZE if sample is None else sample
    started = time.monotonic()
    started_at = timezone.now()
    r = redis_get()
    keys = season_keys(season)
    report = version_check(r=r, keys=keys, sample=sample, full=full)
    manifest = rankview.manifest_get(r, keys, report.version) if report.version else None
    if manifest is not None and report.ok:
        _ledger_spot_check(r=r, keys=keys, season=season, manifest=manifest, sample=sample, report=report)
    run = ReconciliationRun.objects.create(
        season=season, version=report.version, mode="full" if full else "sampled", ok=report.ok,
        findings=report.as_dict()["findings"], started_at=started_at,
        duration_ms=(time.monotonic() - started) * 1000,
    )
    if not report.ok:
        metrics_failure_count(season_slug=season.slug, kind="reconciliation")
        if any(f.check.endswith("checksums") for f in report.failures()):
            metrics_failure_count(season_slug=season.slug, kind="checksum")
    return run


def _entry_at(reader: rankview.RankReader, board: Manifest, position: int) -> list[Entry]:
    return reader.entries_at(board, position, 1)


def _ledger_spot_check(*, r: redis.Redis, keys: rankview.Keys, season: Season, manifest: Manifest, sample: int,
                       report: Report) -> None:
    """Sampled entries of each board against the ledger's current scores (and on a regional
    board the player's region), for the players the stream has nothing newer for."""
    reader = rankview.RankReader(r, keys, deadline=3600)
    sampled: list[tuple[Manifest, list[Entry]]] = []
    for board in version_boards(manifest):
        positions = stratified_positions(board.total, board_sample(sample, board=board, regions=len(manifest.regions)))
        read = sampled_reads(partial(_entry_at, reader, board), positions)
        sampled.append((board, [entry for entries in read for entry in entries]))
    players = list({e.player_id for _, entries in sampled for e in entries})
    moved: set[str] = set()
    ledger: dict[str, tuple[int, str]] = {}
    for alias, names in ledger_players_group(season=season, player_ids=players).items():
        # Scores first, then the changes after the version: a batch committing between the
        # two reads lands in `moved` and is left out, instead of reading as a wrong score
        # (these are separate statements, not one snapshot).
        ledger.update((p, (score, region)) for p, score, region in PlayerScore.objects.using(alias).filter(
            season_id=season.pk, player_id__in=names, hidden=False).values_list("player_id", "score", "region"))
        moved.update(ScoreChange.objects.using(alias).filter(season_id=season.pk, player_id__in=names)
                     .filter(changes_after_q(manifest.watermark)).values_list("player_id", flat=True))
    # On a first_reached board the reached_at of these players is checked by the rank and
    # checksum comparisons of version_reconcile; the spot check compares scores.
    for board, entries in sampled:
        compared = [e for e in entries if e.player_id not in moved]
        wrong = []
        for entry in compared:
            score, region = ledger.get(entry.player_id, (None, ""))
            # The entry holds the board's value (an asc board's: max_score - score).
            shown = board.kind.flipped(entry.score)
            if score != shown:
                wrong.append(f"{entry.player_id}: version {shown}, ledger {score}")
            elif board.board and region != board.board:
                wrong.append(f"{entry.player_id}: on the board of {board.board}, ledger region {region or 'none'}")
        report.add(board_check("ledger_scores", board.board), not wrong,
                   f"{len(compared)} players compared; " + "; ".join(wrong[:10]))
