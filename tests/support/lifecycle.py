"""Season lifecycle and FINAL: staff actors, seasons in a given state, and a whole FINAL
run the regular way (seal, materialize, candidate, propose, approve)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from io import StringIO

from django.contrib.auth import get_user_model
from django.core.management import call_command

from audit.services import Actor
from leaderboard.core.lifecycle import SeasonState
from leaderboard.ledger_databases import ledger_aliases
from leaderboard.models import LateResult
from seasons.models import FinalCandidate, FinalStanding, Season
from seasons.services import (
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_seal_ingest,
)
from seasons.staff.late_results.services import late_result_proposal_score
from seasons.staff.revocations.services import ApprovalResult, score_revocation_approve, score_revocation_propose
from tests.support.publication import INVARIANT_CHECKS, materialize
from tests.support.writes import TEST_ACTOR

# Every check a FINAL candidate's reconciliation runs (docs/rules.md, "FINAL candidate and
# approval"): the invariant checks of the version's own copy, then those against the ledger
# (leaderboard/recovery/reconcile.py).
RECONCILIATION_CHECKS = INVARIANT_CHECKS | {
    "player_count", "bucket_count_sum", "top_100", "ledger_sampled_ranks", "ledger_bucket_checksums",
}

_users = itertools.count(1)


def staff(name: str | None = None) -> Actor:
    """A staff member: a Django user, acting as Actor(kind="user")."""
    username = name or f"staff-{next(_users)}"
    user = get_user_model().objects.create_user(username=username)  # no password: no slow hashing
    return Actor(kind="user", id=str(user.pk), label=user.get_username())


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def create_season_command(slug: str, *extra: str) -> str:
    """`manage.py create_season SLUG` of a season starting tomorrow, for 29 days, with
    `extra` options; what it printed."""
    now = datetime.now(UTC)
    out = StringIO()
    call_command("create_season", slug, "--name", slug.title(), "--starts-at", (now + timedelta(days=1)).isoformat(),
                 "--cutoff", (now + timedelta(days=30)).isoformat(), *extra, stdout=out)
    return out.getvalue()


def closing_season(season_factory: Callable[..., Season], slug: str, *, cutoff_ago: timedelta = timedelta(minutes=5),
                   length: timedelta = timedelta(days=10)) -> Season:
    """A season whose cutoff has passed (created CLOSING: ingest still open)."""
    cutoff = datetime.now(UTC) - cutoff_ago
    season = season_factory(slug=slug, starts_at=cutoff - length, cutoff=cutoff)
    assert season.state == SeasonState.CLOSING
    return season


def in_season(season: Season, *, before_cutoff: timedelta = timedelta(hours=1)) -> str:
    """An RFC 3339 completed_at inside the season, `before_cutoff` before its cutoff."""
    return iso(season.cutoff - before_cutoff)


def final_rows(season: Season) -> list[tuple[int, int, str, int]]:
    return list(
        FinalStanding.objects.filter(season=season).order_by("position")
        .values_list("position", "rank", "player_id", "score")
    )


def canonical_sha256(rows: Iterable[tuple[int, int, str, int]]) -> str:
    """The documented FINAL hash, written out independently of the service."""
    return hashlib.sha256(
        "".join(f"{position}\t{rank}\t{player}\t{score}\n" for position, rank, player, score in rows).encode()
    ).hexdigest()


def seal_and_build(season: Season, *, actor: Actor = TEST_ACTOR, seal: bool = True) -> FinalCandidate:
    """Seal ingest (unless already sealed), catch the materializer up, build the candidate."""
    if seal:
        season_seal_ingest(season=season, actor=actor)
    materialize(season)
    return season_final_candidate_build(season=season, actor=actor)


def finalize(season: Season, *, proposer: Actor | None = None, approver: Actor | None = None,
             seal: bool = True) -> Season:
    """CLOSING (or FINALIZING with seal=False) -> FINAL the regular way: seal, materialize,
    candidate, propose, approve."""
    candidate = seal_and_build(season, seal=seal)
    assert candidate.reconciliation_ok, candidate.report
    season_final_propose(candidate=candidate, actor=proposer or staff())
    return season_final_approve(candidate=candidate, actor=approver or staff())


def held_correction_approve(season: Season, event_id: str, *, public_reason: str = "",
                            proposer: Actor | None = None, approver: Actor | None = None) -> ApprovalResult:
    """A correction the write API held after the seal, applied the only way it can be:
    one staff member proposes it from the queue, another approves it."""
    # From the database holding the player's partition (the one it was queued in).
    (late,) = [late for alias in ledger_aliases(season=season)
               for late in LateResult.objects.using(alias).select_related("ledger_event").filter(
                   season_id=season.pk, ledger_event__event_id=event_id)]
    revocation = score_revocation_propose(
        season=season, player_id=late.player_id, new_score=late_result_proposal_score(late_result=late),
        reason=late.ledger_event.reason, public_reason=public_reason, actor=proposer or staff(), late_result=late,
    )
    return score_revocation_approve(revocation=revocation, actor=approver or staff())
