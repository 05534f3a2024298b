"""Writes of the seasons app."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from audit.selectors import staff_role_granters
from audit.services import SYSTEM, Actor, audit_log
from leaderboard.core.buckets import BucketLayout, LayoutError
from leaderboard.core.errors import DomainError
from leaderboard.core.lifecycle import (
    SeasonState,
    TransitionError,
    approval_check,
    due_transition,
    initial_state,
    transition_check,
)
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark, layout_check
from leaderboard.core.season_options import (
    MODE_BEST,
    ORDER_ASC,
    ORDER_DESC,
    TIE_BREAK_FIRST_REACHED,
    TIE_BREAK_SHARED,
    mode_problem,
    order_problem,
    regions_problem,
    tie_break_problem,
)
from leaderboard.core.series import APPROVAL_AUTO
from leaderboard.core.tiebreak import first_reached_problem, reached_text
from leaderboard.core.tiers import Tiers, TiersError, tiers_parse
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import changes_after_q, stream_last_watermark
from leaderboard.ledger_databases import ledger_placement_extended, ledger_placement_for
from leaderboard.ledger_reads import ledger_databases_list, ledger_is_default, ledger_rows_exist
from leaderboard.models import Manifest as ManifestRow
from leaderboard.models import ScoreChange
from leaderboard.recovery.reconcile import display_order_sql, version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.season_index import season_keys
from seasons.models import FinalCandidate, FinalStanding, Season, Series
from seasons.selectors import final_candidate_current, final_line_format

log = logging.getLogger(__name__)


class SeasonError(DomainError):
    code = "season_refused"


def season_create(
    *,
    slug: str,
    name: str,
    starts_at: datetime,
    cutoff: datetime,
    actor: Actor,
    layout: BucketLayout | None = None,
    regions: Sequence[str] = (),
    tie_break: str = TIE_BREAK_SHARED,
    mode: str = MODE_BEST,
    order: str = ORDER_DESC,
    partitions: int | None = None,
    series: Series | None = None,
    series_window: int | None = None,
    seal_after_seconds: int | None = None,
    tiers: str = "",
) -> Season:
    """A new season in the state its dates call for. `regions`: its fixed set of regions
    (0..16 distinct names by the region rule; each gets its own board), changeable only
    while it is SCHEDULED; `tie_break`: how equal scores are ordered, fixed for good;
    `mode`: how a result sets a score (best, latest or sum) and `order`: which end ranks
    first (desc or asc), both changeable only while SCHEDULED;
    `partitions`: its ledger partitions (default SEASON_PARTITIONS), changed only by
    season_repartition; `series`, `series_window`: the series window it is (one season a
    window: a second one raises IntegrityError); `seal_after_seconds`: how long after the
    cutoff the clock seals it (default SEAL_AFTER_CUTOFF_SECONDS); `tiers`: named tiers by
    rank or top share (core.tiers), refused with the reason when malformed."""
    try:
        parsed_tiers = tiers_parse(tiers)
    except TiersError as exc:
        raise SeasonError(f"--tiers: {exc}") from exc
    if cutoff <= starts_at:
        raise SeasonError("the cutoff must be after the start")
    partitions = settings.SEASON_PARTITIONS if partitions is None else partitions
    try:
        layout_check(base=0, partitions=partitions)
    except ValueError as exc:
        raise SeasonError(str(exc)) from exc
    if problem := (regions_problem(regions) or tie_break_problem(tie_break) or mode_problem(mode)
                   or order_problem(order)):
        raise SeasonError(problem)
    if tie_break == TIE_BREAK_FIRST_REACHED and (problem := first_reached_problem(
            layout=layout or BucketLayout.uniform(), starts_at=starts_at, cutoff=cutoff)):
        raise SeasonError(problem)
    if Season.objects.filter(slug=slug).exists():
        raise SeasonError(f"a season {slug!r} already exists")
    state = initial_state(starts_at=starts_at, cutoff=cutoff, now=timezone.now())
    with transaction.atomic():
        season = Season.objects.create(
            slug=slug, name=name, starts_at=starts_at, cutoff=cutoff, state=state.value,
            layout=(layout or BucketLayout.uniform()).as_dict(), regions=list(regions), tie_break=tie_break,
            mode=mode, order=order, partitions=partitions, series=series, series_window=series_window,
            seal_after_seconds=seal_after_seconds, ledger_databases=ledger_placement_for(partitions=partitions),
            tiers=parsed_tiers.text() if parsed_tiers is not None else "",
        )
        audit_log(
            actor=actor,
            action="season.created",
            target_type="season",
            target_id=slug,
            season_slug=slug,
            after={
                "name": name, "state": season.state,
                "starts_at": starts_at.isoformat(), "cutoff": cutoff.isoformat(),
                "buckets": len(season.layout["lower_bounds"]),
                "regions": season.regions, "tie_break": season.tie_break, "mode": season.mode,
                "order": season.order, "max_score": season.max_score,
                "partitions": partitions,
                **({"tiers": season.tiers} if season.tiers else {}),
                **({"ledger_databases": season.ledger_databases} if season.ledger_databases else {}),
                **({"series": series.slug, "series_window": series_window} if series is not None else {}),
            },
        )
    return season


def season_repartition(*, season: Season, partitions: int, actor: Actor, reason: str = "") -> Season:
    """Move a season to `partitions` ledger partitions, in any state, open included
    (audited `season.repartitioned`; docs/operations.md, Repartitioning a season).

    Under every partition's write lock, so no batch is in flight and every later batch
    reads the new layout under its own locks. The new partitions are numbered above every
    old one and nothing already written moves: the old partitions' changes keep their
    commit numbers, so every watermark keeps its meaning and nothing is read twice or
    skipped; an epoch reads partitions in ascending order, so a player's changes in the
    old layout come before their changes in the new one. The old partitions only stop
    receiving changes.
    """
    with transaction.atomic():
        locked = _locked_season(season)
        if partitions == locked.partitions:
            raise SeasonError(f"season {locked.slug} already has {partitions} ledger partitions")
        base = locked.partition_base + locked.partitions
        try:
            layout_check(base=base, partitions=partitions)
        except ValueError as exc:
            raise SeasonError(str(exc)) from exc
        try:
            # A repartition's new partitions live where the old ones do: no row moves, so a
            # season split over databases cannot be repartitioned.
            placement = ledger_placement_extended(season=locked, partitions=partitions)
        except ValueError as exc:
            raise SeasonError(f"{exc}: a season split over ledger databases cannot be repartitioned") from exc
        before = {"partitions": locked.partitions, "partition_base": locked.partition_base}
        locked.partitions, locked.partition_base = partitions, base
        locked.ledger_databases = placement
        locked.save(update_fields=["partitions", "partition_base", "ledger_databases"])
        audit_log(actor=actor, action="season.repartitioned", target_type="season", target_id=locked.slug,
                  season_slug=locked.slug, before=before,
                  after={"partitions": partitions, "partition_base": base}, reason=reason)
    return locked


def season_regions_set(*, season: Season, regions: Sequence[str], actor: Actor, reason: str = "") -> Season:
    """Replace a SCHEDULED season's regions (audited `season.regions.changed`). Once the season
    opens its regions are fixed: players' regional positions depend on them."""
    if problem := regions_problem(regions):
        raise SeasonError(problem)
    return _scheduled_option_set(season=season, field="regions", value=list(regions), fixed="regions are fixed",
                                 action="season.regions.changed", actor=actor, reason=reason)


