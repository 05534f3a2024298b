"""Writes of the leaderboard app. Each is one transaction; audit rows go in the same one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from leaderboard.core.events import ScoreEvent
from leaderboard.core.ledger import (
    APPLIED,
    DUPLICATE,
    HELD,
    REJECTED,
    BatchPlan,
    Change,
    Outcome,
    RecordedEvent,
    batch_plan,
)
from leaderboard.core.lifecycle import LATE_AFTER_SEAL, SeasonState, admission_rejection
from leaderboard.core.partitions import Watermark, layout_partition, stream_heads_watermark
from leaderboard.core.season_options import MODE_LATEST, MODE_SUM, ORDER_ASC, TIE_BREAK_FIRST_REACHED
from leaderboard.core.tiebreak import reached_rejection
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import MAX_CURSOR_ID, stream_committed_watermark
from leaderboard.ingest.signals import batch_committed_on_commit
from leaderboard.ledger_databases import (
    DEFAULT_ALIAS,
    ledger_alias,
    ledger_alias_by_id,
    ledger_aliases,
    ledger_atomic,
    ledger_write_unnested_check,
    season_ledger_alias,
    season_ledger_is_split,
)
from leaderboard.models import ApiClient, ScoreChange, StreamHead
from seasons.models import FinalCorrection, Season

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class ApplyResult:
    outcomes: list[Outcome]
    leaderboard_version: int

    def as_dict(self) -> dict[str, object]:
        return {
            "results": [outcome.as_dict() for outcome in self.outcomes],
            "leaderboard_version": self.leaderboard_version,
        }


def score_events_apply(
    *, season: Season, events: list[ScoreEvent], client: ApiClient | None, actor: Actor | None = None,
    public_reason: str = "",
) -> ApplyResult:
    """Apply one validated batch to the ledger (docs/rules.md, Writes: per-event outcomes) in a single transaction.

    A constant number of statements per batch, whatever its size: lock the batch's ledger
    partitions, fetch prior events and player states, decide in memory, write everything
    (ledger, current scores, change stream) in one set-based statement.

    `actor` is the staff member whose approved correction this is (the revocation flow):
    from the seal on, only such a correction changes the board; one from the write API
    (`client`) is recorded as `held` and queued for staff review. `public_reason` is what
    the public FINAL corrections list says of a change to a FINAL season.

    The locks are the season's, shared, and those of the batch's ledger partitions
    (docs/architecture.md, Partitions): batches on disjoint partitions run in parallel. An event id is unique in
    the season across partitions; when a batch on another partition inserts the same new
    event id at the same moment, the unique index makes this one wait for it and fail,
    and the whole batch runs again: its event then sees the other's and is a duplicate or
    a conflict, and nothing of the first attempt was kept. Two such batches inserting two
    shared new ids in opposite orders wait for each other: PostgreSQL aborts one of them
    (a deadlock), and it runs again in the same way. A batch that loses every attempt is
    an outage for its client (503 with Retry-After): retrying it is safe.

    A season whose partitions live in one database (LEDGER_PARTITION_URLS) runs exactly
    this in that database, the season's lock staying in "default". One split over several
    databases commits one transaction per database (_split_batch_apply). Both refuse to
    run inside an open transaction (LedgerWriteNested): their commit in the other database
    could not be rolled back with it.
    """
    ledger_write_unnested_check(season=season)
    # Hashing needs no database state: do it before taking any lock.
    digests = [event.payload_hash() for event in events]
    if season_ledger_is_split(season=season):
        return _split_batch_apply(season=season, events=events, client=client, actor=actor,
                                  public_reason=public_reason, digests=digests)
    using = season_ledger_alias(season=season)
    plan, published = _part_apply_retrying(season=season, events=events, client=client, actor=actor,
                                           public_reason=public_reason, digests=digests, using=using)
    return ApplyResult(outcomes=plan.outcomes, leaderboard_version=published)


# A batch that lost an event-id race runs again; a third loss in a row answers 503.
EVENT_ID_RACE_ATTEMPTS = 3
_DEADLOCK_DETECTED = "40P01"


def _event_id_race(exc: IntegrityError | OperationalError) -> bool:
    """A concurrent insert of one of the batch's new event ids: the unique index refused
    it, or two such inserts in opposite orders deadlocked. Nothing else of the batch
    holds a lock two writers can take in opposite orders (partition locks are taken in
    ascending order), so a deadlock is always this race."""
    cause = exc.__cause__
    if isinstance(exc, OperationalError):
        return getattr(cause, "sqlstate", None) == _DEADLOCK_DETECTED
    diag = getattr(cause, "diag", None)
    return getattr(diag, "constraint_name", None) == "score_event_unique_event_id"


def _split_batch_apply(*, season: Season, events: list[ScoreEvent], client: ApiClient | None, actor: Actor | None,
                       public_reason: str, digests: list[str]) -> ApplyResult:
    """A batch of a season whose partitions span databases: per-database atomicity
    (docs/architecture.md, Ledger databases).

    1. The season's lock, shared, held by the "default" session across every part, so no
       lifecycle transition (the seal) runs between the parts' commits.
    2. The batch's event ids are claimed in "default" and the claims committed before any
       partition is written: an id stays unique in the season across databases, and its
       claim names the one partition that records it. An event whose claim carries another
       payload is a conflict (kept in the claim's database); one whose claim carries its
       own payload goes to the claim's partition, where the ledger decides it as ever
       (recorded there: a duplicate; not yet, after a batch that failed between its claim
       and its commit: applied now).
    3. One transaction per database, "default" first, each under its partitions' locks and
       re-reading the recorded events under them. A part that fails fails the request (503,
       retry-safe): the parts committed before it stay, and the batch sent again answers
       their events `duplicate` with their first outcome.
    """
    # Every database configured (LedgerDatabaseMissing otherwise) before anything is claimed.
    ledger_aliases(season=season)
    base, count = season.partition_base, season.partitions
    part_of = {e.player_id: layout_partition(e.player_id, base=base, partitions=count) for e in events}
    outcomes: list[Outcome | None] = [None] * len(events)
    published_seen: list[int] = []
    with ledger_store.season_lock_shared_hold(season_id=season.pk):
        claims = ledger_store.event_claims_take(
            season_id=season.pk, claims=[(e.event_id, part_of[e.player_id], d) for e, d in zip(events, digests,
                                                                                               strict=True)])
        # Each database's events in batch order, and the conflicts it keeps.
        parts: dict[str, list[int]] = {}
        conflicts: dict[str, list[int]] = {}
        for i, (event, digest) in enumerate(zip(events, digests, strict=True)):
            partition, claimed = claims[event.event_id]
            alias = ledger_alias(season=season, partition=partition)
            (parts if claimed == digest else conflicts).setdefault(alias, []).append(i)
        for alias in sorted(parts.keys() | conflicts.keys(), key=lambda a: (a != DEFAULT_ALIAS, a)):
            mine, theirs = parts.get(alias, []), conflicts.get(alias, [])
            conflict_plan = batch_plan(
                events=[events[i] for i in theirs], digests=[digests[i] for i in theirs], current={},
                recorded={events[i].event_id: _claimed_elsewhere(claims[events[i].event_id][1]) for i in theirs},
                rejection=lambda _: None, pending_version=0,
            )
            plan, published = _part_apply_retrying(
                season=season, events=[events[i] for i in mine], digests=[digests[i] for i in mine],
                client=client, actor=actor, public_reason=public_reason, using=alias, refused=conflict_plan)
            published_seen.append(published)
            for i, outcome in zip([*mine, *theirs], [*plan.outcomes, *conflict_plan.outcomes], strict=True):
                outcomes[i] = outcome
    assert all(o is not None for o in outcomes)
    return ApplyResult(outcomes=[o for o in outcomes if o is not None],
                       leaderboard_version=min(published_seen, default=season.published_version))


def _claimed_elsewhere(payload_hash: str) -> RecordedEvent:
    """What the ledger rules need to call an event whose id is claimed with another
    payload a conflict: only the claim's payload hash."""
    return RecordedEvent(payload_hash=payload_hash, status="", reason="", player_id="", score=None,
                         score_version=None, pending_version=None)


def _part_apply_retrying(*, season: Season, events: list[ScoreEvent], client: ApiClient | None,
                         actor: Actor | None, public_reason: str, digests: list[str], using: str,
                         refused: BatchPlan | None = None) -> tuple[BatchPlan, int]:
    for attempt in range(1, EVENT_ID_RACE_ATTEMPTS + 1):
        try:
            return _part_apply(season=season, events=events, client=client, actor=actor,
                               public_reason=public_reason, digests=digests, using=using,
                               refused=refused or BatchPlan())
        except (IntegrityError, OperationalError) as exc:
            if not _event_id_race(exc):
                raise
            if attempt == EVENT_ID_RACE_ATTEMPTS:
                raise OperationalError(f"the batch lost {attempt} event-id races in a row") from exc
            log.info("season %s: an event id of the batch was inserted concurrently; applying it again", season.slug)
    raise AssertionError("unreachable")


def _partitions_lock(*, season: Season, events: list[ScoreEvent], using: str,
                     ) -> tuple[tuple[Any, ...], dict[str, int]]:
    """Take the locks of the batch's partitions and read the season under them: its row
    (state, starts_at, cutoff, published_version, tie_break, regions, mode) and each player's
    partition. A repartition changes the layout under the season's lock, which the batch
    holds shared from its first lock on, so the layout read once the locks are held is
    the one the batch commits against; when it moved since the caller read the season,
    the new layout's partitions (numbered above the old ones: still ascending) are locked
    too. `using`: the partitions' database; the season's lock is in "default"."""
    base, count = season.partition_base, season.partitions
    held: set[int] = set()
    while True:
        players = {e.player_id for e in events}
        parts = {p: layout_partition(p, base=base, partitions=count) for p in players}
        if wanted := set(parts.values()) - held:
            ledger_store.partition_write_locks(season_id=season.pk, partitions=wanted, using=using)
            held |= wanted
        *row, base_now, count_now = Season.objects.filter(pk=season.pk).values_list(
            "state", "starts_at", "cutoff", "published_version", "tie_break", "regions", "mode", "partition_base",
            "partitions").get()
        if (base_now, count_now) == (base, count):
            return tuple(row), parts
        base, count = base_now, count_now


def _part_apply(*, season: Season, events: list[ScoreEvent], client: ApiClient | None, actor: Actor | None,
                public_reason: str, digests: list[str], using: str, refused: BatchPlan) -> tuple[BatchPlan, int]:
    """Decide and write `events` in the database `using` in one transaction there (and
    one on "default", committed after it: the season's lock, FINAL corrections and their
    audit rows). The whole batch on "default": exactly one transaction. `refused`: the
    conflicts of events whose id is claimed with another payload, kept with this part's
    rows (their outcomes are the caller's)."""
    now = timezone.now()
    with ledger_atomic(aliases=[DEFAULT_ALIAS, using], statement_timeout=settings.WRITE_STATEMENT_TIMEOUT_SECONDS):
        # Read under the locks: a lifecycle transition takes the season's lock exclusively,
        # so the state that admits these events is the one they commit against.
        row, partitions = _partitions_lock(season=season, events=events, using=using)
        state, starts_at, cutoff, published, tie_break, season_regions, mode = row
        planned = ledger_store.stream_planned_lock(season_id=season.pk, partitions=partitions.values(), using=using)
        first_reached = tie_break == TIE_BREAK_FIRST_REACHED
        recorded = ledger_store.recorded_events_fetch(
            season_id=season.pk, event_ids=(e.event_id for e in events), using=using,
        ) if events else {}
        current = ledger_store.player_states_fetch(
            season_id=season.pk, player_ids=(e.player_id for e in events), using=using,
        ) if events else {}
        summed = mode == MODE_SUM
        # The results the batch's corrections amend (a result and its corrections share
        # a player, so a partition: they are in this database).
        counted = ledger_store.counted_points_fetch(
            season_id=season.pk, event_ids=(e.corrects for e in events if e.corrects is not None), using=using,
        ) if summed else None

        def rejection(event: ScoreEvent) -> str | None:
            why = admission_rejection(
                state=state, starts_at=starts_at, cutoff=cutoff, completed_at=event.completed_at,
                kind=event.kind, staff_approved=actor is not None,
            )
            if why is None and first_reached:
                # A reached_at outside the season has no sort key (core.tiebreak).
                why = reached_rejection(reached_at=event.reached, starts_at=starts_at, cutoff=cutoff)
            return why

        plan = batch_plan(
            events=events,
            recorded=recorded,
            current=current,
            rejection=rejection,
            # The first version whose range can hold these changes: an epoch that fixed
            # its range before this batch (`planned`) leaves them to the version after.
            pending_version=max(published, planned) + 1,
            digests=digests,
            reached_orders=first_reached,
            staff=actor is not None,
            latest=mode == MODE_LATEST,
            summed=summed,
            counted=counted,
            max_score=season.max_score,
            ascending=season.order == ORDER_ASC,
        )
        plan.conflicts.extend(refused.conflicts)
        regions = ledger_store.player_regions_fetch(
            season_id=season.pk, season_regions=season_regions, player_ids=plan.player_states, using=using,
        ) if season_regions and plan.player_states else None
        ledger_store.batch_plan_write(
            season_id=season.pk, plan=plan, client_id=client.pk if client else None, now=now, regions=regions,
            partitions=partitions, using=using, hidden={p for p, held in current.items() if held.hidden},
        )
        # Both wait in one queue for staff: pre-cutoff results that arrived after the seal,
        # and corrections held since the seal.
        late = [row for row in plan.ledger_rows
                if (row.status == REJECTED and row.reason == LATE_AFTER_SEAL) or row.status == HELD]
        if late:
            ledger_store.late_results_record(season_id=season.pk, rows=late, now=now, using=using)
        if state == SeasonState.FINAL:
            changes = list(plan.changes)
            if using != DEFAULT_ALIAS:
                ledger_store.final_corrections_lock(season_id=season.pk)
                if actor is not None:
                    changes += _final_corrections_missing(season=season, plan=plan, using=using)
            if changes:
                reasons = {event.event_id: event.reason for event in events}
                pending = {o.event_id: o.pending_version for o in plan.outcomes}
                _final_corrections_record(season=season, changes=changes, reasons=reasons, pending=pending,
                                          actor=actor or _client_actor(client), now=now,
                                          public_reason=public_reason)
        outcomes = [(o.status, o.reason) for o in [*plan.outcomes, *refused.outcomes]]
        batch_committed_on_commit(season_slug=season.slug, outcomes=outcomes, using=DEFAULT_ALIAS)
    return plan, published


def season_version_range_plan(*, season: Season, version: int) -> Watermark:
    """The end of `version`'s range in the season's change stream, fixed for the epoch that
    publishes it: each partition's head read in the statement that marks `version` planned
    on it (ledger_store.stream_range_plan), so a batch committing after it answers the
    version after (`pending_version` exact). The current layout's partitions only: an
    older layout's take no writes (stream_committed_watermark reads their heads)."""
    partitions = range(season.partition_base, season.partition_base + season.partitions)
    if not ledger_store.is_postgres(using=DEFAULT_ALIAS):
        # SQLite: the database's write lock (BEGIN IMMEDIATE) orders the mark, the read
        # of the last change and every writer.
        with transaction.atomic():
            StreamHead.objects.bulk_create([StreamHead(season_id=season.pk, partition=p) for p in partitions],
                                           ignore_conflicts=True)
            StreamHead.objects.filter(season_id=season.pk, partition__in=partitions,
                                      planned_version__lt=version).update(planned_version=version)
            return stream_committed_watermark(season_id=season.pk)
    by_alias: dict[str, list[int]] = {}
    for partition in partitions:
        by_alias.setdefault(ledger_alias_by_id(season_id=season.pk, partition=partition), []).append(partition)
    heads: dict[int, int] = {}
    for alias, ids in by_alias.items():
        with transaction.atomic(using=alias):
            heads.update(ledger_store.stream_range_plan(season_id=season.pk, partitions=ids, version=version,
                                                        using=alias))
    return stream_heads_watermark(heads, last_id=MAX_CURSOR_ID)


def _client_actor(client: ApiClient | None) -> Actor:
    if client is None:
        return Actor(kind="system", id="", label="system")
    return Actor(kind="api_client", id=str(client.pk), label=client.name)


def _final_corrections_missing(*, season: Season, plan: BatchPlan, using: str) -> list[Change]:
    """The changes of staff corrections this batch resends, applied to the FINAL season
    before but without their FinalCorrection: their partition's database committed and
    "default", committing after it, failed. The resend writes them (and their audit rows)
    now, so a retry repairs what the failed commit lost."""
    resent = [o.event_id for o in plan.outcomes if o.status == DUPLICATE and o.first_status == APPLIED]
    if not resent:
        return []
    listed = set(FinalCorrection.objects.filter(season=season, event_id__in=resent).values_list("event_id", flat=True))
    missing = [event_id for event_id in resent if event_id not in listed]
    if not missing:
        return []
    finalized_at = Season.objects.filter(pk=season.pk).values_list("finalized_at", flat=True).get()
    if finalized_at is None:
        return []
    # Only what changed the board once it was FINAL: an event applied before is no correction of it.
    rows = ScoreChange.objects.using(using).filter(
        season_id=season.pk, event_id__in=missing, committed_at__gte=finalized_at).order_by("txid")
    return [Change(player_id=row.player_id, old_score=row.old_score, new_score=row.new_score,
                   score_version=row.score_version, event_id=row.event_id) for row in rows]


def _final_corrections_record(*, season: Season, changes: list[Change], reasons: dict[str, str],
                              pending: dict[str, int | None], actor: Actor, now: datetime,
                              public_reason: str) -> None:
    """A change to a FINAL season is listed beside the FINAL and audited; the FINAL itself never changes."""
    FinalCorrection.objects.bulk_create(
        FinalCorrection(
            season=season, player_id=c.player_id, score_before=c.old_score, score_after=c.new_score,
            event_id=c.event_id, pending_version=pending.get(c.event_id),
            actor_label=actor.label, reason=reasons.get(c.event_id, ""), created_at=now,
            actor_ref=actor.public_ref, public_reason=public_reason,
        )
        for c in changes
    )
    for c in changes:
        audit_log(actor=actor, action="season.final.correction", target_type="player", target_id=c.player_id,
                  season_slug=season.slug, before={"score": c.old_score},
                  after={"score": c.new_score, "score_version": c.score_version, "event_id": c.event_id},
                  reason=reasons.get(c.event_id, ""))
