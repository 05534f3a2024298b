"""Which database holds each ledger partition of a season (docs/architecture.md, Ledger databases).

A season's ledger rows, current scores, change stream, stream heads, conflicts and late
results of partition p live in the database `ledger_alias(season=..., partition=p)`:
"default", or an alias LEDGER_PARTITION_URLS configured (`ledger_<database name>`).
Where they live is recorded on the season when it is created (Season.ledger_databases,
one alias per partition id; empty: all in "default") and never follows the setting
afterwards: a row is only ever looked for in the database it was written to. Everything
else (seasons, manifests, audit, the season's lock, event-id claims) stays in "default".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.db import connections, transaction

from leaderboard.core.errors import DomainError
from leaderboard.core.partitions import layout_partition

if TYPE_CHECKING:
    from seasons.models import Season

DEFAULT_ALIAS = "default"
# What a writer facing a season whose database this process lacks waits before it retries:
# a deployment fixes its settings in minutes, not seconds.
_MISSING_RETRY_AFTER = 60


class LedgerDatabaseMissing(DomainError):
    """A season's partitions live in a database this process has no settings for."""

    code = "ledger_database_missing"
    status = 503

    def __init__(self, *, season_slug: str, alias: str) -> None:
        super().__init__(
            f"season {season_slug}'s ledger partitions live in the database {alias!r}, which this server's "
            "LEDGER_PARTITION_URLS does not name",
            extra={"reason": "ledger_database_missing", "database": alias, "retry_after": _MISSING_RETRY_AFTER},
        )


def ledger_aliases_configured() -> list[str]:
    """"default", then every ledger database LEDGER_PARTITION_URLS names."""
    return [DEFAULT_ALIAS, *sorted(set(settings.LEDGER_PARTITION_ALIASES.values()))]


def ledger_placement_for(*, partitions: int) -> list[str]:
    """The alias of each partition 0..partitions-1 of a new season, as the setting places
    them; [] when every one is in "default" (a season exactly as before)."""
    placed = settings.LEDGER_PARTITION_ALIASES
    placement = [placed.get(p, DEFAULT_ALIAS) for p in range(partitions)]
    return placement if any(alias != DEFAULT_ALIAS for alias in placement) else []


def ledger_placement_extended(*, season: Season, partitions: int) -> list[str]:
    """The season's placement with `partitions` more partition ids (a repartition's new
    layout), in the one database the season's partitions share; [] for "default"."""
    aliases = list(ledger_aliases(season=season))
    if len(aliases) > 1:
        raise ValueError(f"season {season.slug}'s ledger partitions span the databases {', '.join(aliases)}")
    if not season.ledger_databases:
        return []
    total = season.partition_base + season.partitions
    return [*season.ledger_databases[:total], *[aliases[0]] * partitions]


def ledger_alias(*, season: Season, partition: int) -> str:
    """The database alias of partition id `partition` of `season`."""
    placement = season.ledger_databases
    if not placement:
        return DEFAULT_ALIAS
    if not 0 <= partition < len(placement):
        raise ValueError(f"season {season.slug} has no ledger partition {partition}")
    return _configured(season=season, alias=placement[partition])


def ledger_aliases(*, season: Season) -> dict[str, list[int]]:
    """Every database holding partitions of `season` (every partition id it ever had, the
    layouts before a repartition included) -> its partitions, ascending; "default" first,
    then in order of their first partition."""
    count = season.partition_base + season.partitions
    placement = season.ledger_databases
    if not placement:
        return {DEFAULT_ALIAS: list(range(count))}
    found: dict[str, list[int]] = {}
    for partition in range(count):
        found.setdefault(_configured(season=season, alias=placement[partition]), []).append(partition)
    if DEFAULT_ALIAS in found:
        found = {DEFAULT_ALIAS: found.pop(DEFAULT_ALIAS), **found}
    return found


def ledger_alias_of_player(*, season: Season, player_id: str) -> str:
    """The database of a player's ledger rows in the season's current layout."""
    partition = layout_partition(player_id, base=season.partition_base, partitions=season.partitions)
    return ledger_alias(season=season, partition=partition)


def season_ledger_is_split(*, season: Season) -> bool:
    """Whether the season's partitions live in more than one database."""
    return len(set(season.ledger_databases)) > 1


def season_ledger_alias(*, season: Season) -> str:
    """The one database of a season that is not split (ValueError for a split one)."""
    aliases = list(ledger_aliases(season=season))
    if len(aliases) > 1:
        raise ValueError(f"season {season.slug}'s ledger partitions span the databases {', '.join(aliases)}")
    return aliases[0]


# Season id -> its placement (Season.ledger_databases, or ("default",)): fixed for good
# once the season exists (a repartition keeps a season in its one database and refuses a
# split one), so the change-stream readers of every epoch look it up once per process.
_placements: dict[int, tuple[str, ...]] = {}