def season_mode_set(*, season: Season, mode: str, actor: Actor, reason: str = "") -> Season:
    """Change a SCHEDULED season's mode (audited `season.mode.changed`). Once the season
    opens its mode is fixed: the ledger's scores are computed under it."""
    if problem := mode_problem(mode):
        raise SeasonError(problem)
    return _scheduled_option_set(season=season, field="mode", value=mode, fixed="the mode is fixed",
                                 action="season.mode.changed", actor=actor, reason=reason)


def season_max_score_set(*, season: Season, max_score: int, actor: Actor, reason: str = "") -> Season:
    """Change a SCHEDULED season's score range to 0..max_score (audited
    `season.max_score.changed`): its layout follows the range, about 100 buckets over it
    (101 x 10,000 points over the default one). Fixed once the season opens."""
    if max_score == season.max_score:
        return season
    try:
        layout = BucketLayout.uniform(max_score=max_score, layout_id=season.bucket_layout.layout_id)
    except LayoutError as exc:
        raise SeasonError(str(exc)) from exc
    if season.tie_break == TIE_BREAK_FIRST_REACHED and (problem := first_reached_problem(
            layout=layout, starts_at=season.starts_at, cutoff=season.cutoff)):
        raise SeasonError(problem)
    return _scheduled_option_set(season=season, field="layout", value=layout.as_dict(),
                                 fixed="the score range is fixed", action="season.max_score.changed", actor=actor,
                                 reason=reason, shown="max_score")


