"""Reads of a season's ledger rows wherever its partitions live (docs/architecture.md, Reads across ledger databases).

A season's ScoreEvent, ScoreEventConflict, PlayerScore, ScoreChange, StreamHead and
LateResult rows of partition p live only in the database `ledger_alias(season, p)`
(leaderboard.ledger_databases). A reader asks each of the season's databases for what it
holds: a database holds only its own partitions' rows of the season, so a query needs no
restriction to them. A season all in "default" gets exactly its one query, on "default",
as before. Those databases hold no Season or ApiClient rows: a query sent there never
joins to them (no select_related of the season or the client; they are read from
"default").

A player's rows all live in the database of their partition: a split season cannot be
repartitioned (its new partitions would have to live where the old ones do).
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, transaction
from django.db.models import Model, QuerySet

from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias_of_player, ledger_aliases

if TYPE_CHECKING:
    from seasons.models import Season

_M = TypeVar("_M", bound=Model)
_Row = TypeVar("_Row")


def ledger_databases_list(*, season: Season) -> list[str]:
    """The aliases of the databases holding the season's ledger rows, "default" first."""
    return list(ledger_aliases(season=season))


def ledger_querysets_each(*, season: Season, queryset: QuerySet[_M, _Row]) -> list[QuerySet[_M, _Row]]:
    """`queryset` on each database holding the season's ledger rows (one for a season in one database)."""
    return [queryset.using(alias) for alias in ledger_aliases(season=season)]


def ledger_queryset_of_player(*, season: Season, player_id: str, queryset: QuerySet[_M, _Row]
                              ) -> QuerySet[_M, _Row]:
    """`queryset` on the database holding `player_id`'s ledger rows of the season."""
    return queryset.using(ledger_alias_of_player(season=season, player_id=player_id))


def ledger_rows_list(*, season: Season, queryset: QuerySet[_M, _Row]) -> list[_Row]:
    """Every row of `queryset` from each of the season's databases, database after database."""
    return [row for qs in ledger_querysets_each(season=season, queryset=queryset) for row in qs]


def ledger_rows_count(*, season: Season, queryset: QuerySet[_M, _Row]) -> int:
    return sum(qs.count() for qs in ledger_querysets_each(season=season, queryset=queryset))


def ledger_rows_exist(*, season: Season, queryset: QuerySet[_M, _Row]) -> bool:
    return any(qs.exists() for qs in ledger_querysets_each(season=season, queryset=queryset))


def ledger_rows_merged(*, season: Season, queryset: QuerySet[_M, _Row], key: Callable[[_Row], Any],
                       limit: int | None = None) -> list[_Row]:
    """The first `limit` rows (all: None) of `queryset` across the season's databases in
    the order `key` gives, `queryset` being ordered that way in each: each database's
    first `limit` rows, merged."""
    querysets = ledger_querysets_each(season=season, queryset=queryset)
    if len(querysets) == 1:
        return list(querysets[0] if limit is None else querysets[0][:limit])
    parts = [list(qs if limit is None else qs[:limit]) for qs in querysets]
    merged = heapq.merge(*parts, key=key)
    return list(merged) if limit is None else [row for _, row in zip(range(limit), merged, strict=False)]


@contextlib.contextmanager
def ledger_snapshot(*, season: Season, repeatable: bool = True) -> Iterator[list[str]]:
    """A read-only transaction on each of the season's databases (with `repeatable`, on
    PostgreSQL, REPEATABLE READ when it is the connection's outermost): each database's
    reads inside describe one moment of its partitions. Yields the aliases."""
    aliases = list(ledger_aliases(season=season))
    with contextlib.ExitStack() as stack:
        for alias in aliases:
            outer = connections[alias].in_atomic_block
            stack.enter_context(transaction.atomic(using=alias))
            if repeatable and not outer and connections[alias].vendor == "postgresql":
                with connections[alias].cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield aliases


def ledger_is_default(*, season: Season) -> bool:
    """Whether every ledger row of the season lives in "default" (the reads of old)."""
    return list(ledger_aliases(season=season)) == [DEFAULT_ALIAS]


def ledger_players_group(*, season: Season, player_ids: Iterable[str]) -> dict[str, list[str]]:
    """`player_ids` grouped by the database holding their ledger rows of the season."""
    grouped: dict[str, list[str]] = {}
    if ledger_is_default(season=season):
        return {DEFAULT_ALIAS: list(player_ids)}
    for player_id in player_ids:
        grouped.setdefault(ledger_alias_of_player(season=season, player_id=player_id), []).append(player_id)
    return grouped
