"""Regional boards under every safety net of the global one (docs/architecture.md, Rebuilds,
recovery, splits and reconciliation): a recovery after a flush, a rebuild and a split build,
catch up (moving players between boards), compare and publish every regional board; the
invariant checker and the reconciliation against the ledger check each board and name the
board of what they find; a FINAL candidate of a season with regions reconciles every board."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry
from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED, TIE_BREAK_SHARED
from leaderboard.core.shared_index import Seen, entry_name, hidden_member, lookup_decode, lookup_encode
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import PlayerScore, RebuildJob
from leaderboard.recovery.rebuild import (
    rebuild_publish,
    rebuild_run,
    season_epoch_advance,
    season_rebuild_start,
    season_split_propose,
)
from leaderboard.recovery.reconcile import reconciliation_run, version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from leaderboard.views.rankview.shared import lookup_seen
from seasons.models import Season
from seasons.services import season_final_candidate_build
from tests.support import (
    NARROW,
    RECONCILIATION_CHECKS,
    TEST_ACTOR,
    Events,
    Profiles,
    apply_events,
    board_read,
    current_manifest,
    full_check,
    in_season,
    keys_of,
    publish,
    seal_and_build,
)
from tests.test_regional_boards import REGIONS, assert_boards_match_ledger, reader

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

SeasonFactory = Callable[..., Season]
# What a shadow compare checks on each board, and what a reconciliation checks against the ledger.
COMPARED = {"player_count", "bucket_counts_and_checksums", "shadow_index_counts", "top_100", "sampled_ranks",
            "neighbor_windows"}
LEDGER = {"player_count", "bucket_count_sum", "top_100", "ledger_sampled_ranks", "ledger_bucket_checksums"}
# A recovery's reconciliation (reconcile.recovery_reconcile): no full read of the season.
RECOVERY_LEDGER = {"player_count", "bucket_count_sum", "top_100", "ledger_sampled_ranks", "ledger_bucket_counts",
                   "ledger_replayed_players"}
# The invariant checker's full run on each regional board, and across them.
REGIONAL_INVARIANTS = {"bucket_counts", "total_players", "players_once", "bucket_ranges", "bucket_checksums",
                       "values_equal_global", "sampled_ranks"}
ACROSS_BOARDS = {"region_shards_total", "regional_players_once", "region_shards_equal_boards"}


class Board:
    """A season with regions and its writers: players in every region, in none and in one the
    season does not have, with ties, moved between regions and rescored between versions."""

    def __init__(self, season: Season, *, players: int = 48):
        self.season = season
        self.rnd = random.Random(season.slug)
        self.profiles = Profiles()
        self.events = Events(season.slug, in_season(season))
        self.players = [f"p{i:02d}" for i in range(players)]
        self.profiles.set(**{p: self.rnd.choice([*REGIONS, None, "mars"]) for p in self.players})
        self.score(self.players)

    def score(self, players: Iterable[str]) -> None:
        apply_events(self.season, [self.events.result(p, self.rnd.randrange(0, 1000)) for p in players])

    def churn(self, moves: int = 10, scores: int = 8) -> None:
        self.profiles.set(**{p: self.rnd.choice([*REGIONS, None]) for p in self.rnd.sample(self.players, moves)})
        self.score(self.rnd.sample(self.players, scores))


def seeded(season_factory: SeasonFactory, slug: str, **extra: Any) -> Board:
    """Two published versions (both copies built), players moved between them."""
    board = Board(season_factory(slug=slug, regions=REGIONS, layout=NARROW, **extra))
    publish(board.season)
    board.churn()
    publish(board.season)
    return board


def epochs_go_on(board: Board) -> None:
    """The current version checked on every board (reads against the ledger, and the full
    invariant check), then two more epochs moving and rescoring players from the copies a
    rebuild left (both of them: each epoch writes the other), checked the same way."""
    for more in (False, True, True):
        if more:
            board.churn()
            publish(board.season)
        assert_boards_match_ledger(board.season)
        full_check(board.season)


def every_board(season: Season, version: int | None = None) -> dict[str, list[Entry]]:
    """Each board of a version, read whole ("" the global one)."""
    return {region: board_read(reader(season, region or None), version)[1] for region in ("", *REGIONS)}


def checks_of(findings: Iterable[Any]) -> dict[str, bool]:
    return {f["check"]: f["ok"] for f in (f if isinstance(f, dict) else f.as_dict() for f in findings)}


def assert_every_board_checked(findings: Iterable[Any], checks: set[str]) -> None:
    """Each of `checks` ran, and passed, on every regional board."""
    found = checks_of(findings)
    for region in REGIONS:
        named = {f"region.{region}.{check}" for check in checks}
        assert named <= set(found), sorted(named - set(found))
        assert all(found[name] for name in named), [name for name in named if not found[name]]


def regional_failures(findings: Iterable[Any]) -> set[str]:
    failed = {name for name, ok in checks_of(findings).items() if not ok}
    assert failed, "nothing failed"
    # The global board's own checks all pass: what is wrong is on the regional boards.
    assert all(name.startswith("region") or name in ACROSS_BOARDS for name in failed), failed
    return failed


# --- recovery, rebuild, split ----------------------------------------------------------------


@pytest.mark.parametrize("tie_break", [TIE_BREAK_SHARED, TIE_BREAK_FIRST_REACHED])
def test_a_recovery_after_a_flush_reproduces_every_board(season_factory: SeasonFactory, tie_break: str) -> None:
    board = seeded(season_factory, f"recover-{tie_break}", tie_break=tie_break)
    season = board.season
    before = every_board(season)
    assert all(before[region] for region in REGIONS)
    redis_get().flushdb()
    assert season_epoch_advance(season=season).status == "lost"
    job = rebuild_run(job_id=RebuildJob.objects.get(season=season, kind="recovery").pk)
    assert job.status == "published", (job.error, job.report)
    # Reconciled against the ledger board by board before it published.
    assert_every_board_checked(job.report["findings"],  # type: ignore[index]
                               RECOVERY_LEDGER | {"bucket_counts", "total_players", "sampled_ranks"})
    assert every_board(season) == before
    assert set(current_manifest(season).regions) == set(REGIONS)
    epochs_go_on(board)


def test_a_rebuild_moves_players_between_boards_in_its_catch_up_and_compares_every_board(
        season_factory: SeasonFactory) -> None:
    board = seeded(season_factory, "rebuild")
    season = board.season

    def churn_while_comparing(update: RebuildJob) -> None:
        # After both shadows were built: their catch-up applies these moves.
        if update.status == "comparing":
            board.churn(moves=16, scores=6)

    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk,
                      on_progress=churn_while_comparing)
    assert job.status == "published", (job.error, job.report)
    job.refresh_from_db()
    assert (job.compared_version, job.published_version) == (3, 4)  # an epoch published the moves first
    assert_every_board_checked(job.report["findings"], COMPARED)  # type: ignore[index]
    assert checks_of(job.report["findings"])["region_boards"]  # type: ignore[index]
    manifest = current_manifest(season)
    assert manifest.copy == job.copy and set(manifest.regions) == set(REGIONS)
    # The shadow itself, moved by its catch-up, is what serves now.
    epochs_go_on(board)


def test_a_split_of_a_season_with_regions_compares_and_publishes_its_regional_boards(
        season_factory: SeasonFactory) -> None:
    board = seeded(season_factory, "split")
    season = board.season
    r = redis_get()
    keys = keys_of(season)
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[150, 550]).pk)
    assert job.status == "ready", (job.error, job.report)
    assert_every_board_checked(job.report["findings"], COMPARED)  # type: ignore[index]

    board.churn()  # epochs go on in the old layout; the shadow catches up at publication
    publish(season)
    job = rebuild_publish(job=job, actor=TEST_ACTOR, reason="approved")
    assert job.status == "published", (job.error, job.report)
    assert_every_board_checked(job.report["findings"], COMPARED)  # type: ignore[index]
    manifest = current_manifest(season)
    assert manifest.layout.layout_id == 2 and {150, 550} <= set(manifest.layout.lower_bounds)
    for region in REGIONS:
        assert reader(season, region).window(1, 100)[0].layout == manifest.layout
        # What the version's side holds: the index's bucket less that side's hidden entries.
        held = [r.zcard(keys.bucket(manifest.index, 2, b, region, groups=manifest.groups))
                - r.zcard(keys.hidden(manifest.index, manifest.side, 2, b, region, groups=manifest.groups))
                for b in range(manifest.layout.size)]
        assert held == manifest.regions[region].counts
    epochs_go_on(board)


def test_a_rebuild_compared_with_a_drifted_regional_board_is_refused(season_factory: SeasonFactory) -> None:
    season = seeded(season_factory, "drifted").season
    r = redis_get()
    keys = keys_of(season)
    live = current_manifest(season)
    served = every_board(season)
    # A member of the live na board (the entry the live version's side sees) rewritten to
    # another score in its bucket: its bookkeeping (counts, checksums, stored top 100) still
    # agrees; its reads do not.
    victim = served["na"][-1]
    bucket = live.layout.bucket_of(victim.score)
    low = live.layout.range_of(bucket)[0]
    r.zadd(keys.bucket(live.index, live.layout.layout_id, bucket, "na", groups=live.groups),
           {board_entry(keys, live, victim.player_id): -(low if victim.score != low else low + 1)})
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.status == "failed"
    failed = regional_failures(job.report["findings"])  # type: ignore[index]
    assert failed <= {"region.na.sampled_ranks", "region.na.neighbor_windows"} and failed, failed
    assert rankview.pointer_get(r, keys) == live.version


# --- the invariant checker and the reconciliation -----------------------------------------------


def region_shard(keys: rankview.Keys, manifest: Manifest, player_id: str) -> str:
    """The region shard of the version's index holding the player's field."""
    shard = rankview.lookup_shard(player_id, manifest.lookup_shards)
    return keys.region(manifest.index, shard, groups=manifest.groups)


def board_entry(keys: rankview.Keys, manifest: Manifest, player_id: str) -> str:
    """The name of the player's entry on their regional board as the version's side sees it:
    their id, or their second name ("~" in the side's part of their region-shard field)."""
    seen = lookup_seen(redis_get().hget(region_shard(keys, manifest, player_id), player_id), manifest.side)
    assert seen is not None, f"{player_id} is on no regional board of v{manifest.version}"
    return entry_name(player_id, seen.second)


def plant(season: Season, corruption: str) -> tuple[str, str]:
    """Corrupt the current version's na board as its side sees it (the index only, manifest
    untouched); returns a na player and an eu player it concerns."""
    r = redis_get()
    keys = keys_of(season)
    manifest = current_manifest(season)
    boards = every_board(season)
    mine, other = boards["na"][0], boards["eu"][0]
    layout_id, side = manifest.layout.layout_id, manifest.side

    def na_add(score: int, player_id: str) -> None:
        """The player's id into the na board at `score`, seen by the version's side (out of
        its hidden set, should the other side already have that entry there)."""
        bucket, key = manifest.layout.bucket_of(score), -score
        r.zadd(na_bucket(score), {player_id: key})
        r.zrem(keys.hidden(manifest.index, side, layout_id, bucket, "na", groups=manifest.groups),
               hidden_member(key, player_id))

    def na_bucket(score: int) -> str:
        return keys.bucket(manifest.index, layout_id, manifest.layout.bucket_of(score), "na", groups=manifest.groups)

    if corruption == "on_two_boards":  # an eu player added to the na board as well
        na_add(other.score, other.player_id)
    elif corruption == "wrong_member":  # a na member replaced by an eu player at the same place
        r.zrem(na_bucket(mine.score), board_entry(keys, manifest, mine.player_id))
        na_add(mine.score, other.player_id)
    else:  # "wrong_shard": the region shard sends a na member to eu (the version's side's part)
        field = region_shard(keys, manifest, mine.player_id)
        views = list(lookup_decode(r.hget(field, mine.player_id)))  # type: ignore[arg-type]
        placed = views[side]
        assert placed is not None and placed.value == "na"
        views[side] = Seen("eu", second=placed.second)
        r.hset(field, mine.player_id, lookup_encode((views[0], views[1])))
    return mine.player_id, other.player_id


@pytest.mark.parametrize(("corruption", "sampled", "full"), [
    ("on_two_boards", {"region.na.bucket_counts", "region.na.total_players"},
     {"regional_players_once", "region_shards_equal_boards", "region.na.bucket_checksums"}),
    ("wrong_member", {"region.na.sampled_ranks"},
     {"regional_players_once", "region_shards_equal_boards", "region.na.bucket_checksums"}),
    ("wrong_shard", {"region.na.sampled_ranks"}, {"region_shards_equal_boards"}),
])
def test_a_member_on_the_wrong_board_is_caught_by_the_checker_and_the_reconciliation(
        season_factory: SeasonFactory, corruption: str, sampled: set[str], full: set[str]) -> None:
    season = seeded(season_factory, f"planted-{corruption.replace('_', '-')}").season
    r = redis_get()
    keys = keys_of(season)
    version = current_manifest(season).version
    clean = version_check(r=r, keys=keys, full=True, sample=1000)
    assert clean.ok, clean.failures()
    assert_every_board_checked(clean.findings, REGIONAL_INVARIANTS)
    assert set(checks_of(clean.findings)) >= ACROSS_BOARDS
    assert version_reconcile(r=r, keys=keys, season_id=season.pk, version=version, sample=1000).ok

    mine, other = plant(season, corruption)
    quick = regional_failures(version_check(r=r, keys=keys, full=False, sample=1000).findings)
    assert sampled <= quick, quick
    thorough = regional_failures(version_check(r=r, keys=keys, full=True, sample=1000).findings)
    assert sampled | full <= thorough, thorough
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=version, sample=1000)
    assert sampled | full <= regional_failures(report.findings)
    run = reconciliation_run(season=season, full=True, sample=1000)
    assert run.ok is False and sampled | full <= regional_failures(run.findings)
    detail = " ".join(f["detail"] for f in run.findings if not f["ok"])
    assert mine in detail or other in detail, detail