def season_order_set(*, season: Season, order: str, actor: Actor, reason: str = "") -> Season:
    """Change a SCHEDULED season's order (audited `season.order.changed`): desc, a higher
    score ranks first; asc, a lower one. Fixed once the season opens."""
    if problem := order_problem(order):
        raise SeasonError(problem)
    return _scheduled_option_set(season=season, field="order", value=order, fixed="the order is fixed",
                                 action="season.order.changed", actor=actor, reason=reason)


def season_kind_set(*, season: Season, mode: str, order: str, max_score: int, actor: Actor,
                    reason: str = "") -> Season:
    """A SCHEDULED season's mode, order and score range at once, from the console's form:
    all or none (each audited when it changed)."""
    with transaction.atomic():
        if mode != season.mode:
            season = season_mode_set(season=season, mode=mode, actor=actor, reason=reason)
        if order != season.order:
            season = season_order_set(season=season, order=order, actor=actor, reason=reason)
        return season_max_score_set(season=season, max_score=max_score, actor=actor, reason=reason)


def _scheduled_option_set(*, season: Season, field: str, value: object, fixed: str, action: str, actor: Actor,
                          reason: str, shown: str | None = None) -> Season:
    """Set one of a season's options that are open to change only while it is SCHEDULED,
    under the season's lock, audited with the value before and after (nothing when it is
    the same). `fixed`: how the refusal names the option once the season opened; `shown`:
    the attribute the audit row records instead of the field (one derived from it)."""
    with transaction.atomic():
        locked = _locked_season(season)
        if locked.state != SeasonState.SCHEDULED:
            raise SeasonError(f"{fixed} once the season opens; it is {locked.state}")
        if getattr(locked, field) == value:
            return locked
        name = shown or field
        before = {name: getattr(locked, name)}
        setattr(locked, field, value)
        locked.save(update_fields=[field])
        audit_log(actor=actor, action=action, target_type="season", target_id=locked.slug,
                  season_slug=locked.slug, before=before, after={name: getattr(locked, name)}, reason=reason)
    return locked


# ------------------------------------------------------------------------ lifecycle


def _locked_season(season: Season) -> Season:
    """Take the season's write lock (exclusive: ingest batches hold it shared) and re-read the row."""
    ledger_store.season_write_lock(season_id=season.pk)
    return Season.objects.select_for_update().get(pk=season.pk)


def _season_snapshot(season: Season) -> dict[str, object]:
    # Regions and tie-break too: the opening row records the regions the season is fixed to.
    return {
        "state": season.state,
        "regions": season.regions,
        "tie_break": season.tie_break,
        "mode": season.mode,
        "order": season.order,
        "published_version": season.published_version,
        "final_version": season.final_version,
        "ingest_watermark": None if season.ingest_watermark is None else season.ingest_watermark.dump(),
    }


