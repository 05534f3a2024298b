"""Reads of the queue of late results and held corrections, from each ledger database
holding the season's partitions."""

from __future__ import annotations

from dataclasses import dataclass

from leaderboard.ledger_databases import DEFAULT_ALIAS
from leaderboard.ledger_reads import ledger_databases_list, ledger_rows_merged
from leaderboard.models import LateResult
from seasons.models import Season
from seasons.staff.late_results.services import late_result_alias_of


@dataclass(frozen=True, slots=True)
class LateResultListed:
    """A late result and the database holding it: each numbers its own, so (alias, id) names one."""

    late: LateResult
    alias: str

    @property
    def in_default(self) -> bool:
        return self.alias == DEFAULT_ALIAS


def late_results(*, season: Season, status: str = LateResult.Status.PENDING) -> list[LateResultListed]:
    """The first 500 in arrival order, from each ledger database (a late result lives
    with its ledger event)."""
    # Each database's rows in the merge's own order: ids follow commit order, not the
    # arrival time a batch took before its locks.
    qs = LateResult.objects.filter(season=season).select_related("ledger_event").order_by("received_at", "id")
    if status:
        qs = qs.filter(status=status)
    rows = ledger_rows_merged(season=season, queryset=qs, key=lambda late: (late.received_at, late.pk), limit=500)
    return [LateResultListed(late=late, alias=late_result_alias_of(late)) for late in rows]


def late_result_get(*, season: Season, alias: str, late_id: int) -> LateResult | None:
    """The season's late result `late_id` of the database `alias` (None: no such row, or
    a database not holding the season's partitions; LedgerDatabaseMissing, a 503, when this
    server has no settings for one that does)."""
    if alias not in ledger_databases_list(season=season):
        return None
    return (LateResult.objects.using(alias).select_related("ledger_event")
            .filter(pk=late_id, season_id=season.pk).first())