def season_placement_by_id(*, season_id: int) -> tuple[str, ...]:
    """The season's placement by id, cached: one alias when its partitions share a
    database (whatever partitions a repartition adds), else one per partition id."""
    placement = _placements.get(season_id)
    if placement is None:
        from seasons.models import Season

        row = Season.objects.filter(pk=season_id).values_list("slug", "ledger_databases").first()
        if row is None:
            # No such season: nothing of it anywhere (not cached: an id is never reused).
            return (DEFAULT_ALIAS,)
        slug, recorded = row
        distinct = list(dict.fromkeys(recorded or [DEFAULT_ALIAS]))
        for alias in distinct:
            if alias not in settings.DATABASES:
                raise LedgerDatabaseMissing(season_slug=slug, alias=alias)
        placement = _placements[season_id] = tuple(distinct if len(distinct) == 1 else recorded)
    return placement


def ledger_alias_by_id(*, season_id: int, partition: int) -> str:
    """ledger_alias for a season known by its id (the change-stream readers)."""
    placement = season_placement_by_id(season_id=season_id)
    return placement[0] if len(placement) == 1 else placement[partition]


def ledger_databases_by_id(*, season_id: int) -> list[str]:
    """Every database holding partitions of the season known by its id, "default" first."""
    distinct = list(dict.fromkeys(season_placement_by_id(season_id=season_id)))
    return sorted(distinct, key=lambda alias: alias != DEFAULT_ALIAS)


def ledger_placement_cache_clear() -> None:
    _placements.clear()


@contextlib.contextmanager
def ledger_atomic(*, aliases: Iterable[str], statement_timeout: float | None = None) -> Iterator[None]:
    """One transaction in each database, entered in the order given and committed in the
    reverse order. NOT atomic across databases: a failure while committing can leave the
    ones committed first committed. For work whose parts are each correct on their own
    (per-database atomicity), or that is read-only. `statement_timeout` (seconds): on
    PostgreSQL each statement inside gives up after it (an OperationalError, the
    transaction rolled back)."""
    with contextlib.ExitStack() as stack:
        for alias in dict.fromkeys(aliases):
            stack.enter_context(transaction.atomic(using=alias))
            if statement_timeout is not None and connections[alias].vendor == "postgresql":
                with connections[alias].cursor() as cursor:
                    # SET LOCAL: it ends with the transaction, the pooled session keeps none.
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)",
                                   [f"{max(1, round(statement_timeout * 1000))}ms"])
        yield


class LedgerWriteNested(RuntimeError):
    """A write of a season whose ledger lives outside "default" called inside an open
    transaction: a programming error, refused before anything is written."""


def ledger_write_unnested_check(*, season: Season) -> None:
    """Refuse a write of a season with partitions outside "default" inside an open
    transaction (of any database it touches). Such a write commits in the other database
    at once while an outer transaction on "default" could still roll back its claims,
    FINAL corrections and audit rows: the event would be recorded without its claim, and
    an outer rollback would be invisible to a retry. The test runner's own wrapping
    transaction (as for a durable atomic block) is not the caller's and does not count."""
    aliases = list(ledger_aliases(season=season))
    if aliases == [DEFAULT_ALIAS]:
        return
    for alias in dict.fromkeys([DEFAULT_ALIAS, *aliases]):
        blocks = connections[alias].atomic_blocks
        if blocks and not getattr(blocks[-1], "_from_testcase", False):
            raise LedgerWriteNested(
                f"season {season.slug}'s ledger partitions live outside the database 'default': its writes "
                f"commit per database and must not run inside a transaction (one is open on {alias!r})"
            )


def _configured(*, season: Season, alias: str) -> str:
    if alias not in settings.DATABASES:
        raise LedgerDatabaseMissing(season_slug=season.slug, alias=alias)
    return alias


@checks.register(checks.Tags.database)
def ledger_databases_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every database a season's partitions were placed in is configured here (run by
    `migrate` and `check --database default`): a server missing one answers 503 on that
    season's writes and reads."""
    if not databases or DEFAULT_ALIAS not in databases:
        return []
    from django.db import DatabaseError

    from seasons.models import Season

    try:
        placements = list(Season.objects.exclude(ledger_databases=[]).values_list("slug", "ledger_databases"))
    except DatabaseError:
        # Not migrated yet: no season can name a database.
        return []
    errors: list[checks.CheckMessage] = []
    for slug, placement in placements:
        for alias in sorted(set(placement) - set(settings.DATABASES)):
            errors.append(checks.Error(
                f"season {slug}'s ledger partitions live in the database {alias!r}, which LEDGER_PARTITION_URLS "
                "does not name",
                hint="add the database's URL to LEDGER_PARTITION_URLS (its alias is ledger_<database name>)",
                id="leaderboard.E001",
            ))
    return errors