def season_transition(*, season: Season, target: SeasonState, actor: Actor, reason: str = "",
                      now: datetime | None = None) -> Season:
    """SCHEDULED -> OPEN and OPEN -> CLOSING, by the clock (beat, with its `now`) or by staff."""
    if target not in (SeasonState.OPEN, SeasonState.CLOSING):
        raise SeasonError(f"use the dedicated service to make a season {target}")
    with transaction.atomic():
        locked = _locked_season(season)
        before = _season_snapshot(locked)
        try:
            action = transition_check(current=locked.state, target=target, now=now or timezone.now(),
                                      cutoff=locked.cutoff)
        except TransitionError as exc:
            raise SeasonError(str(exc)) from exc
        locked.state = target.value
        locked.save(update_fields=["state"])
        audit_log(actor=actor, action=action, target_type="season", target_id=locked.slug, season_slug=locked.slug,
                  before=before, after=_season_snapshot(locked), reason=reason)
    return locked


def season_seal_ingest(*, season: Season, actor: Actor, reason: str = "", now: datetime | None = None) -> Season:
    """CLOSING -> FINALIZING: record the ingest high watermark of the change stream.

    Under the season's write lock no ingest transaction is in flight, so every change at
    or below the watermark is committed; results that arrive after it go to the
    late-results queue.
    """
    with transaction.atomic():
        locked = _locked_season(season)
        before = _season_snapshot(locked)
        try:
            action = transition_check(current=locked.state, target=SeasonState.FINALIZING, now=now or timezone.now(),
                                      cutoff=locked.cutoff)
        except TransitionError as exc:
            raise SeasonError(str(exc)) from exc
        # Every partition's newest change: under all the partitions' locks, nothing is in flight.
        txid, ident, vector = stream_last_watermark(season_id=locked.pk).columns()
        locked.ingest_watermark_txid, locked.ingest_watermark_id, locked.ingest_watermark_vector = txid, ident, vector
        locked.sealed_at = timezone.now()
        locked.state = SeasonState.FINALIZING.value
        locked.save(update_fields=["state", "sealed_at", "ingest_watermark_txid", "ingest_watermark_id",
                                   "ingest_watermark_vector"])
        audit_log(actor=actor, action=action, target_type="season", target_id=locked.slug, season_slug=locked.slug,
                  before=before, after=_season_snapshot(locked), reason=reason)
    return locked