def test_the_reconciliation_catches_a_regional_board_that_differs_from_the_ledger(
        season_factory: SeasonFactory) -> None:
    """A version consistent in itself, whose boards do not hold the ledger's regions: a
    player's region changed in the ledger behind the change stream's back."""
    season = seeded(season_factory, "ledger-drift").season
    r = redis_get()
    keys = keys_of(season)
    manifest = current_manifest(season)
    player = every_board(season)["na"][0].player_id
    ledger_queryset_of_player(season=season, player_id=player,
                              queryset=PlayerScore.objects.filter(season=season, player_id=player)).update(region="eu")
    assert version_check(r=r, keys=keys, full=True, sample=1000).ok  # the copy agrees with itself
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=manifest.version, sample=1000)
    failed = regional_failures(report.findings)
    assert {"region.na.player_count", "region.eu.player_count", "region.na.ledger_bucket_checksums",
            "region.eu.ledger_bucket_checksums", "region.na.ledger_sampled_ranks"} <= failed, failed
    assert f"{player}: on the board of na, ledger region eu" in checks_detail(report.findings,
                                                                               "region.na.ledger_sampled_ranks")
    run = reconciliation_run(season=season, full=False, sample=1000)
    assert "region.na.ledger_scores" in regional_failures(run.findings)


