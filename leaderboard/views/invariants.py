"""The invariant checker (docs/rules.md, Invariants), for one published version.

Checks, against the version's own copy in Redis and on each of its boards (the global one,
and in a season with regions each region's): bucket counts and totals match the manifest;
every player appears once; members sit in their bucket's range; rank = 1 + count(score >
mine) recomputed over every bucket, independently of the manifest's prefix counts; the
lookup score equals the index score; checksums match. Across the regional boards: each
player is on at most one, the one their region-shard entry names, with the global board's
value, and the region shards hold exactly the regional boards' members. `full=True` scans
everything (O(players)); otherwise bucket counts are checked and ranks on a stratified
sample of each board, and membership, checksums and the sizes of the lookup and region
shards (a 10M-player copy has ~260,000 of each) are left to the full run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import redis

from leaderboard.core.checksum import checksum_of
from leaderboard.core.epoch import rank_after
from leaderboard.core.manifest import Manifest
from leaderboard.core.reconciliation import Report, board_check, board_sample, stratified_positions, version_boards
from leaderboard.core.tiebreak import IndexValue, index_key, lookup_value, value_score, value_token
from leaderboard.views import rankview
from leaderboard.views.rankview.reads import version_holds

# Sampled positions read at once: each costs a few round trips that mostly wait on Redis.
SAMPLE_READERS = 8
_Item = TypeVar("_Item")
_Read = TypeVar("_Read")


def sampled_reads(read: Callable[[_Item], _Read], items: Sequence[_Item]) -> list[_Read]:
    """`read` of each item, in order, SAMPLE_READERS at a time. A sampled position costs
    a few round trips, and one after the other 1,000 of them waited ~7 s on a loaded
    machine; each thread reads on a connection of its own (rankview.round_trip)."""
    if len(items) < 2:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=SAMPLE_READERS, thread_name_prefix="sampled-reads") as pool:
        return list(pool.map(read, items))


def version_check(
    *, r: redis.Redis, keys: rankview.Keys, version: int | None = None, sample: int = 1000, full: bool = False,
    seed: int | None = None,
) -> Report:
    current = rankview.pointer_get(r, keys)
    wanted = version if version is not None else current
    report = Report(version=wanted)
    if wanted is None:
        report.add("published", False, "no version is published")
        return report
    manifest = rankview.manifest_get(r, keys, wanted)
    if manifest is None:
        report.add("manifest", False, f"manifest of version {wanted} is gone")
        return report
    if not version_holds(r, keys, manifest):
        report.add("copy", False, f"copy {manifest.copy} no longer holds version {wanted} (its meta or a slot group)")
        return report

    boards = version_boards(manifest)
    _check_counts(manifest, index_sizes(r, keys, manifest, lookups=full), report)
    if full:
        index = _check_full(r, keys, manifest, report)
        if manifest.regions:
            _check_regional_full(r, keys, manifest, index, report)
    for board in boards:
        _check_sampled_ranks(r, keys, board, report, sample=board_sample(sample, board=board, regions=len(boards) - 1),
                             seed=seed)

    if not version_holds(r, keys, manifest):
        report.add("copy", False, "the copy was mutated during the check; its results are void")
    return report


def _bucket_key(keys: rankview.Keys, manifest: Manifest, bucket: int) -> str:
    return keys.bucket(manifest.copy, manifest.layout.layout_id, bucket, manifest.board, groups=manifest.groups)


@dataclass(frozen=True, slots=True)
class IndexSizes:
    """What a version's copy holds, by size: ZCARD of every bucket of each board ("" the
    global one), the players in the lookup and in the region shards (None: not counted)."""

    cards: dict[str, list[int]]
    lookup: int | None
    placed: int | None

    def bucket_problems(self, board: Manifest) -> list[str]:
        """The board's buckets whose size is not the count the manifest (or copy) says."""
        return [f"bucket {b}: {card} members, counted {board.counts[b]}"
                for b, card in enumerate(self.cards[board.board]) if card != board.counts[b]]

    def placed_problem(self, manifest: Manifest) -> str:
        """The region shards against the regional boards' total ("" when they agree or
        were not counted)."""
        regional = sum(sum(b.counts) for b in manifest.regions.values())
        if self.placed is None or self.placed == regional:
            return ""
        return f"region shards hold {self.placed} players, regional boards {regional}"