def seasons_lifecycle_tick(*, now: datetime | None = None) -> list[str]:
    """What the clock calls for (Celery beat): open, close, seal, and build FINAL candidates."""
    now = now or timezone.now()
    done: list[str] = []
    seal_after = settings.SEAL_AFTER_CUTOFF_SECONDS
    for season in Season.objects.exclude(state=SeasonState.FINAL).select_related("series"):
        seal = seal_after if season.seal_after_seconds is None else season.seal_after_seconds
        due = due_transition(state=season.state, now=now, starts_at=season.starts_at, cutoff=season.cutoff,
                             cutoff_seal_seconds=seal)
        try:
            if due in (SeasonState.OPEN, SeasonState.CLOSING):
                season_transition(season=season, target=due, actor=SYSTEM, now=now)
                done.append(f"{season.slug}: {due}")
            elif due == SeasonState.FINALIZING:
                season_seal_ingest(season=season, actor=SYSTEM, reason="automatic seal after the cutoff", now=now)
                done.append(f"{season.slug}: sealed")
            elif season.state == SeasonState.FINALIZING and final_candidate_current(season=season) is None:
                # None yet, or the board moved on (a correction) since the last one.
                candidate = season_final_candidate_build(season=season, actor=SYSTEM)
                done.append(f"{season.slug}: candidate v{candidate.version}")
                if season.series is not None and season.series.approval == APPROVAL_AUTO:
                    if candidate.reconciliation_ok:
                        season_final_auto_approve(candidate=candidate)
                        done.append(f"{season.slug}: FINAL v{candidate.version} (auto)")
                    else:
                        done.append(f"{season.slug}: candidate v{candidate.version} failed its reconciliation; "
                                    "waiting for staff")
        except (SeasonError, FinalNotReady) as exc:
            done.append(f"{season.slug}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one broken season must not stop the others' clock
            log.exception("lifecycle tick failed for season %s", season.slug)
            done.append(f"{season.slug}: error {exc.__class__.__name__}")
    return done


# ---------------------------------------------------------------------------- FINAL


class FinalNotReady(SeasonError):
    code = "final_not_ready"


def _current_manifest(season: Season) -> Manifest | None:
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    return rankview.manifest_get(r, keys, version) if version else None


def season_final_candidate_build(*, season: Season, actor: Actor, sample: int | None = None) -> FinalCandidate:
    """Reconcile the current version against the ledger and record it as the FINAL candidate.

    Only once the version covers the ingest watermark: everything accepted before the
    seal is in it. Any failed check is recorded and blocks approval.
    """
    season.refresh_from_db()
    if season.state != SeasonState.FINALIZING:
        raise SeasonError(f"a {season.state} season has no FINAL candidate to build")
    manifest = _current_manifest(season)
    if manifest is None:
        raise FinalNotReady("no published version yet")
    sealed = season.ingest_watermark or Watermark()
    if not manifest.watermark >= sealed:
        raise FinalNotReady(
            f"version {manifest.version} covers the change stream up to {manifest.watermark}, "
            f"the seal is at {sealed}: waiting for the materializer"
        )
    report = version_reconcile(
        r=redis_get(), keys=season_keys(season), season_id=season.pk, version=manifest.version,
        sample=sample if sample is not None else settings.FINAL_SAMPLE_SIZE, season=season,
    )
    with transaction.atomic():
        FinalCandidate.objects.filter(
            season=season, status__in=[FinalCandidate.Status.BUILT, FinalCandidate.Status.PROPOSED]
        ).update(status=FinalCandidate.Status.SUPERSEDED)
        candidate = FinalCandidate.objects.create(
            season=season, version=manifest.version, built_at=timezone.now(), report=report.as_dict(),
            reconciliation_ok=report.ok,
        )
        audit_log(actor=actor, action="season.final.candidate_built", target_type="final_candidate",
                  target_id=str(candidate.pk), season_slug=season.slug,
                  after={"version": manifest.version, "reconciliation_ok": report.ok,
                         "failed_checks": [f.check for f in report.failures()]})
    return candidate


def _staff_id(actor: Actor) -> str:
    if actor.kind != "user" or not actor.id:
        raise SeasonError("only a staff member can propose, approve or reject FINAL standings")
    return actor.id


def season_final_propose(*, candidate: FinalCandidate, actor: Actor, reason: str = "") -> FinalCandidate:
    staff_id = _staff_id(actor)
    with transaction.atomic():
        locked = FinalCandidate.objects.select_for_update().get(pk=candidate.pk)
        if locked.status != FinalCandidate.Status.BUILT:
            raise SeasonError(f"candidate is {locked.status}, only a built candidate can be proposed")
        if not locked.reconciliation_ok:
            failed = [f["check"] for f in locked.report["findings"] if not f["ok"]]
            raise SeasonError(f"the reconciliation failed ({', '.join(failed)}): this candidate cannot be proposed")
        published = Season.objects.filter(pk=locked.season_id).values_list("published_version", flat=True).get()
        if locked.version != published:
            raise SeasonError(f"the board moved on (v{published}) since candidate v{locked.version}: build a new one")
        locked.status = FinalCandidate.Status.PROPOSED
        locked.proposed_by, locked.proposed_by_label, locked.proposed_at = staff_id, actor.label, timezone.now()
        locked.save(update_fields=["status", "proposed_by", "proposed_by_label", "proposed_at"])
        audit_log(actor=actor, action="season.final.proposed", target_type="final_candidate",
                  target_id=str(locked.pk), season_slug=locked.season.slug,
                  before={"status": FinalCandidate.Status.BUILT}, after={"status": locked.status,
                                                                         "version": locked.version},
                  reason=reason)
    return locked


def season_final_reject(*, candidate: FinalCandidate, actor: Actor, reason: str) -> FinalCandidate:
    staff_id = _staff_id(actor)
    if not reason.strip():
        raise SeasonError("a rejection needs a reason")
    with transaction.atomic():
        locked = FinalCandidate.objects.select_for_update().get(pk=candidate.pk)
        if locked.status not in (FinalCandidate.Status.BUILT, FinalCandidate.Status.PROPOSED):
            raise SeasonError(f"candidate is {locked.status}")
        before = locked.status
        locked.status = FinalCandidate.Status.REJECTED
        locked.decided_by, locked.decided_by_label, locked.decided_at = staff_id, actor.label, timezone.now()
        locked.decision_reason = reason
        locked.save(update_fields=["status", "decided_by", "decided_by_label", "decided_at", "decision_reason"])
        audit_log(actor=actor, action="season.final.rejected", target_type="final_candidate",
                  target_id=str(locked.pk), season_slug=locked.season.slug, before={"status": before},
                  after={"status": locked.status}, reason=reason)
    return locked


def season_final_approve(*, candidate: FinalCandidate, actor: Actor, reason: str = "") -> Season:
    """The second staff member approves: the standings are written to the database, hashed, and FINAL.

    Under the season's write lock: no correction can slip in between the check that the
    ledger still equals the candidate version and the copy of its standings.
    """
    staff_id = _staff_id(actor)
    with transaction.atomic():
        season = _locked_season(candidate.season)
        locked = FinalCandidate.objects.select_for_update().get(pk=candidate.pk)
        if season.state != SeasonState.FINALIZING:
            raise SeasonError(f"a {season.state} season cannot be approved")
        if locked.status != FinalCandidate.Status.PROPOSED:
            raise SeasonError(f"candidate is {locked.status}; it must be proposed first")
        check = approval_check(
            proposer_id=int(locked.proposed_by) if locked.proposed_by else None, approver_id=int(staff_id),
            reconciliation_ok=locked.reconciliation_ok, candidate_version=locked.version,
            published_version=season.published_version,
            approver_granted_by=staff_role_granters(user_id=int(staff_id)),
        )
        if not check.ok:
            raise SeasonError(check.reason)
        return _final_commit(season=season, candidate=locked, actor=actor, decided_by=staff_id, reason=reason)


def season_final_auto_approve(*, candidate: FinalCandidate) -> Season:
    """A window of a series with `--approval auto`: the system approves a built candidate
    whose reconciliation passed and whose version is still the published one, audited
    `season.final.approved` by the system. Anything else stays for staff."""
    with transaction.atomic():
        season = _locked_season(candidate.season)
        locked = FinalCandidate.objects.select_for_update().get(pk=candidate.pk)
        if season.series_id is None or Series.objects.get(pk=season.series_id).approval != APPROVAL_AUTO:
            raise SeasonError("only a window of a series with automatic approval is approved by the system")
        if season.state != SeasonState.FINALIZING:
            raise SeasonError(f"a {season.state} season cannot be approved")
        if locked.status != FinalCandidate.Status.BUILT:
            raise SeasonError(f"candidate is {locked.status}, only a built candidate is approved automatically")
        if not locked.reconciliation_ok:
            raise SeasonError("the reconciliation failed: this candidate is left for staff")
        if locked.version != season.published_version:
            raise SeasonError(f"the board moved on (v{season.published_version}) since candidate v{locked.version}")
        return _final_commit(season=season, candidate=locked, actor=SYSTEM, decided_by="",
                             reason="automatic approval: the series approves a reconciled candidate")


def _final_commit(*, season: Season, candidate: FinalCandidate, actor: Actor, decided_by: str,
                  reason: str) -> Season:
    """Write, hash and record the FINAL standings of an approved candidate (both locked
    by the caller's transaction), and make the season FINAL, audited."""
    manifest_row = ManifestRow.objects.get(season=season, version=candidate.version)
    newer = ScoreChange.objects.filter(season_id=season.pk).filter(changes_after_q(Watermark.from_columns(
        manifest_row.watermark_txid, manifest_row.watermark_id, manifest_row.watermark_vector)))
    if ledger_rows_exist(season=season, queryset=newer):
        raise SeasonError("the ledger changed after the candidate version: build a new candidate")
    digest, total = final_standings_write(season=season)
    if total != manifest_row.total_players:
        raise SeasonError(f"the standings hold {total} players, the candidate version {manifest_row.total_players}")
    manifest_row.is_final = True
    manifest_row.content_hash = digest
    manifest_row.save(update_fields=["is_final", "content_hash"])
    before = _season_snapshot(season)
    season.state = SeasonState.FINAL.value
    season.final_version = candidate.version
    season.finalized_at = timezone.now()
    season.save(update_fields=["state", "final_version", "finalized_at"])
    candidate.status = FinalCandidate.Status.APPROVED
    candidate.decided_by, candidate.decided_by_label, candidate.decided_at = decided_by, actor.label, timezone.now()
    candidate.decision_reason = reason
    candidate.save(update_fields=["status", "decided_by", "decided_by_label", "decided_at", "decision_reason"])
    audit_log(actor=actor, action="season.final.approved", target_type="season", target_id=season.slug,
              season_slug=season.slug, before=before,
              after={**_season_snapshot(season), "content_hash": digest, "total_players": total,
                     "proposed_by": candidate.proposed_by_label},
              reason=reason)
    return season


def final_standings_write(*, season: Season) -> tuple[str, int]:
    """Copy the ledger's current scores, ranked, into FinalStanding; return (SHA-256, rows).

    One INSERT ... SELECT with window functions: rank() is competition ranking and
    row_number() the display order of docs/rules.md, Ranking (byte order of player ids).
    In a first_reached season both order equal scores by reached_at, and rank() shares a
    rank only between equal (score, reached_at). In a season with regions the same two,
    partitioned by region, give each player with a region their regional place.

    A season whose partitions live in other databases too is ranked the same way from a
    temporary table in "default" that each database's rows are streamed into first
    (`_final_scores_gather`): the same rows ranked by the same statement, so the standings
    and their hash are the ones one database would give.
    """
    first_reached = season.tie_break == TIE_BREAK_FIRST_REACHED
    order = display_order_sql(first_reached=first_reached, ascending=season.order == ORDER_ASC)
    ties = order.split(", player_id")[0]  # the display order without its player_id
    # Regional places make the hash's lines longer (core.final_hash): the season says its rows have them.
    season.final_regional = bool(season.regions)
    if season.final_regional:
        regional = ("region, "
                    f"CASE WHEN region = '' THEN NULL ELSE row_number() OVER (PARTITION BY region {order}) END "
                    "AS regional_position, "
                    f"CASE WHEN region = '' THEN NULL ELSE rank() OVER (PARTITION BY region {ties}) END "
                    "AS regional_rank")
    else:
        # PlayerScore.region is "" here anyway; spelled out so such a season's rows never differ.
        # Typed NULLs: PostgreSQL takes an untyped one in a subquery for text.
        regional = "'' AS region, CAST(NULL AS bigint) AS regional_position, CAST(NULL AS bigint) AS regional_rank"
    tier_sql, tier_params = _tier_case_sql(season.tiers_parsed)
    # Hidden players are left out (docs/rules.md, Hidden players), as from every version.
    source = "leaderboard_playerscore WHERE season_id = %s AND NOT hidden" if ledger_is_default(season=season) else None
    with connection.cursor() as cursor:
        if source is None:
            _final_scores_gather(season=season)
            source = f"{_FINAL_SCORES} WHERE season_id = %s"
        cursor.execute(
            "INSERT INTO seasons_finalstanding (season_id, position, rank, player_id, score, reached_at, "
            "region, regional_position, regional_rank, tier) "
            f"SELECT season_id, position, rank, player_id, score, reached_at, region, regional_position, "
            f"regional_rank, {tier_sql} FROM ("
            f"SELECT %s AS season_id, row_number() OVER w AS position, rank() OVER ({ties}) AS rank, player_id, "
            f"score, {'reached_at' if first_reached else 'CAST(NULL AS timestamp with time zone)'} AS reached_at, "
            f"{regional}, "
            f"count(*) OVER () AS total "
            f"FROM {source} WINDOW w AS ({order})) AS ranked",
            [*tier_params, season.pk, season.pk],
        )
        if source.startswith(_FINAL_SCORES):
            cursor.execute(f"DROP TABLE {_FINAL_SCORES}")
    season.save(update_fields=["final_regional"])
    return final_standings_hash(season_id=season.pk)


def _tier_case_sql(tiers: Tiers | None) -> tuple[str, list[int | str]]:
    """The tier of a row with `rank` of `total` players in SQL (core.tiers.Tier.holds, in
    integers: a share P = n/d holds when rank * 100 * d <= n * total), and its parameters."""
    if tiers is None:
        return "NULL", []
    whens: list[str] = []
    params: list[int | str] = []
    for tier in tiers.tiers:
        if tier.top is not None:
            whens.append("WHEN rank <= %s THEN %s")
            params += [tier.top, tier.name]
        elif tier.share is not None:
            whens.append("WHEN rank * 100 * %s <= %s * total THEN %s")
            params += [tier.share.denominator, tier.share.numerator, tier.name]
        else:
            whens.append("ELSE %s")
            params.append(tier.name)
    return f"CASE {' '.join(whens)} END", params


# The temporary table a split season's current scores are gathered into for its standings.
_FINAL_SCORES = "final_scores_gathered"
_FINAL_COLUMNS = "season_id, player_id, score, reached_at, region"


def _final_scores_gather(*, season: Season) -> None:
    """Every ledger database's current scores of the season into a temporary table of
    "default" (this session's only), with the columns' own types: "default"'s rows by an
    INSERT ... SELECT, each other database's by a binary COPY streamed from it into this
    one, a chunk at a time (the rows never all in memory)."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {_FINAL_SCORES}")
        cursor.execute(f"CREATE TEMPORARY TABLE {_FINAL_SCORES} AS SELECT {_FINAL_COLUMNS} "
                       "FROM leaderboard_playerscore WITH NO DATA")
        for alias in ledger_databases_list(season=season):
            if alias == DEFAULT_DB_ALIAS:
                cursor.execute(f"INSERT INTO {_FINAL_SCORES} SELECT {_FINAL_COLUMNS} FROM leaderboard_playerscore "
                               "WHERE season_id = %s AND NOT hidden", [season.pk])
                continue
            with connections[alias].cursor() as source, source.copy(
                f"COPY (SELECT {_FINAL_COLUMNS} FROM leaderboard_playerscore WHERE season_id = %s AND NOT hidden) "
                "TO STDOUT (FORMAT BINARY)", [season.pk],
            ) as rows, cursor.copy(f"COPY {_FINAL_SCORES} FROM STDIN (FORMAT BINARY)") as into:
                for chunk in rows:
                    into.write(chunk)


def final_standings_hash(*, season_id: int) -> tuple[str, int]:
    """SHA-256 over the canonical standings (core.final_hash): one line per row, in position
    order, UTF-8. Anyone holding the rows can recompute it. A first_reached season's lines
    hold reached_at (UTC, milliseconds) so the hash covers the order of equal scores; a
    season with regions' lines hold each player's region and regional place."""
    line_format = final_line_format(season=Season.objects.get(pk=season_id))
    digest = hashlib.sha256()
    rows = 0
    query = (
        FinalStanding.objects.filter(season_id=season_id).order_by("position")
        .values_list("position", "rank", "player_id", "score", "reached_at", "region", "regional_position",
                     "regional_rank", "tier")
    )
    for position, rank, player_id, score, reached_at, region, regional_position, regional_rank, tier in \
            query.iterator(chunk_size=20_000):
        digest.update(line_format.line(
            position=position, rank=rank, player_id=player_id, score=score, reached_at=reached_text(reached_at),
            region=region, regional_position=regional_position, regional_rank=regional_rank, tier=tier,
        ).encode())
        rows += 1
    return digest.hexdigest(), rows