def checks_detail(findings: Iterable[Any], check: str) -> str:
    return next(f.detail for f in findings if f.check == check)


def test_moves_after_the_version_do_not_fail_its_reconciliation(season_factory: SeasonFactory) -> None:
    """The ledger moves on while a version stands still: players moved between regions (and
    rescored) after its watermark are compared as they were at it, on every board."""
    board = seeded(season_factory, "moving")
    season = board.season
    r = redis_get()
    keys = keys_of(season)
    version = current_manifest(season).version
    board.churn(moves=20, scores=10)
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=version, sample=1000)
    assert report.ok, report.failures()
    assert_every_board_checked(report.findings, LEDGER)
    run = reconciliation_run(season=season, full=True, sample=1000)
    assert run.ok, run.findings
    assert_every_board_checked(run.findings, {"ledger_scores"})


# --- FINAL ------------------------------------------------------------------------------------


def test_a_final_candidate_of_a_season_with_regions_reconciles_every_board(season_factory: SeasonFactory) -> None:
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    board = Board(season_factory(slug="final", starts_at=cutoff - timedelta(days=10), cutoff=cutoff,
                                 regions=REGIONS, layout=NARROW))
    season = board.season
    publish(season)
    board.churn()
    candidate = seal_and_build(season)
    assert candidate.reconciliation_ok, candidate.report
    findings = candidate.report["findings"]
    assert set(checks_of(findings)) >= RECONCILIATION_CHECKS  # the global board's, as before
    assert_every_board_checked(findings, LEDGER | REGIONAL_INVARIANTS)

    plant(season, "on_two_boards")
    candidate = season_final_candidate_build(season=season, actor=TEST_ACTOR)
    assert candidate.reconciliation_ok is False
    assert {"region.na.bucket_counts", "regional_players_once"} <= regional_failures(candidate.report["findings"])
