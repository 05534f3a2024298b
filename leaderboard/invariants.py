"""The invariant checker (docs/rules.md, Invariants), for one published version.

Checks, against the version's own copy in Redis: every player appears once; the lookup
score equals the index score; rank = 1 + count(score > mine) recomputed over every
bucket, independently of the manifest's prefix counts; bucket counts and checksums match
the manifest. `full=True` scans everything (O(players)); otherwise membership and scores
are checked on a stratified sample and checksums are left to the full run.
"""

from __future__ import annotations

from collections import Counter

import redis

from leaderboard import rankview
from leaderboard.core.checksum import checksum_of
from leaderboard.core.manifest import Manifest
from leaderboard.core.reconciliation import Report, stratified_positions
from leaderboard.core.tiebreak import IndexValue, index_key, lookup_value, value_score, value_token


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
    if not rankview.copy_holds(r, keys, manifest):
        report.add("copy", False, f"copy {manifest.copy} no longer holds version {wanted}")
        return report

    _check_counts(r, keys, manifest, report)
    if full:
        _check_full(r, keys, manifest, report)
    _check_sampled_ranks(r, keys, manifest, report, sample=sample, seed=seed)

    if not rankview.copy_holds(r, keys, manifest):
        report.add("copy", False, "the copy was mutated during the check; its results are void")
    return report


def _bucket_key(keys: rankview.Keys, manifest: Manifest, bucket: int) -> str:
    return keys.bucket(manifest.copy, manifest.layout.layout_id, bucket)


def _check_counts(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, report: Report) -> None:
    with r.pipeline(transaction=False) as pipe:
        for bucket in range(manifest.layout.size):
            pipe.zcard(_bucket_key(keys, manifest, bucket))
        for shard in range(rankview.LOOKUP_SHARDS):
            pipe.hlen(keys.lookup(manifest.copy, shard))
        replies = pipe.execute()
    cards = replies[: manifest.layout.size]
    wrong = [
        f"bucket {b}: {card} members, manifest says {manifest.counts[b]}"
        for b, card in enumerate(cards)
        if card != manifest.counts[b]
    ]
    report.add("bucket_counts", not wrong, "; ".join(wrong[:10]))
    lookup_total = sum(replies[manifest.layout.size :])
    report.add(
        "total_players",
        lookup_total == manifest.total == sum(cards),
        f"lookup {lookup_total}, buckets {sum(cards)}, manifest {manifest.total}",
    )


def _check_full(r: redis.Redis, keys: rankview.Keys, manifest: Manifest, report: Report) -> None:
    seen: Counter[str] = Counter()
    index_scores: dict[str, int | str] = {}
    bad_checksums = []
    misplaced = []
    for bucket in range(manifest.layout.size):
        # (player, value token): the score, or "score:reached_ms" on a first_reached board.
        pairs = [(p, value_token(v)) for p, v in rankview.bucket_values_scan(
            r, keys, manifest.copy, manifest.layout, manifest.ties, bucket)]
        low, high = manifest.layout.range_of(bucket)
        for player_id, token in pairs:
            seen[player_id] += 1
            index_scores[player_id] = token
            score = lookup_value(manifest.ties, str(token))
            if not low <= value_score(score) <= high:
                misplaced.append(f"{player_id}={token} in bucket {bucket}")
        if checksum_of(pairs) != manifest.checksums[bucket]:
            bad_checksums.append(bucket)
    duplicates = [p for p, n in seen.items() if n > 1]
    report.add("players_once", not duplicates, f"{len(duplicates)} players in several buckets: {duplicates[:10]}")
    report.add("bucket_ranges", not misplaced, "; ".join(misplaced[:10]))
    report.add("bucket_checksums", not bad_checksums, f"buckets with a wrong checksum: {bad_checksums[:20]}")
    mismatched = []
    lookup_players = 0
    for shard in range(rankview.LOOKUP_SHARDS):
        for raw_player, raw_score in r.hscan_iter(keys.lookup(manifest.copy, shard), count=5000):
            lookup_players += 1
            player_id = raw_player.decode()
            token = value_token(lookup_value(manifest.ties, raw_score))
            if index_scores.get(player_id) != token:
                mismatched.append(f"{player_id}: lookup {token}, index {index_scores.get(player_id)}")
    report.add("lookup_equals_index", not mismatched and lookup_players == len(index_scores),
               f"{len(mismatched)} mismatches {mismatched[:10]}; lookup {lookup_players}, index {len(index_scores)}")


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
    positions = stratified_positions(manifest.total, sample, seed=seed)
    if not positions:
        report.add("sampled_ranks", True, "empty board")
        return
    reader = rankview.RankReader(r, keys, deadline=3600)
    wrong: list[str] = []
    for position in positions:
        try:
            entries = reader.entries_at(manifest, position, 1)
        except rankview.Torn:
            # The index holds fewer members where the bucket counts put this position.
            wrong.append(f"position {position}: the index disagrees with the bucket counts")
            continue
        if not entries:
            wrong.append(f"position {position}: no entry")
            continue
        entry = entries[0]
        lookup = r.hget(keys.lookup_of(manifest.copy, entry.player_id), entry.player_id)
        value = lookup_value(manifest.ties, lookup) if lookup is not None else None
        if value is None or value_score(value) != entry.score:
            wrong.append(f"{entry.player_id}: lookup {lookup!r}, index {entry.score}")
            continue
        # Players ahead in every bucket, bucket by bucket: those with a higher score, or (on
        # a first_reached board) the same score reached earlier; never the manifest's counts.
        with r.pipeline(transaction=False) as pipe:
            for bucket in range(manifest.layout.size):
                pipe.zcount(_bucket_key(keys, manifest, bucket), "-inf", f"({_key_in(manifest, bucket, value)}")
            replies = pipe.execute()
        brute_rank = 1 + sum(int(n) for n in replies)
        if brute_rank != entry.rank:
            wrong.append(f"{entry.player_id} at {position}: rank {entry.rank}, 1+count(higher) = {brute_rank}")
        try:
            located = reader.locate(manifest, entry.player_id)
        except rankview.Torn:
            located = None  # the lookup sends the player to a bucket that does not hold it
        if located is None or located[1] != position or located[2] != entry.rank:
            wrong.append(f"{entry.player_id}: window says ({position}, {entry.rank}), lookup path says {located}")
    report.add("sampled_ranks", not wrong, f"{len(positions)} sampled; " + "; ".join(wrong[:10]))