def index_sizes(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, *, lookups: bool) -> IndexSizes:
    """The sizes of every bucket of the manifest's copy in one round trip; with `lookups`,
    of its lookup and region shards too (SHARD_SCAN_BATCH shards a round trip)."""
    boards = version_boards(manifest)
    commands: list[tuple[str, ...]] = [("ZCARD", _bucket_key(keys, board, b))
                                       for board in boards for b in range(manifest.layout.size)]
    replies = [int(n) for n in rankview.round_trip(r, commands)]
    size = manifest.layout.size
    cards = {board.board: replies[i * size:(i + 1) * size] for i, board in enumerate(boards)}
    if not lookups:
        return IndexSizes(cards=cards, lookup=None, placed=None)
    lookup, placed = rankview.copy_shard_sizes(r, keys, manifest.copy, manifest.lookup_shards, groups=manifest.groups,
                                               regions=bool(manifest.regions))
    return IndexSizes(cards=cards, lookup=lookup, placed=placed)


def _check_counts(manifest: Manifest, sizes: IndexSizes, report: Report) -> None:
    for board in version_boards(manifest):
        wrong = sizes.bucket_problems(board)
        report.add(board_check("bucket_counts", board.board), not wrong, "; ".join(wrong[:10]))
        cards = sum(sizes.cards[board.board])
        if board.board:
            report.add(board_check("total_players", board.board), cards == board.total,
                       f"buckets {cards}, manifest {board.total}")
        elif sizes.lookup is None:
            report.add("total_players", manifest.total == cards, f"buckets {cards}, manifest {manifest.total}")
        else:
            report.add("total_players", sizes.lookup == manifest.total == cards,
                       f"lookup {sizes.lookup}, buckets {cards}, manifest {manifest.total}")
    if manifest.regions and sizes.placed is not None:
        problem = sizes.placed_problem(manifest)
        report.add("region_shards_total", not problem, problem)


def _scan_board(r: redis.Redis, keys: rankview.Keys, board: Manifest, report: Report) -> dict[str, int | str]:
    """Every member of a board, checked for duplicates, bucket ranges and checksums; returns
    each member's value token (the score, or "score:reached_ms" on a first_reached board)."""
    seen: Counter[str] = Counter()
    tokens: dict[str, int | str] = {}
    bad_checksums = []
    misplaced = []
    for bucket in range(board.layout.size):
        pairs = [(p, value_token(v)) for p, v in rankview.bucket_values_scan(
            r, keys, board.copy, board.layout, board.ties, bucket, board=board.board, groups=board.groups)]
        low, high = board.layout.range_of(bucket)
        for player_id, token in pairs:
            seen[player_id] += 1
            tokens[player_id] = token
            score = lookup_value(board.ties, str(token))
            if not low <= value_score(score) <= high:
                misplaced.append(f"{player_id}={token} in bucket {bucket}")
        if checksum_of(pairs) != board.checksums[bucket]:
            bad_checksums.append(bucket)
    duplicates = [p for p, n in seen.items() if n > 1]
    report.add(board_check("players_once", board.board), not duplicates,
               f"{len(duplicates)} players in several buckets: {duplicates[:10]}")
    report.add(board_check("bucket_ranges", board.board), not misplaced, "; ".join(misplaced[:10]))
    report.add(board_check("bucket_checksums", board.board), not bad_checksums,
               f"buckets with a wrong checksum: {bad_checksums[:20]}")
    return tokens


def _check_full(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, report: Report) -> dict[str, int | str]:
    """The global board's full scan and its lookup; returns each player's value token."""
    index_scores = _scan_board(r, keys, manifest, report)
    mismatched = []
    lookup_players = 0
    for raw_player, raw_score in rankview.copy_shards_scan(r, keys, manifest.copy, manifest.lookup_shards,
                                                              groups=manifest.groups):
        lookup_players += 1
        player_id = raw_player.decode()
        token = value_token(lookup_value(manifest.ties, raw_score))
        if index_scores.get(player_id) != token:
            mismatched.append(f"{player_id}: lookup {token}, index {index_scores.get(player_id)}")
    report.add("lookup_equals_index", not mismatched and lookup_players == len(index_scores),
               f"{len(mismatched)} mismatches {mismatched[:10]}; lookup {lookup_players}, index {len(index_scores)}")
    return index_scores


