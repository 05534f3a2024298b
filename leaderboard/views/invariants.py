"""The invariant checker (docs/rules.md, Invariants), for one published version.

Checks, against the version's own copy in Redis and on each of its boards (the global one,
and in a season with regions each region's): bucket counts and totals match the manifest;
every player appears once; members sit in their bucket's range; rank = 1 + count(score >
mine) recomputed over every bucket, independently of the manifest's prefix counts; the
lookup score equals the index score; checksums match. Across the regional boards: each
player is on at most one, the one their region-shard entry names, with the global board's
value, and the region shards hold exactly the regional boards' members. `full=True` scans
everything (O(players) time, a chunk of members in memory: each member is checked
against its lookup and region-shard entries as it is read, and the sizes of the lookup
and region shards against the members counted); otherwise bucket counts are checked and ranks on a stratified
sample of each board, and membership, checksums and the sizes of the lookup and region
shards (a 10M-player copy has ~260,000 of each) are left to the full run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, TypeVar

import redis

from leaderboard.core.checksum import MODULUS, checksum_of
from leaderboard.core.epoch import rank_after
from leaderboard.core.manifest import Manifest
from leaderboard.core.reconciliation import Report, board_check, board_sample, stratified_positions, version_boards
from leaderboard.core.shared_index import entry_name
from leaderboard.core.tiebreak import IndexValue, index_key, lookup_value, value_score, value_token
from leaderboard.views import rankview
from leaderboard.views.rankview.copies import hidden_keys_of
from leaderboard.views.rankview.reads import version_holds
from leaderboard.views.rankview.shared import ahead_call, lookup_seen, seen_card_call, seen_key_call

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
    sizes = index_sizes(r, keys, manifest, lookups=full)
    _check_counts(manifest, sizes, report)
    if full:
        _check_full(r, keys, manifest, sizes, report)
        if manifest.regions:
            _check_regional_full(r, keys, manifest, sizes, report)
    for board in boards:
        _check_sampled_ranks(r, keys, board, report, sample=board_sample(sample, board=board, regions=len(boards) - 1),
                             seed=seed)

    if not version_holds(r, keys, manifest):
        report.add("copy", False, "the copy was mutated during the check; its results are void")
    return report


def _bucket_key(keys: rankview.Keys, manifest: Manifest, bucket: int) -> str:
    return keys.bucket(manifest.index, manifest.layout.layout_id, bucket, manifest.board, groups=manifest.groups)


def _hidden_key(keys: rankview.Keys, manifest: Manifest, bucket: int) -> str:
    return keys.hidden(manifest.index, manifest.side, manifest.layout.layout_id, bucket, manifest.board,
                       groups=manifest.groups)


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
    """The sizes of every bucket of the manifest's copy in one round trip (the entries the
    version's side sees: ZCARD less its hidden ones); with `lookups`, of its lookup and
    region shards too (SHARD_SCAN_BATCH shards a round trip)."""
    boards = version_boards(manifest)
    replies = [int(n) for n in rankview.round_trip(r, [
        seen_card_call(bucket=_bucket_key(keys, board, b), hidden=_hidden_key(keys, board, b))
        for board in boards for b in range(manifest.layout.size)])]
    size = manifest.layout.size
    cards = {board.board: replies[i * size:(i + 1) * size] for i, board in enumerate(boards)}
    if not lookups:
        return IndexSizes(cards=cards, lookup=None, placed=None)
    lookup, placed = rankview.copy_shard_sizes(
        r, keys, manifest.index, manifest.lookup_shards, groups=manifest.groups, regions=bool(manifest.regions),
        side=manifest.side, hidden=hidden_keys_of(keys, manifest.index, manifest.layout, manifest.regions,
                                                  groups=manifest.groups))
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


# Members of a board read from Redis at a time in the full scan, with their lookup and
# region-shard entries: the full check holds one chunk, never the whole board (a FINAL
# candidate of 50M players held ~190 bytes a player when it kept every member's value).
SCAN_CHUNK = 5000
# Out-of-place members (a lookup or region shard that disagrees, a value outside its
# bucket) looked for in every bucket to tell a duplicate: only a broken copy has any,
# and past this many the check reports that it did not look for the rest.
PROBE_MAX = 1000


@dataclass(slots=True)
class _BoardScan:
    """What one board's full scan found: its members, the first problems of each kind with
    their counts, and the out-of-place members to probe for duplicates."""

    members: int = 0
    wrong_value: list[str] = field(default_factory=list)
    wrong_values: int = 0
    wrong_region: list[str] = field(default_factory=list)
    wrong_regions: int = 0
    suspects: dict[str, None] = field(default_factory=dict)
    unprobed: int = 0

    def suspect(self, player_id: str) -> None:
        if player_id in self.suspects:
            return
        if len(self.suspects) < PROBE_MAX:
            self.suspects[player_id] = None
        else:
            self.unprobed += 1


def _entries_get(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, players: list[str], *, regions: bool
                 ) -> list[str | None]:
    """Each player's lookup entry (`regions`: region-shard entry) in the manifest's copy as
    its side sees it, in the order of `players`: one HMGET per shard holding some of them,
    in one round trip."""
    key_of = keys.region if regions else keys.lookup
    by_shard = rankview.shards_of(players, manifest.lookup_shards)
    replies = rankview.round_trip(r, [("HMGET", key_of(manifest.index, shard, groups=manifest.groups), *names)
                                      for shard, names in by_shard.items()])
    found = {p: seen.value if (seen := lookup_seen(v, manifest.side)) is not None else None
             for (_, names), values in zip(by_shard.items(), replies, strict=True)
             for p, v in zip(names, values, strict=True)}
    return [found[p] for p in players]


def _scan_board(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, board: Manifest, report: Report
                ) -> _BoardScan:
    """Every member of a board, SCAN_CHUNK at a time: bucket ranges and checksums, and each
    member's value against its lookup entry (on a regional board also its region-shard
    entry against the board). Duplicates are found without holding the board: a player in
    two buckets has a value outside one of them or differing from its lookup there, and
    such members are then looked for in every bucket (`_duplicates`)."""
    scan = _BoardScan()
    bad_checksums = []
    misplaced = []
    for bucket in range(board.layout.size):
        low, high = board.layout.range_of(bucket)
        checksum = 0
        members = rankview.bucket_values_scan(r, keys, board.index, board.layout, board.ties, bucket,
                                              batch=SCAN_CHUNK, board=board.board, groups=board.groups,
                                              side=board.side)
        while chunk := [(p, value_token(v), value_score(v)) for p, v in islice(members, SCAN_CHUNK)]:
            players = [p for p, _, _ in chunk]
            checksum = (checksum + checksum_of((p, token) for p, token, _ in chunk)) % MODULUS
            lookups = _entries_get(r, keys, manifest, players, regions=False)
            shards = _entries_get(r, keys, manifest, players, regions=True) if board.board else None
            for i, (player_id, token, score) in enumerate(chunk):
                scan.members += 1
                if not low <= score <= high:
                    misplaced.append(f"{player_id}={token} in bucket {bucket}")
                    scan.suspect(player_id)
                raw = lookups[i]
                lookup = None if raw is None else value_token(lookup_value(board.ties, raw))
                if lookup != token:
                    scan.wrong_values += 1
                    if len(scan.wrong_value) < 10:
                        scan.wrong_value.append(f"{player_id}: lookup {lookup}, index {token}")
                    scan.suspect(player_id)
                if shards is not None:
                    entry = shards[i]
                    region = entry
                    if region != board.board:
                        scan.wrong_regions += 1
                        if len(scan.wrong_region) < 10:
                            scan.wrong_region.append(f"{player_id}: region shard {region!r}, on {board.board}")
                        scan.suspect(player_id)
        if checksum != board.checksums[bucket]:
            bad_checksums.append(bucket)
    duplicates = [p for p, places in _places(r, keys, [board], list(scan.suspects)).items() if len(places) > 1]
    unprobed = f"; {scan.unprobed} more out-of-place members not looked for" if scan.unprobed else ""
    report.add(board_check("players_once", board.board), not duplicates and not scan.unprobed,
               f"{len(duplicates)} players in several buckets: {duplicates[:10]}{unprobed}")
    report.add(board_check("bucket_ranges", board.board), not misplaced, "; ".join(misplaced[:10]))
    report.add(board_check("bucket_checksums", board.board), not bad_checksums,
               f"buckets with a wrong checksum: {bad_checksums[:20]}")
    return scan


def _places(r: redis.Redis, keys: rankview.Keys, boards: list[Manifest], players: list[str]
            ) -> dict[str, list[str]]:
    """The boards ("" the global one) of every bucket of `boards` that holds each of
    `players`, looked for in every bucket (PROBE_MAX players at most: only a broken copy
    has any)."""
    places = [(board, bucket) for board in boards for bucket in range(board.layout.size)]
    step = max(1, SCAN_CHUNK // max(1, len(places)))
    found: dict[str, list[str]] = {}
    for start in range(0, len(players), step):
        batch = players[start:start + step]
        # Either of the player's entries, as the version's side sees the bucket.
        replies = rankview.round_trip(r, [seen_key_call(bucket=_bucket_key(keys, board, bucket),
                                                        hidden=_hidden_key(keys, board, bucket), name=name)
                                          for p in batch for board, bucket in places
                                          for name in (p, entry_name(p, True))])
        for i, player_id in enumerate(batch):
            held = replies[2 * i * len(places):2 * (i + 1) * len(places)]
            found[player_id] = [board.board for (board, _), first, second
                                in zip(places, held[::2], held[1::2], strict=True)
                                if first is not None or second is not None]
    return found


def _check_full(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, sizes: IndexSizes, report: Report) -> None:
    """The global board's full scan, each member against its lookup entry; with the
    lookup's size equal to the members' count (and no duplicates), the lookup and the
    index hold the same players with the same values."""
    scan = _scan_board(r, keys, manifest, manifest, report)
    report.add("lookup_equals_index", not scan.wrong_values and sizes.lookup == scan.members,
               f"{scan.wrong_values} mismatches {scan.wrong_value}; lookup {sizes.lookup}, index {scan.members}")


def _check_regional_full(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, sizes: IndexSizes,
                         report: Report) -> None:
    """Each regional board scanned like the global one, its members' values against the
    lookup (the global board's, which lookup_equals_index compares) and their region-shard
    entries against the board; then the boards against each other (members out of place
    looked for on every regional board) and the region shards' size against the members'."""
    regional = version_boards(manifest)[1:]
    suspects: dict[str, None] = {}
    unprobed = 0
    members = wrong_regions = 0
    wrong_region: list[str] = []
    for board in regional:
        scan = _scan_board(r, keys, manifest, board, report)
        report.add(board_check("values_equal_global", board.board), not scan.wrong_values,
                   "; ".join(f"{problem} (the global board's value is the lookup's)"
                             for problem in scan.wrong_value))
        members += scan.members
        wrong_regions += scan.wrong_regions
        wrong_region.extend(scan.wrong_region[:10 - len(wrong_region)])
        unprobed += scan.unprobed
        for player_id in scan.suspects:
            if player_id in suspects or len(suspects) < PROBE_MAX:
                suspects[player_id] = None
            else:
                unprobed += 1
    several = sorted(f"{p} on {', '.join(sorted(set(names)))}"
                     for p, names in _places(r, keys, regional, list(suspects)).items() if len(set(names)) > 1)
    more = f"; {unprobed} more out-of-place members not looked for" if unprobed else ""
    report.add("regional_players_once", not several and not unprobed,
               f"{len(several)} players on several regional boards: {'; '.join(several[:10])}{more}")
    # Every regional member's region-shard entry names its board, and the shards hold as
    # many entries as the boards members: the same players, each on the board named.
    report.add("region_shards_equal_boards", not wrong_regions and sizes.placed == members,
               f"{wrong_regions} players; " + "; ".join(wrong_region)
               + f"; region shards {sizes.placed}, regional boards {members}")


def _ahead_everywhere(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, value: IndexValue) -> int:
    """The entries the version's side sees ahead of `value`, counted in every bucket."""
    commands: list[tuple[Any, ...]] = []
    for bucket in range(manifest.layout.size):
        key = _key_in(manifest, bucket, value)
        if key == "+inf":
            commands.append(seen_card_call(bucket=_bucket_key(keys, manifest, bucket),
                                           hidden=_hidden_key(keys, manifest, bucket)))
        elif key != "-inf":
            commands.append(ahead_call(bucket=_bucket_key(keys, manifest, bucket),
                                       hidden=_hidden_key(keys, manifest, bucket), key=int(key)))
    # A place read's reply is (ahead, position); a count's, the count.
    return sum(int(reply[0]) if isinstance(reply, list) else int(reply) for reply in rankview.round_trip(r, commands))


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
        seen = lookup_seen(r.hget(keys.lookup_of(manifest.index, entry.player_id, manifest.lookup_shards,
                                                 groups=manifest.groups), entry.player_id), manifest.side)
        lookup = seen.value if seen is not None else None
        value = lookup_value(manifest.ties, lookup) if lookup is not None else None
        if value is None or value_score(value) != entry.score:
            return [f"{entry.player_id}: lookup {lookup!r}, index {entry.score}"]
        wrong = []
        # Players ahead in every bucket, bucket by bucket: those with a higher score, or (on
        # a first_reached board) the same score reached earlier; never the manifest's counts.
        brute_rank = rank_after(_ahead_everywhere(r, keys, manifest, value))
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
