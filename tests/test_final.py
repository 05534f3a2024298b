"""FINAL standings end to end (docs/rules.md, Season lifecycle) on a real database and a real Redis: seal,
reconciled candidate, two-person approval, durable hashed standings, corrections after
FINAL that never rewrite it, and the ways a candidate is refused."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.services import SYSTEM
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.ranking import Standings
from leaderboard.ledger_reads import ledger_rows_count, ledger_rows_list
from leaderboard.models import LateResult, PlayerScore
from leaderboard.models import Manifest as ManifestRow
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.season_index import season_keys
from seasons.models import FinalCandidate, FinalCorrection, FinalStanding, Season
from seasons.services import (
    FinalNotReady,
    SeasonError,
    final_standings_hash,
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_final_reject,
    season_seal_ingest,
)
from tests.support import (
    RECONCILIATION_CHECKS,
    Events,
    canonical_sha256,
    closing_season,
    current_manifest,
    db_scores,
    final_rows,
    finalize,
    held_correction_approve,
    in_season,
    materialize,
    post_ok,
    seal_and_build,
    staff,
    statuses,
)
from tests.support.reference import answer_entry
from tests.support.staff_console import audit_actions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SeasonFactory = Callable[..., Season]

# Ties at several scores, ids whose byte order differs from any case-insensitive or
# numeric order ('-' < '.' < digits < ':' < upper case < '_' < lower case), scores
# at both ends of the range and on bucket edges (10,000-point buckets).
SCORES = {
    "champ": 1_000_000, "runner_up": 999_999,
    "alice": 50_000, "Alice": 50_000, "_alice": 50_000, "-alice": 50_000, ".alice": 50_000,
    "9alice": 50_000, "a:lice": 50_000, "ALICE": 50_000,
    "bob": 20_000, "b": 19_999, "B": 19_999, "b0": 10_000, "b.0": 10_000,
    "z": 9_999, "Z": 9_999, "zz": 1, "Zz": 1, "nil": 0, "nil2": 0,
}


def load(post_scores: Post, season: Season, events: Events, scores: dict[str, int] = SCORES) -> None:
    """Each player reaches the score through two results (the lower one second: unchanged)."""
    first = [events.result(p, max(0, s - 1)) for p, s in scores.items()]
    second = [events.result(p, s) for p, s in scores.items()]
    third = [events.result(p, max(0, s - 5)) for p, s in scores.items()]
    post_ok(post_scores, season, first)
    post_ok(post_scores, season, second)
    post_ok(post_scores, season, third)
    assert db_scores(season) == scores


def as_rows(standings: Standings) -> list[tuple[int, int, str, int]]:
    return [(e.position, e.rank, e.player_id, e.score) for e in standings.window(from_position=1,
                                                                                 limit=len(standings))]


def get(path: str) -> Any:
    return APIClient().get(path)


def final_snapshot(slug: str) -> dict[str, bytes]:
    """The bytes of every FINAL endpoint (except corrections, which may grow)."""
    out: dict[str, bytes] = {}
    for path in (f"/v1/seasons/{slug}/final", f"/v1/seasons/{slug}/final/standings?limit=1000",
                 f"/v1/seasons/{slug}/final/standings?from_position=3&limit=4",
                 f"/v1/seasons/{slug}/final/players/champ", f"/v1/seasons/{slug}/final/players/Alice"):
        response = get(path)
        assert response.status_code == 200, (path, response.content)
        out[path] = response.content
    return out


# --- the whole way, and what FINAL holds --------------------------------------------------


def test_end_to_end_seal_candidate_two_person_approval_and_durable_hashed_standings(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "e2e")
    events = Events("e2e", in_season(season))
    load(post_scores, season, events)
    materialize(season)  # a version before the seal: the seal's watermark is newer than nothing

    season_seal_ingest(season=season, actor=SYSTEM)
    manifest = materialize(season)
    candidate = season_final_candidate_build(season=season, actor=SYSTEM)
    season.refresh_from_db()
    assert candidate.version == manifest.version == season.published_version
    assert (candidate.status, candidate.reconciliation_ok) == ("built", True)
    assert candidate.report["ok"] is True
    assert candidate.report["version"] == candidate.version
    findings = candidate.report["findings"]
    assert {f["check"] for f in findings} == RECONCILIATION_CHECKS
    assert all(f["ok"] for f in findings), [f for f in findings if not f["ok"]]

    proposer, approver, viewer = staff("proposer"), staff("approver"), staff("viewer")
    with pytest.raises(SeasonError, match="candidate is built; it must be proposed first"):
        season_final_approve(candidate=candidate, actor=viewer)
    with pytest.raises(SeasonError, match="only a staff member can propose"):
        season_final_propose(candidate=candidate, actor=SYSTEM)
    season_final_propose(candidate=candidate, actor=proposer, reason="numbers check out")
    with pytest.raises(SeasonError, match="candidate is proposed, only a built candidate can be proposed"):
        season_final_propose(candidate=candidate, actor=viewer)
    with pytest.raises(SeasonError, match="the proposer cannot approve their own proposal"):
        season_final_approve(candidate=candidate, actor=proposer)
    with pytest.raises(SeasonError, match="only a staff member"):
        season_final_approve(candidate=candidate, actor=SYSTEM)
    assert Season.objects.get(pk=season.pk).state == SeasonState.FINALIZING
    assert not FinalStanding.objects.exists()

    final = season_final_approve(candidate=candidate, actor=approver, reason="second pair of eyes")
    assert final.state == SeasonState.FINAL
    season.refresh_from_db()
    assert (season.state, season.final_version) == ("FINAL", candidate.version)
    assert season.finalized_at is not None
    candidate.refresh_from_db()
    assert (candidate.status, candidate.proposed_by, candidate.proposed_by_label) == (
        "approved", proposer.id, "proposer")
    assert (candidate.decided_by, candidate.decided_by_label, candidate.decision_reason) == (
        approver.id, "approver", "second pair of eyes")

    # The standings are the ledger's scores ranked by docs/rules.md (Ranking), in the database.
    rows = final_rows(season)
    expected = as_rows(Standings(dict(ledger_rows_list(
        season=season, queryset=PlayerScore.objects.filter(season=season).values_list("player_id", "score")))))
    assert rows == expected
    assert [r[2] for r in rows[2:10]] == ["-alice", ".alice", "9alice", "ALICE", "Alice", "_alice", "a:lice", "alice"]
    assert [r[1] for r in rows[2:10]] == [3] * 8  # one shared rank; positions go on
    assert [(r[0], r[1]) for r in rows[-4:]] == [(18, 18), (19, 18), (20, 20), (21, 20)]
    assert rows[0] == (1, 1, "champ", 1_000_000)

    # The hash: the service's recomputation and one written out by hand agree with the row.
    manifest_row = ManifestRow.objects.get(season=season, version=candidate.version)
    assert manifest_row.is_final is True
    assert final_standings_hash(season_id=season.pk) == (manifest_row.content_hash, len(SCORES))
    assert manifest_row.content_hash == canonical_sha256(rows)
    by_hand = hashlib.sha256()
    for position, rank, player_id, score in rows:
        by_hand.update(f"{position}\t{rank}\t{player_id}\t{score}\n".encode())
    assert manifest_row.content_hash == by_hand.hexdigest()
    assert manifest_row.total_players == len(SCORES)

    assert audit_actions(season) == [
        "season.created", "season.ingest.sealed", "season.final.candidate_built", "season.final.proposed",
        "season.final.approved",
    ]
    approved = AuditEntry.objects.get(action="season.final.approved")
    assert (approved.actor_type, approved.actor_id, approved.actor_label, approved.reason) == (
        "user", approver.id, "approver", "second pair of eyes")
    assert approved.before is not None and approved.after is not None
    assert approved.before["state"] == "FINALIZING"
    assert (approved.after["state"], approved.after["final_version"], approved.after["content_hash"],
            approved.after["total_players"], approved.after["proposed_by"]) == (
        "FINAL", candidate.version, manifest_row.content_hash, len(SCORES), "proposer")
    proposed = AuditEntry.objects.get(action="season.final.proposed")
    assert (proposed.actor_label, proposed.before, proposed.after, proposed.reason) == (
        "proposer", {"status": "built"}, {"status": "proposed", "version": candidate.version}, "numbers check out")

    # FINAL happens once.
    with pytest.raises(SeasonError, match="a FINAL season cannot be approved"):
        season_final_approve(candidate=candidate, actor=viewer)
    with pytest.raises(SeasonError, match="a FINAL season has no FINAL candidate to build"):
        season_final_candidate_build(season=season, actor=SYSTEM)


def test_a_season_split_over_ledger_databases_gets_the_standings_and_hash_of_one_database(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    """The same scores in a season of 8 ledger partitions and in one of a single partition:
    with LEDGER_PARTITION_URLS placing partitions 4-7 in a database of their own the first
    is split (its standings are ranked from every database's rows gathered in "default"),
    the second is all in "default"; their standings and hashes are the same, byte for byte."""
    from leaderboard.ledger_databases import ledger_aliases

    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    split, whole = (season_factory(slug=slug, starts_at=cutoff - timedelta(days=10), cutoff=cutoff,
                                   partitions=partitions)
                    for slug, partitions in (("final-split", 8), ("final-whole", 1)))
    assert list(ledger_aliases(season=whole)) == ["default"]
    for season in (split, whole):
        load(post_scores, season, Events(season.slug, in_season(season)))
        finalize(season)
    rows = final_rows(split)
    assert rows == final_rows(whole) == as_rows(Standings(SCORES))
    hashes = [ManifestRow.objects.get(season=s, is_final=True).content_hash for s in (split, whole)]
    assert hashes[0] == hashes[1] == canonical_sha256(rows)
    assert final_standings_hash(season_id=split.pk) == (hashes[0], len(SCORES))
    # Split, some of those players' rows live in the second database only.
    aliases = list(ledger_aliases(season=split))
    for alias in aliases[1:]:
        assert PlayerScore.objects.using(alias).filter(season_id=split.pk).exists()
    assert sum(PlayerScore.objects.using(alias).filter(season_id=split.pk).count() for alias in aliases) == len(SCORES)


def test_final_standings_rows_are_immutable_in_the_database(season_factory: SeasonFactory, post_scores: Post) -> None:
    season = closing_season(season_factory, "immutable")
    load(post_scores, season, Events("imm", in_season(season)), {"a": 5, "b": 3})
    finalize(season)
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic():
        FinalStanding.objects.filter(season=season, player_id="a").update(score=1)
    if connection.vendor == "postgresql":  # SQLite keeps DELETE for its test runner's flush
        with pytest.raises(DatabaseError, match="immutable"), transaction.atomic():
            FinalStanding.objects.filter(season=season, player_id="b").delete()
    assert final_rows(season) == [(1, 1, "a", 5), (2, 2, "b", 3)]


def test_an_empty_season_can_be_final_with_the_hash_of_no_lines(season_factory: SeasonFactory) -> None:
    season = closing_season(season_factory, "empty")
    finalize(season)
    season.refresh_from_db()
    assert season.state == SeasonState.FINAL
    assert final_rows(season) == []
    assert season.final_version is not None
    row = ManifestRow.objects.get(season=season, version=season.final_version)
    assert (row.total_players, row.content_hash) == (0, hashlib.sha256(b"").hexdigest())


# --- after FINAL: corrections produce a new version; FINAL stays byte for byte -----------


def test_a_revoked_champion_after_final_gets_a_corrected_version_and_final_never_changes(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "revoked")
    events = Events("rev", in_season(season))
    load(post_scores, season, events)
    finalize(season)
    season.refresh_from_db()
    final_version = season.final_version
    assert final_version is not None
    final_hash = ManifestRow.objects.get(season=season, version=final_version).content_hash
    rows_before = final_rows(season)
    snapshot = final_snapshot(season.slug)
    top = get(f"/v1/seasons/{season.slug}/leaderboard/top?limit=3").json()
    assert (top["leaderboard_version"], top["entries"][0]["player_id"]) == (final_version, "champ")
    assert get(f"/v1/seasons/{season.slug}/final/corrections").json()["corrections"] == []

    revoke = events.correction("champ", 12, reason="revoked: account shared with a pro")
    results = post_ok(post_scores, season, [revoke])
    # From the write API a correction is held: recorded, queued for staff, the board untouched.
    assert statuses(results) == [("held", "correction_after_seal")]
    assert results[0]["pending_version"] is None
    assert db_scores(season)["champ"] == 1_000_000
    proposer, approver = staff("rev-proposer"), staff("rev-approver")
    approval = held_correction_approve(season, revoke["event_id"], public_reason="rule violation",
                                       proposer=proposer, approver=approver)
    assert approval.applied, approval.detail
    approved_event = approval.revocation.event_id
    # A plain result after FINAL is a late result: queued, never into the board.
    late = events.result("newcomer", 999_000)
    assert statuses(post_ok(post_scores, season, [late])) == [("rejected", "late_after_seal")]
    assert ledger_rows_count(season=season, queryset=LateResult.objects.filter(season=season,
                                                                             player_id="newcomer")) == 1

    manifest = materialize(season)
    assert manifest.version == final_version + 1
    season.refresh_from_db()
    assert (season.state, season.final_version, season.published_version) == ("FINAL", final_version,
                                                                               final_version + 1)

    # The live board serves the corrected version: the champion is demoted.
    corrected = Standings(db_scores(season))
    assert "newcomer" not in db_scores(season)
    top = get(f"/v1/seasons/{season.slug}/leaderboard/top?limit=100").json()
    assert top["leaderboard_version"] == final_version + 1
    assert top["entries"] == [answer_entry(e) for e in corrected.top(100)]
    assert top["entries"][0]["player_id"] == "runner_up"
    rank = get(f"/v1/seasons/{season.slug}/players/champ/rank").json()
    assert (rank["score"], rank["rank"], rank["position"]) == (12, 17, 17)
    # The FINAL version is still readable by number while retained.
    pinned = get(f"/v1/seasons/{season.slug}/players/champ/rank?version={final_version}").json()
    assert (pinned["leaderboard_version"], pinned["rank"], pinned["score"]) == (final_version, 1, 1_000_000)

    # The correction is listed beside the FINAL: who, why, before, after, which version.
    listed = get(f"/v1/seasons/{season.slug}/final/corrections").json()
    assert (listed["season_id"], listed["final_version"]) == ("revoked", final_version)
    assert len(listed["corrections"]) == 1
    correction = listed["corrections"][0]
    # Public: an opaque approver id and the public reason; names and the internal reason are not.
    assert {k: v for k, v in correction.items() if k != "at"} == {
        "player_id": "champ", "before": 1_000_000, "after": 12, "event_id": approved_event,
        "version": final_version + 1, "who": f"staff-{approver.id}", "why": "rule violation",
    }
    assert "rev-approver" not in str(listed) and "account shared" not in str(listed)
    assert datetime.fromisoformat(correction["at"].replace("Z", "+00:00")) <= datetime.now(UTC)
    assert FinalCorrection.objects.filter(season=season).count() == 1
    audit = AuditEntry.objects.get(action="season.final.correction")
    assert (audit.actor_type, audit.actor_label, audit.target_type, audit.target_id, audit.season_slug) == (
        "user", "rev-approver", "player", "champ", "revoked")
    assert audit.before == {"score": 1_000_000}
    assert audit.after == {"score": 12, "score_version": approval.revocation.base_version + 1,
                           "event_id": approved_event}
    assert audit.reason == "revoked: account shared with a pro"

    # The FINAL itself: same rows, same hash, same bytes on every endpoint.
    assert final_rows(season) == rows_before
    row = ManifestRow.objects.get(season=season, version=final_version)
    assert (row.is_final, row.content_hash) == (True, final_hash)
    assert final_standings_hash(season_id=season.pk) == (final_hash, len(SCORES))
    assert final_snapshot(season.slug) == snapshot
    assert not ManifestRow.objects.filter(season=season, is_final=True).exclude(version=final_version).exists()


def test_a_correction_that_changes_nothing_is_not_listed(season_factory: SeasonFactory, post_scores: Post) -> None:
    season = closing_season(season_factory, "noop-fix")
    events = Events("noop", in_season(season))
    load(post_scores, season, events, {"a": 5, "b": 3})
    finalize(season)
    recheck = events.correction("a", 5, reason="re-check")
    assert statuses(post_ok(post_scores, season, [recheck])) == [("held", "correction_after_seal")]
    assert held_correction_approve(season, recheck["event_id"]).applied
    assert not FinalCorrection.objects.exists()
    assert get(f"/v1/seasons/{season.slug}/final/corrections").json()["corrections"] == []


def test_final_endpoints_answer_from_the_database_with_redis_flushed(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "flushed")
    events = Events("fl", in_season(season))
    load(post_scores, season, events)
    finalize(season)
    revoke = events.correction("champ", 7, reason="revoked")
    post_ok(post_scores, season, [revoke])
    assert held_correction_approve(season, revoke["event_id"]).applied
    materialize(season)
    snapshot = final_snapshot(season.slug)
    corrections = get(f"/v1/seasons/{season.slug}/final/corrections").content

    redis_get().flushdb()
    rankview.manifest_cache_clear()
    # The live board is gone until rebuilt...
    assert get(f"/v1/seasons/{season.slug}/leaderboard/top").status_code == 503
    # ...the FINAL is not.
    assert final_snapshot(season.slug) == snapshot
    assert get(f"/v1/seasons/{season.slug}/final/corrections").content == corrections
    body = get(f"/v1/seasons/{season.slug}/final/standings?limit=1000").json()
    assert [(e["position"], e["rank"], e["player_id"], e["score"]) for e in body["entries"]] == final_rows(season)


# --- what refuses a candidate --------------------------------------------------------------


def _bucket_key(season: Season, score: int) -> str:
    """The key of the bucket holding `score` in the current copy (the one the manifest names)."""
    manifest = current_manifest(season)
    assert manifest is not None
    return season_keys(season).bucket(manifest.copy, manifest.layout.layout_id, manifest.layout.bucket_of(score),
                                     groups=manifest.groups)


def _stray_member(season: Season) -> None:
    assert redis_get().zadd(_bucket_key(season, 50_000), {"ghost": -50_000}) == 1


def _missing_member(season: Season) -> None:
    assert redis_get().zrem(_bucket_key(season, SCORES["bob"]), "bob") == 1


def _duplicate_player(season: Season) -> None:
    # alice also in the bottom bucket: in two buckets at once.
    assert redis_get().zadd(_bucket_key(season, 0), {"alice": 0}) == 1


def _wrong_score(season: Season) -> None:
    # Same bucket, same count, another score: only checksums and rank checks can see it.
    assert redis_get().zadd(_bucket_key(season, SCORES["bob"]), {"bob": -20_001}) == 0


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [(_stray_member, "bucket_counts"), (_missing_member, "bucket_counts"), (_duplicate_player, "players_once"),
     (_wrong_score, "bucket_checksums")],
    ids=["stray-member", "missing-member", "duplicate-player", "wrong-score"],
)
def test_a_corrupted_bucket_fails_reconciliation_names_the_check_and_blocks_approval(
    season_factory: SeasonFactory, post_scores: Post, corrupt: Callable[[Season], None], named: str
) -> None:
    season = closing_season(season_factory, "corrupt")
    load(post_scores, season, Events("cor", in_season(season)))
    season_seal_ingest(season=season, actor=SYSTEM)
    materialize(season)
    corrupt(season)

    candidate = season_final_candidate_build(season=season, actor=SYSTEM)
    assert candidate.reconciliation_ok is False
    assert candidate.report["ok"] is False
    failed = {f["check"] for f in candidate.report["findings"] if not f["ok"]}
    assert named in failed
    assert {f["check"] for f in candidate.report["findings"]} == RECONCILIATION_CHECKS  # all ran, all listed
    assert next(f["detail"] for f in candidate.report["findings"] if f["check"] == named)
    audit = AuditEntry.objects.get(action="season.final.candidate_built")
    assert audit.after is not None
    assert audit.after["reconciliation_ok"] is False
    assert set(audit.after["failed_checks"]) == failed

    with pytest.raises(SeasonError, match=rf"the reconciliation failed \(.*{named}.*\)"):
        season_final_propose(candidate=candidate, actor=staff())
    with pytest.raises(SeasonError, match="it must be proposed first"):
        season_final_approve(candidate=candidate, actor=staff())
    season.refresh_from_db()
    assert season.state == SeasonState.FINALIZING
    assert not FinalStanding.objects.exists()
    assert candidate.status == "built"
    # Even if it had been proposed before the check result was known, approval refuses it.
    FinalCandidate.objects.filter(pk=candidate.pk).update(status="proposed", proposed_by=staff().id)
    with pytest.raises(SeasonError, match="the candidate's reconciliation failed"):
        season_final_approve(candidate=candidate, actor=staff())
    assert not FinalStanding.objects.exists()


def test_a_ledger_that_disagrees_with_the_version_fails_the_ledger_checks(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "diverged")
    load(post_scores, season, Events("div", in_season(season)))
    season_seal_ingest(season=season, actor=SYSTEM)
    materialize(season)
    # A score row written behind the change stream's back: the version cannot know it.
    PlayerScore.objects.create(season=season, player_id="intruder", score=999_998, score_version=1,
                               updated_at=datetime.now(UTC))
    candidate = season_final_candidate_build(season=season, actor=SYSTEM)
    failed = {f["check"] for f in candidate.report["findings"] if not f["ok"]}
    assert {"player_count", "top_100", "ledger_bucket_checksums"} <= failed
    # The version is internally consistent: only the checks against the ledger fail.
    assert not failed & {"bucket_counts", "total_players", "players_once", "bucket_checksums",
                         "lookup_equals_index"}
    detail = {f["check"]: f["detail"] for f in candidate.report["findings"]}
    assert detail["player_count"] == f"ledger {len(SCORES) + 1}, version {len(SCORES)} (difference -1)"
    with pytest.raises(SeasonError, match="the reconciliation failed"):
        season_final_propose(candidate=candidate, actor=staff())


def test_a_candidate_before_the_materializer_reached_the_seal_is_not_ready(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "not-ready")
    events = Events("nr", in_season(season))
    load(post_scores, season, events, {"a": 5, "b": 3})
    materialize(season)
    post_ok(post_scores, season, [events.result("c", 9)])  # accepted, not yet in a version
    season_seal_ingest(season=season, actor=SYSTEM)
    with pytest.raises(FinalNotReady, match="waiting for the materializer"):
        season_final_candidate_build(season=season, actor=SYSTEM)
    assert not FinalCandidate.objects.exists()
    materialize(season)
    candidate = season_final_candidate_build(season=season, actor=SYSTEM)
    assert candidate.reconciliation_ok
    season_final_propose(candidate=candidate, actor=staff())
    season_final_approve(candidate=candidate, actor=staff())
    assert final_rows(season) == [(1, 1, "c", 9), (2, 2, "a", 5), (3, 3, "b", 3)]


def test_a_correction_in_finalizing_after_the_candidate_makes_approval_refuse(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "moved-on")
    events = Events("mo", in_season(season))
    load(post_scores, season, events, {"a": 5, "b": 3, "c": 1})
    candidate = seal_and_build(season)
    proposer, approver = staff(), staff()
    season_final_propose(candidate=candidate, actor=proposer)

    # A dispute upheld while the candidate waits: applied, but not in any version yet.
    upheld = events.correction("c", 8, reason="dispute won")
    assert statuses(post_ok(post_scores, season, [upheld])) == [("held", "correction_after_seal")]
    assert held_correction_approve(season, upheld["event_id"]).applied
    with pytest.raises(SeasonError, match="the ledger changed after the candidate version: build a new candidate"):
        season_final_approve(candidate=candidate, actor=approver)
    # Once published, the board has moved past the candidate.
    materialize(season)
    with pytest.raises(SeasonError, match=rf"the board moved on \(v{candidate.version + 1}\) since candidate "
                                          rf"v{candidate.version}"):
        season_final_approve(candidate=candidate, actor=approver)
    assert not FinalStanding.objects.exists()
    assert not FinalCorrection.objects.exists()  # not FINAL yet: a correction, not a FINAL correction

    fresh = season_final_candidate_build(season=season, actor=SYSTEM)
    candidate.refresh_from_db()
    assert candidate.status == "superseded"
    with pytest.raises(SeasonError, match="candidate is superseded"):
        season_final_approve(candidate=candidate, actor=approver)
    season_final_propose(candidate=fresh, actor=proposer)
    season_final_approve(candidate=fresh, actor=approver)
    assert final_rows(season) == [(1, 1, "c", 8), (2, 2, "a", 5), (3, 3, "b", 3)]


def test_a_rejected_candidate_needs_a_reason_and_cannot_be_approved(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "rejected")
    load(post_scores, season, Events("rj", in_season(season)), {"a": 5})
    candidate = seal_and_build(season)
    proposer, reviewer = staff("p"), staff("r")
    season_final_propose(candidate=candidate, actor=proposer)
    with pytest.raises(SeasonError, match="a rejection needs a reason"):
        season_final_reject(candidate=candidate, actor=reviewer, reason="  ")
    with pytest.raises(SeasonError, match="only a staff member"):
        season_final_reject(candidate=candidate, actor=SYSTEM, reason="no")
    season_final_reject(candidate=candidate, actor=reviewer, reason="sample looks off")
    candidate.refresh_from_db()
    assert (candidate.status, candidate.decided_by_label, candidate.decision_reason) == (
        "rejected", "r", "sample looks off")
    entry = AuditEntry.objects.get(action="season.final.rejected")
    assert (entry.actor_label, entry.before, entry.after, entry.reason) == (
        "r", {"status": "proposed"}, {"status": "rejected"}, "sample looks off")
    with pytest.raises(SeasonError, match="candidate is rejected; it must be proposed first"):
        season_final_approve(candidate=candidate, actor=reviewer)
    with pytest.raises(SeasonError, match="candidate is rejected"):
        season_final_reject(candidate=candidate, actor=reviewer, reason="again")
    assert Season.objects.get(pk=season.pk).state == SeasonState.FINALIZING


# --- several seasons ------------------------------------------------------------------------


def test_several_seasons_live_at_once_and_a_new_season_starts_empty(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    ending = closing_season(season_factory, "ending")
    running = season_factory(slug="running", starts_at=datetime.now(UTC) - timedelta(days=1),
                             cutoff=datetime.now(UTC) + timedelta(days=5))
    load(post_scores, ending, Events("end", in_season(ending)), {"champ": 900, "shared": 500})
    load(post_scores, running, Events("run", in_season(running, before_cutoff=timedelta(days=4))),
         {"shared": 100, "other": 200})
    materialize(running)
    finalize(ending)

    # One season's FINAL does not touch the other's board or state.
    assert Season.objects.get(pk=running.pk).state == SeasonState.OPEN
    live = get("/v1/seasons/running/leaderboard/top").json()
    assert [(e["player_id"], e["score"]) for e in live["entries"]] == [("other", 200), ("shared", 100)]
    assert get("/v1/seasons/running/final").json()["error"] == "not_final"
    assert [e["player_id"] for e in get("/v1/seasons/ending/final/standings").json()["entries"]] == [
        "champ", "shared"]

    # A new season: no version, no FINAL, nothing inherited.
    fresh = season_factory(slug="next", starts_at=datetime.now(UTC) - timedelta(minutes=1),
                           cutoff=datetime.now(UTC) + timedelta(days=30))
    assert get("/v1/seasons/next/leaderboard/top").status_code == 503
    assert get("/v1/seasons/next/final").status_code == 404
    assert get("/v1/seasons/next/players/champ/rank").status_code == 503
    materialize(fresh)
    empty = get("/v1/seasons/next/leaderboard/top").json()
    assert (empty["leaderboard_version"], empty["entries"], empty["total_players"]) == (1, [], 0)
    assert get("/v1/seasons/next/players/champ/rank").json()["error"] == "not_ranked"
    post_ok(post_scores, fresh, [Events("nx", in_season(fresh, before_cutoff=timedelta(days=29))).result("champ", 1)])
    materialize(fresh)
    assert get("/v1/seasons/next/players/champ/rank").json()["score"] == 1
    assert get("/v1/seasons/ending/final/players/champ").json()["score"] == 900