def _check_regional_full(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, index: dict[str, int | str],
                         report: Report) -> None:
    """Each regional board scanned like the global one, its members' values against the
    global board's; then the boards against each other and against the region shards."""
    boards_of: dict[str, list[str]] = {}
    for board in version_boards(manifest)[1:]:
        tokens = _scan_board(r, keys, board, report)
        wrong = [f"{p}: {token} here, {index.get(p)} on the global board"
                 for p, token in sorted(tokens.items()) if index.get(p) != token]
        report.add(board_check("values_equal_global", board.board), not wrong, "; ".join(wrong[:10]))
        for player_id in tokens:
            boards_of.setdefault(player_id, []).append(board.board)
    several = sorted(f"{p} on {', '.join(names)}" for p, names in boards_of.items() if len(names) > 1)
    report.add("regional_players_once", not several, f"{len(several)} players on several regional boards: "
                                                     f"{'; '.join(several[:10])}")
    shards = {raw_player.decode(): raw_region.decode() for raw_player, raw_region in rankview.copy_shards_scan(
        r, keys, manifest.copy, manifest.lookup_shards, regions=True, groups=manifest.groups)}
    # A region-shard entry exists exactly for the players on a regional board, and names it.
    wrong = [f"{p}: region shard {shards.get(p)!r}, on {boards_of.get(p, 'no regional board')}"
             for p in sorted(set(shards) | set(boards_of)) if [shards.get(p)] != boards_of.get(p)]
    report.add("region_shards_equal_boards", not wrong, f"{len(wrong)} players; " + "; ".join(wrong[:10]))


def _key_in(manifest: Manifest, bucket: int, value: IndexValue) -> int | str:
    """The sort key in `bucket` below which every member ranks ahead of `value`: in the
    value's own bucket its key; buckets above hold only higher scores (all ahead), buckets
    below only lower ones (none ahead)."""
    own, key = index_key(manifest.layout, manifest.ties, value)
    if manifest.ties is None or bucket == own:
        return key
    return "+inf" if bucket > own else "-inf"


def _check_sampled_ranks(
    r: redis.Redis, keys: rankview.Keys, manifest: Manifest, report: Report, *, sample: int, seed: int | None
) -> None:
    """Ranks on one board (`manifest` a board view on a regional one): the reader's, against
    1 + the members ahead counted bucket by bucket, and the reader's lookup path."""
    check = board_check("sampled_ranks", manifest.board)
    positions = stratified_positions(manifest.total, sample, seed=seed)
    if not positions:
        report.add(check, True, "empty board")
        return
    reader = rankview.RankReader(r, keys, deadline=3600)

    def problems_at(position: int) -> list[str]:
        try:
            entries = reader.entries_at(manifest, position, 1)
        except rankview.Torn:
            # The index holds fewer members where the bucket counts put this position.
            return [f"position {position}: the index disagrees with the bucket counts"]
        if not entries:
            return [f"position {position}: no entry"]
        entry = entries[0]
        lookup = r.hget(keys.lookup_of(manifest.copy, entry.player_id, manifest.lookup_shards,
                                       groups=manifest.groups), entry.player_id)
        value = lookup_value(manifest.ties, lookup) if lookup is not None else None
        if value is None or value_score(value) != entry.score:
            return [f"{entry.player_id}: lookup {lookup!r}, index {entry.score}"]
        wrong = []
        # Players ahead in every bucket, bucket by bucket: those with a higher score, or (on
        # a first_reached board) the same score reached earlier; never the manifest's counts.
        replies = rankview.round_trip(r, [("ZCOUNT", _bucket_key(keys, manifest, bucket), "-inf",
                                           f"({_key_in(manifest, bucket, value)}")
                                          for bucket in range(manifest.layout.size)])
        brute_rank = rank_after(sum(int(n) for n in replies))
        if brute_rank != entry.rank:
            wrong.append(f"{entry.player_id} at {position}: rank {entry.rank}, 1+count(higher) = {brute_rank}")
        try:
            # On a regional board also the region shard: a player it sends elsewhere is not located.
            located = reader.locate(manifest, entry.player_id)
        except rankview.Torn:
            located = None  # the lookup sends the player to a bucket that does not hold it
        if located is None or located[1] != position or located[2] != entry.rank:
            wrong.append(f"{entry.player_id}: window says ({position}, {entry.rank}), lookup path says {located}")
        return wrong

    wrong = [problem for found in sampled_reads(problems_at, positions) for problem in found]
    report.add(check, not wrong, f"{len(positions)} sampled; " + "; ".join(wrong[:10]))
