"""Reads of a published version: pointer + lookup in one round trip, then the bucket's counts."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from leaderboard.core.epoch import bucket_place, bucket_ranges, bucket_rank
from leaderboard.core.manifest import Manifest, lookup_shards_for
from leaderboard.core.ranking import Entry, ranked, ranked_values
from leaderboard.core.shared_index import entry_name
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import (
    IndexValue,
    index_key,
    lookup_value,
    value_score,
)
from leaderboard.views.rankview.keys import (
    COPY_NAMES,
    SLOT_GROUPS,
    Keys,
    gen_field,
    lookup_shard,
    shards_of,
)
from leaderboard.views.rankview.manifests import (
    _holds,
    _latest_boards,
    _learned_copies,
    _learned_data,
    _learned_groups,
    _learned_regional,
    _learned_shards,
    _place_hints,
    copy_holds,
    manifest_get,
    pointer_get,
)
from leaderboard.views.rankview.shared import (
    ahead_call,
    lookup_seen,
    place_call,
    through_call,
    window_call,
    window_values,
)
from leaderboard.views.rankview.wire import round_trip

# ------------------------------------------------------------------------------ reads


class Unavailable(Exception):
    """No complete version can be served right now (none published, or the view is lost)."""


class VersionExpired(Exception):
    def __init__(self, current: int | None):
        super().__init__("version expired")
        self.current = current


class UnknownRegion(Exception):
    """The version has no board for the region asked for (not one of the season's regions)."""

    def __init__(self, region: str, manifest: Manifest):
        super().__init__(f"unknown region {region!r}")
        self.region = region
        self.manifest = manifest


class _Torn(Exception):
    """The copy under a read was mutated (or the read outlived its deadline): retry."""


Torn = _Torn  # for the invariant checker, which reports it instead of retrying


@dataclass(slots=True)
class Rider:
    """A command that rides along a read's first round trip (the read limit's token,
    leaderboard.ratelimit): sent before the read's own commands, so it costs no round trip
    of its own. `sent` once it went, with its raw `reply`."""

    command: tuple[Any, ...]
    sent: bool = False
    reply: Any = None


def round_trip_with(r: redis.Redis, commands: list[tuple[Any, ...]], rider: Rider | None) -> list[Any]:
    """round_trip of `commands`, with `rider` sent before them unless it went already; the
    replies of `commands` (the rider's is kept on it)."""
    if rider is None or rider.sent:
        return round_trip(r, commands)
    rider.reply, *replies = round_trip(r, [rider.command, *commands])
    rider.sent = True
    return replies


@dataclass(frozen=True, slots=True)
class PlayerView:
    manifest: Manifest
    entry: Entry | None
    total: int
    # The player's region in this version (a season with regions; None: no regional board
    # holds them, or the season has none).
    region: str | None = None
    # How many players share the entry's rank, the player among them (0 without an entry).
    tied: int = 0


@dataclass(frozen=True, slots=True)
class PlayersView:
    """Some players' scores in one version and each one's season rank: only those the
    version holds are in `scores` and `ranks`."""

    manifest: Manifest
    scores: dict[str, int]
    ranks: dict[str, int]
    # On a first_reached board: each player's reached_ms, which orders equal scores.
    reached: dict[str, int] | None = None


def _window_values(manifest: Manifest, reads: list[tuple[int, int, int]], replies: list[Any]
                   ) -> list[tuple[str, IndexValue]]:
    """The (player_id, value) of window reads' replies (shared.window_call: entry names and
    sort keys, flat), one per read range."""
    out: list[tuple[str, IndexValue]] = []
    for (bucket, _, _), reply in zip(reads, replies, strict=True):
        out += window_values(reply, layout=manifest.layout, ties=manifest.ties, bucket=bucket)
    return out


def board_entry(manifest: Manifest, player_id: str, value_raw: bytes | None, region_raw: bytes | None
                 ) -> tuple[str | None, tuple[str, str] | None]:
    """(region, (value text, entry name)) of a player in the version from their lookup and
    region-shard fields, each read as the version's side sees it; the second part is None
    when the version's board does not hold them. On a regional board the entry's name is
    the one the region shard's part names."""
    region_seen = lookup_seen(region_raw, manifest.side)
    region = region_seen.value if region_seen is not None else None
    seen = lookup_seen(value_raw, manifest.side)
    if seen is None or (manifest.board and region != manifest.board):
        return region, None
    second = region_seen.second if manifest.board and region_seen is not None else seen.second
    return region, (seen.value, entry_name(player_id, second))


class RankReader:
    """Reads of one published version. Every answer comes from exactly one manifest.

    A read takes the manifest first, does all its sub-queries against that manifest's
    copy, and checks afterwards that the copy did not move under it (a seqlock): in the
    same round trip as the data reads, after them, the `gen` of each slot group read
    (on the group's node, so Redis runs it after the group's reads; a group written
    since the version names a later generation) and the copy meta's (generation,
    version); and that it finished within its deadline. Otherwise it retries: a pinned
    version no longer current answers 410, and a version that stays torn 503.
    """

    def __init__(self, r: redis.Redis, keys: Keys, *, deadline: float, attempts: int = 3,
                 copies: tuple[str, ...] | None = None, region: str | None = None, rider: Rider | None = None):
        self.r = r
        self.rider = rider
        self.keys = keys
        self.deadline = deadline
        self.attempts = attempts
        self.copies = copies or _learned_copies.get((keys.prefix, keys.season), COPY_NAMES)
        # A regional reader: every read is on that region's board of the version
        # (Manifest.board_of), and a player of another region is not ranked on it.
        self.region = region
        # The place read sent early with the first round trip (`_place_guess`): the
        # manifest and entry it was made for and its replies, for `_player_place` to use
        # when they are its own.
        self._early: tuple[Manifest, tuple[str, str], list[Any]] | None = None
        # Reads of the answer's own (the players' names) that ride along the reader's first
        # round trip, after its commands; their replies in `also_replies` once sent.
        self.also: list[tuple[Any, ...]] = []
        self.also_replies: list[Any] | None = None
        # The last entry a window read returned, as (player_id, index value): where a page
        # that follows it starts (`after`).
        self.last: tuple[str, IndexValue] | None = None
        # The players sharing the rank of the last player placed (`_player_place`).
        self.tied = 0

    def _trip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """round_trip of `commands`; the first one of the reader also carries its rider and
        the reads in `also`."""
        also, self.also = self.also, []
        replies = round_trip_with(self.r, [*commands, *also], self.rider)
        if not also:
            return replies
        self.also_replies = replies[len(commands):]
        return replies[:len(commands)]

    # -- manifest selection
    def _manifest(self, version: int | None) -> Manifest:
        (raw,) = self._trip([("GET", self.keys.ptr)])
        return self._select(int(raw) if raw is not None else None, version)

    def _select(self, current: int | None, version: int | None) -> Manifest:
        """The manifest a read uses, given the current pointer and the version asked for:
        on a regional reader, that version's board of the region."""
        manifest = self._select_version(current, version)
        if self.region is None:
            return manifest
        board = manifest.board_of(self.region)
        if board is None:
            raise UnknownRegion(self.region, manifest)
        return board

    def _select_version(self, current: int | None, version: int | None) -> Manifest:
        if version is None:
            if current is None:
                raise Unavailable()
            manifest = manifest_get(self.r, self.keys, current)
            if manifest is None:
                raise Unavailable()
            return manifest
        if current is None:
            raise Unavailable()
        if version > current or version < 1:
            raise VersionExpired(current) from None
        manifest = manifest_get(self.r, self.keys, version)
        if manifest is None:
            raise VersionExpired(current) from None
        return manifest

    def _torn_pinned(self, version: int | None) -> None:
        """After a torn read of `version` (None: the current one): raises VersionExpired
        when the pinned version is no longer current (its copy moved on and will not hold
        it again); otherwise returns, and the read is tried again. A torn version that is
        still current (a slot group a failover left behind, a read past its deadline) has
        not expired: once the attempts are spent the read answers Unavailable (503)."""
        if version is None:
            return
        current = pointer_get(self.r, self.keys)
        if current != version:
            raise VersionExpired(current) from None

    def _validate(self, manifest: Manifest, started: float) -> None:
        if not copy_holds(self.r, self.keys, manifest):
            raise _Torn()
        if time.monotonic() - started > self.deadline:
            raise _Torn()

    # -- keys and the seqlock
    def _bucket_key(self, manifest: Manifest, bucket: int) -> str:
        return self.keys.bucket(manifest.index, manifest.layout.layout_id, bucket, manifest.board,
                                groups=manifest.groups)

    def _hidden_key(self, manifest: Manifest, bucket: int) -> str:
        return self.keys.hidden(manifest.index, manifest.side, manifest.layout.layout_id, bucket, manifest.board,
                                groups=manifest.groups)

    def _place_call(self, manifest: Manifest, bucket: int, key: int, name: str) -> tuple[Any, ...]:
        # With the tied count: the rank answer's percentile needs it, and it costs the
        # script two more counts in the same bucket. The neighbours read shares the place
        # read (and the place hint sent before the read knows which it is) and drops it.
        return place_call(bucket=self._bucket_key(manifest, bucket), hidden=self._hidden_key(manifest, bucket),
                          key=key, name=name, tied=True)

    def _ahead_call(self, manifest: Manifest, bucket: int, key: int) -> tuple[Any, ...]:
        return ahead_call(bucket=self._bucket_key(manifest, bucket), hidden=self._hidden_key(manifest, bucket),
                          key=key)

    def _bucket_group(self, manifest: Manifest, bucket: int) -> int:
        return bucket_group(bucket=bucket, groups=manifest.groups, board=manifest.board)

    def _checked(self, manifest: Manifest, commands: list[tuple[Any, ...]], groups: Iterable[int],
                 started: float | None) -> list[Any]:
        """The replies of `commands`, sent in one round trip with the seqlock's reads after
        them: the `gen` of each slot group in `groups` and the copy's (generation, version).
        Raises _Torn when the copy moved, or with `started` when the read is past its deadline."""
        replies = self._trip([*commands, *seqlock_commands(self.keys, manifest, groups)])
        if not self._seqlock_passed(manifest, replies[len(commands):], started):
            raise _Torn()
        return replies[:len(commands)]

    def _seqlock_passed(self, manifest: Manifest, replies: list[Any], started: float | None) -> bool:
        """Whether the replies of `seqlock_commands` say the copy still holds the version,
        and (with `started`) the read is within its deadline."""
        return seqlock_holds(manifest, replies) and (started is None or time.monotonic() - started <= self.deadline)

    # -- the reads
    def top(self, limit: int, version: int | None = None) -> tuple[Manifest, list[dict[str, Any]]]:
        def body(manifest: Manifest) -> list[dict[str, Any]]:
            return manifest.top[:limit]
        # The top 100 is built once per version and lives in the manifest itself: no
        # copy is read, so there is nothing to validate.
        manifest = self._manifest(version)
        return manifest, body(manifest)

    def locate(self, manifest: Manifest, player_id: str) -> tuple[IndexValue, int, int] | None:
        """(value, position, rank) of a player in this version, or None; the value is the
        score, or (score, reached_ms) on a first_reached board. Not validated: the caller
        checks the copy still holds the version."""
        shard = lookup_shard(player_id, manifest.lookup_shards)
        score_raw, region = round_trip(self.r, [
            ("HGET", self.keys.lookup(manifest.index, shard, groups=manifest.groups), player_id),
            ("HGET", self.keys.region(manifest.index, shard, groups=manifest.groups), player_id)])
        _, entry = board_entry(manifest, player_id, score_raw, region)
        if entry is None:
            return None
        score = lookup_value(manifest.ties, entry[0])
        bucket, sort_key = index_key(manifest.layout, manifest.ties, score)
        ((higher_in_bucket, index, _),) = round_trip(self.r, [self._place_call(manifest, bucket, sort_key,
                                                                                entry[1])])
        if index is None:
            # The lookup and the index disagree: only possible mid-mutation.
            raise _Torn()
        position, rank = bucket_place(manifest.higher, bucket, index=int(index), ahead=int(higher_in_bucket))
        return score, position, rank

    def rank(self, player_id: str, version: int | None = None) -> PlayerView:
        """The player's entry in one version, in two round trips.

        The same reads and the same seqlock as `locate` + `_checked`, pipelined: (1) the
        pointer, then the player's lookup value in every copy (read after the pointer, so
        the current version's copy already held it) with its slot group's `gen`; (2)
        ZCOUNT and ZRANK in the value's bucket, then that bucket's group `gen` and the
        copy's (generation, version). On a cluster each round trip goes to every node it
        names at once (wire.round_trip).
        """
        for _ in range(self.attempts):
            try:
                manifest, score_raw, region_raw, started = self._player_lookup(player_id, version)
                return self._rank_of(manifest, player_id, score_raw, region_raw, started)
            except _Torn:
                self._torn_pinned(version)
        raise Unavailable()

    def _player_lookup(self, player_id: str, version: int | None
                       ) -> tuple[Manifest, bytes | None, bytes | None, float]:
        """The first round trip of a player's reads: the pointer, and the player's lookup
        value (and region, in a season with regions) in every copy this process has seen
        current, each in its shard and slot group by the copy's learned counts, with that
        group's `gen` after them. (manifest, value, region, when the read started); raises
        _Torn when the manifest's copy wrote the group since the version."""
        prefix, slug = season = (self.keys.prefix, self.keys.season)
        started = time.monotonic()
        regional = self.region is not None or season in _learned_regional
        copies = self.copies
        # A copy not learned yet is guessed to have a new index's fewest shards (a season
        # of fewer than ~6,000 players): a wrong guess costs one more round trip, once.
        guess = lookup_shards_for(players=0, minimum=settings.VIEW_LOOKUP_SHARDS_MIN)
        learned = [(_learned_shards.get((prefix, slug, copy), guess),
                    _learned_groups.get((prefix, slug, copy), SLOT_GROUPS),
                    *_learned_data.get((prefix, slug, copy), (copy, 0))) for copy in copies]
        # The copies are the two sides of one index: one lookup (and region) field serves
        # both, with one read of the fence's generations of the sides.
        places: dict[tuple[str, int, int], list[int]] = {}
        for count, groups, index, side in learned:
            places.setdefault((index, lookup_shard(player_id, count), groups), []).append(side)
        commands: list[tuple[Any, ...]] = [("GET", self.keys.ptr)]
        for (index, shard, groups), sides in places.items():
            commands.append(("HGET", self.keys.lookup(index, shard, groups=groups), player_id))
            if regional:
                commands.append(("HGET", self.keys.region(index, shard, groups=groups), player_id))
            commands.append(("HMGET", self.keys.fence(index, shard_group(shard=shard, groups=groups)),
                             *(gen_field(side) for side in sides)))
        hint_key = (prefix, slug, self.region, player_id)
        early = self._place_guess(hint_key) if version is None else None
        if early is None:
            raw_ptr, *replies = self._trip(commands)
        else:
            hinted, hinted_entry, early_commands = early
            raw_ptr, *replies = self._trip(commands + early_commands)
            self._early = (hinted, hinted_entry, replies[len(replies) - len(early_commands):])
        manifest = self._select(int(raw_ptr) if raw_ptr is not None else None, version)
        if version is None:
            _latest_boards[hint_key[:3]] = manifest
        shard = lookup_shard(player_id, manifest.lookup_shards)
        at = copies.index(manifest.copy) if manifest.copy in copies else None
        if at is not None and learned[at] == (manifest.lookup_shards, manifest.groups, manifest.index, manifest.side):
            place = (manifest.index, shard, manifest.groups)
            first = (2 + regional) * list(places).index(place)
            score_raw = replies[first]
            region_raw = replies[first + 1] if regional else None
            gen = replies[first + 1 + regional][places[place].index(manifest.side)]
        else:
            if at is None:
                # A rebuild published a copy under a new name: pipeline it from now on.
                copies = self.copies = (manifest.copy, *copies[:1])
                _learned_copies[season] = copies
            # Not the shard (or index, or side) this process learned for the copy (built
            # again since, or never read here): learn its counts, and the other copies'
            # from their meta in the same round trip.
            others = [copy for copy in copies if copy != manifest.copy]
            score_raw, region_raw, gen, *counts = round_trip(self.r, [
                ("HGET", self.keys.lookup(manifest.index, shard, groups=manifest.groups), player_id),
                ("HGET", self.keys.region(manifest.index, shard, groups=manifest.groups), player_id),
                ("HGET", self.keys.fence(manifest.index, shard_group(shard=shard, groups=manifest.groups)),
                 gen_field(manifest.side)),
                *(("HMGET", self.keys.copy_meta(copy), "lookup_shards", "groups", "index", "side") for copy in others)])
            regional = True
            _learned_shards[(prefix, slug, manifest.copy)] = manifest.lookup_shards
            _learned_groups[(prefix, slug, manifest.copy)] = manifest.groups
            _learned_data[(prefix, slug, manifest.copy)] = (manifest.index, manifest.side)
            for copy, (count, groups, index, side) in zip(others, counts, strict=True):
                if count is not None:
                    _learned_shards[(prefix, slug, copy)] = int(count)
                    _learned_groups[(prefix, slug, copy)] = int(groups) if groups is not None else SLOT_GROUPS
                    _learned_data[(prefix, slug, copy)] = (index.decode() if index is not None else copy,
                                                           int(side) if side is not None else 0)
        if not groups_hold(manifest, [gen]):
            raise _Torn()
        if not regional and manifest.regions:
            # The first read of a season with regions in this process: from now on the
            # region comes with the lookup.
            region_raw = round_trip(self.r, [
                ("HGET", self.keys.region(manifest.index, shard, groups=manifest.groups), player_id)])[0]
            _learned_regional.add(season)
        _place_hints.keep(hint_key, (score_raw, region_raw))
        return manifest, score_raw, region_raw, started

    def _place_guess(self, hint_key: tuple[str, str, str | None, str]
                     ) -> tuple[Manifest, tuple[str, str], list[tuple[Any, ...]]] | None:
        """The place read `_player_place` would send for the player if their lookup and the
        version are what the last read of them found, to send in the first round trip:
        (manifest, entry, the place read with its seqlock's reads)."""
        hint = _place_hints.get(hint_key)
        manifest = _latest_boards.get(hint_key[:3])
        if hint is None or manifest is None:
            return None
        _, on_board = board_entry(manifest, hint_key[3], *hint)
        if on_board is None:
            return None
        bucket, sort_key = index_key(manifest.layout, manifest.ties, lookup_value(manifest.ties, on_board[0]))
        return manifest, on_board, [self._place_call(manifest, bucket, sort_key, on_board[1]),
                                    *seqlock_commands(self.keys, manifest, [self._bucket_group(manifest, bucket)])]

    def _player_place(self, manifest: Manifest, entry: tuple[str, str], started: float
                      ) -> tuple[IndexValue, int, int, int, int]:
        """The second round trip of a player's reads: the place of their entry (value text,
        entry name) in the bucket of its value as the version's side sees it (its count
        ahead and position), checked. (value, bucket, position, rank, tied: the players
        sharing the rank, the player among them)."""
        value = lookup_value(manifest.ties, entry[0])
        bucket, sort_key = index_key(manifest.layout, manifest.ties, value)
        early, self._early = self._early, None
        if (early is not None and early[0] is manifest and early[1] == entry
                and self._seqlock_passed(manifest, early[2][1:], started)):
            # Sent with the lookup, after the pointer, for this very entry and version.
            higher_in_bucket, index, tied = early[2][0]
        else:
            ((higher_in_bucket, index, tied),) = self._checked(
                manifest, [self._place_call(manifest, bucket, sort_key, entry[1])],
                [self._bucket_group(manifest, bucket)], started)
        if index is None:
            # The lookup and the index disagree: only possible mid-mutation.
            raise _Torn()
        position, rank = bucket_place(manifest.higher, bucket, index=int(index), ahead=int(higher_in_bucket))
        self.tied = int(tied)
        return value, bucket, position, rank, self.tied

    def _rank_of(self, manifest: Manifest, player_id: str, score_raw: bytes | None, region_raw: bytes | None,
                 started: float) -> PlayerView:
        region, on_board = board_entry(manifest, player_id, score_raw, region_raw)
        if on_board is None:
            self._validate(manifest, started)
            return PlayerView(manifest=manifest, entry=None, total=manifest.total, region=region)
        value, _, position, rank, tied = self._player_place(manifest, on_board, started)
        entry = Entry(position=position, rank=rank, player_id=player_id, score=value_score(value))
        return PlayerView(manifest=manifest, entry=entry, total=manifest.total, region=region, tied=tied)

    def players(self, player_ids: Iterable[str], version: int | None = None) -> PlayersView:
        """Scores and season ranks of a set of players (a friends board) in one version.

        Two round trips after the pointer, whatever the number of players: (1) one HMGET
        per lookup shard holding some of them; (2) one ZCOUNT per distinct score in its
        bucket (the season rank is the manifest's count above that bucket + 1 + the higher
        scores in it); each checked as `_checked` does, so every score and rank comes from
        the one version. Nothing is kept per player: the cost is this request's, never a
        score change's.
        """
        wanted = list(dict.fromkeys(player_ids))
        for _ in range(self.attempts):
            manifest = self._manifest(version)
            # By shard of the manifest's copy, whose count can differ from another copy's.
            groups = list(shards_of(wanted, manifest.lookup_shards).items())
            started = time.monotonic()
            try:
                return self._players_of(manifest, groups, started)
            except _Torn:
                self._torn_pinned(version)
        raise Unavailable()

    def _players_of(self, manifest: Manifest, shards: list[tuple[int, list[str]]], started: float) -> PlayersView:
        ties, side = manifest.ties, manifest.side
        values: dict[str, IndexValue] = {}
        if shards:
            replies = self._checked(
                manifest, [("HMGET", self.keys.lookup(manifest.index, shard, groups=manifest.groups), *ids)
                           for shard, ids in shards],
                [shard_group(shard=shard, groups=manifest.groups) for shard, _ in shards], None)
            for (_, ids), reply in zip(shards, replies, strict=True):
                for player_id, raw in zip(ids, reply, strict=True):
                    seen = lookup_seen(raw, side)
                    if seen is not None:
                        values[player_id] = lookup_value(ties, seen.value)
        # A season rank depends on the value alone (the score, or the score and when it
        # was reached): one ZCOUNT per distinct value.
        distinct = [(value, *index_key(manifest.layout, ties, value)) for value in set(values.values())]
        higher = self._checked(
            manifest,
            [self._ahead_call(manifest, bucket, key) for _, bucket, key in distinct],
            [self._bucket_group(manifest, bucket) for _, bucket, _ in distinct], started)
        rank_of = {value: bucket_rank(manifest.higher, bucket, int(reply[0]))
                   for (value, bucket, _), reply in zip(distinct, higher, strict=True)}
        ranks = {player_id: rank_of[value] for player_id, value in values.items()}
        if ties is None:
            return PlayersView(manifest=manifest, scores=values, ranks=ranks)  # type: ignore[arg-type]
        return PlayersView(manifest=manifest, scores={p: value_score(v) for p, v in values.items()}, ranks=ranks,
                           reached={p: v[1] for p, v in values.items() if not isinstance(v, int)})

    def entries_at(self, manifest: Manifest, first: int, limit: int,
                   known: tuple[int, IndexValue, int] | None = None) -> list[Entry]:
        """Entries at positions first..first+limit-1; `known` = (position, value, rank) of one
        of them. Not validated: the caller checks the copy still holds the version."""
        return self._entries(manifest, first, limit, known, None)

    def _window_trip(self, manifest: Manifest, commands: list[tuple[Any, ...]], buckets: Iterable[int],
                     started: float | None) -> list[Any]:
        """One round trip of a window's reads: checked with `started`, else as they come."""
        if started is None:
            return round_trip(self.r, commands)
        return self._checked(manifest, commands, [self._bucket_group(manifest, b) for b in buckets], started)

    def _entries(self, manifest: Manifest, first: int, limit: int, known: tuple[int, IndexValue, int] | None,
                 started: float | None) -> list[Entry]:
        """`entries_at`, and with `started` validated in the same round trip as its reads
        (`_checked`).

        One member more is read above the window: when it differs from the first entry,
        that entry's rank is its position, and no ZCOUNT is needed; only a first entry
        tied with players above the window (and not the known player's value) costs one
        more round trip."""
        self.last = None
        if limit <= 0 or first > manifest.total:
            if started is not None:
                self._validate(manifest, started)
            return []
        start = first - 1 if first > 1 else first
        reads = bucket_ranges(manifest.counts, start, limit + first - start)
        replies = self._window_trip(manifest, [window_call(bucket=self._bucket_key(manifest, b),
                                                           hidden=self._hidden_key(manifest, b), start=low,
                                                           count=high - low + 1)
                                               for b, low, high in reads], [b for b, _, _ in reads], started)
        values = _window_values(manifest, reads, replies)
        if len(values) != min(limit + first - start, manifest.total - start + 1):
            raise _Torn()
        self.last = values[-1]
        rank_of_first: int | None = 1
        if start < first:
            above, values = values[0], values[1:]
            if above[1] != values[0][1]:
                rank_of_first = first
            elif known is not None and known[1] == values[0][1]:
                rank_of_first = known[2]
            else:
                rank_of_first = None
        if rank_of_first is None:
            b, sort_key = index_key(manifest.layout, manifest.ties, values[0][1])
            ((higher, _),) = self._window_trip(manifest, [self._ahead_call(manifest, b, sort_key)], [b], started)
            rank_of_first = bucket_rank(manifest.higher, b, int(higher))
        if manifest.ties is None:
            return ranked(values, first_position=first, rank_of_first=rank_of_first)  # type: ignore[arg-type]
        return ranked_values(values, first_position=first, rank_of_first=rank_of_first)

    def window(self, from_position: int, limit: int, version: int | None = None) -> tuple[Manifest, list[Entry]]:
        """Two round trips: the pointer, then the window's ranges with the seqlock's reads."""
        for _ in range(self.attempts):
            manifest = self._manifest(version)
            try:
                return manifest, self._entries(manifest, from_position, limit, None, time.monotonic())
            except _Torn:
                self._torn_pinned(version)
        raise Unavailable()

    def after(self, value: IndexValue, player_id: str, limit: int) -> tuple[Manifest, list[Entry]]:
        """Up to `limit` entries of the current version after (value, player_id) in display
        order: a keyset page, whatever version the key came from. Three round trips: the
        pointer, the count at or ahead of the key in its bucket (checked), then the window's
        ranges (checked). A player at the key counts as at it under either entry name."""
        for _ in range(self.attempts):
            manifest = self._manifest(None)
            started = time.monotonic()
            try:
                bucket, key = index_key(manifest.layout, manifest.ties, value)
                (through,) = self._checked(
                    manifest, [through_call(bucket=self._bucket_key(manifest, bucket),
                                            hidden=self._hidden_key(manifest, bucket), key=key,
                                            name=entry_name(player_id, True))],
                    [self._bucket_group(manifest, bucket)], started)
                first = manifest.higher[bucket] + int(through) + 1
                return manifest, self._entries(manifest, first, limit, None, started)
            except _Torn:
                pass
        raise Unavailable()

    def neighbors(
        self, player_id: str, radius: int, version: int | None = None
    ) -> tuple[Manifest, Entry | None, list[Entry]]:
        """The player's entry and the entries `radius` positions around it, in three round
        trips: the pointer with the player's lookup (as `rank`), ZCOUNT and ZRANK in their
        bucket, then the window's ranges, each checked."""
        for _ in range(self.attempts):
            try:
                manifest, score_raw, region_raw, started = self._player_lookup(player_id, version)
                _, on_board = board_entry(manifest, player_id, score_raw, region_raw)
                if on_board is None:
                    self._validate(manifest, started)
                    return manifest, None, []
                value, _, position, rank, _ = self._player_place(manifest, on_board, started)
                first = max(1, position - radius)
                entries = self._entries(manifest, first, position + radius - first + 1, (position, value, rank),
                                        started)
                return manifest, Entry(position=position, rank=rank, player_id=player_id,
                                       score=value_score(value)), entries
            except _Torn:
                self._torn_pinned(version)
        raise Unavailable()


def seqlock_commands(keys: Keys, manifest: Manifest, groups: Iterable[int]) -> list[tuple[Any, ...]]:
    """The reads that close a checked round trip, after its data reads: the `gen` of each
    slot group in `groups` (on that group's node) and the copy's (generation, version)."""
    field = gen_field(manifest.side)
    fences = [("HGET", keys.fence(manifest.index, group), field) for group in dict.fromkeys(groups)]
    return [*fences, ("HMGET", keys.copy_meta(manifest.copy), "gen", "version")]


def seqlock_holds(manifest: Manifest, replies: list[Any]) -> bool:
    """Whether the replies of `seqlock_commands` say the copy still holds the version."""
    gen, held = replies[-1]
    return _holds(manifest, gen, held) and groups_hold(manifest, replies[:-1])


def groups_hold(manifest: Manifest, gens: Iterable[bytes | None]) -> bool:
    """Whether every slot group read names exactly the version's generation: finishing a
    copy stamps its generation into every group, and a mutation writes a group only
    under a newer one, so a later generation means the group was written since the
    version, and an older one (or none) that the group lost writes the version counted
    (a failover promoted a replica that never received them)."""
    return all(gen is not None and int(gen) == manifest.gen for gen in gens)


def version_holds(r: redis.Redis, keys: Keys, manifest: Manifest) -> bool:
    """Whether a published version's copy still holds it: its meta names the version, and
    every slot group names its generation (the seqlock over the whole copy), in one round
    trip (on a cluster, every node at once). A group that does not lost writes the version
    counted (a failover promoted a replica without them): readers refuse the version, so
    it is lost, not current, and a recovery build replaces it. A copy from before slot
    groups has no fences under these names, so it holds no version either."""
    replies = round_trip(r, seqlock_commands(keys, manifest, range(manifest.groups)))
    return seqlock_holds(manifest, replies)
