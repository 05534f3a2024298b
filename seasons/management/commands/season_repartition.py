from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from seasons.selectors import season_get
from seasons.services import SeasonError, season_repartition


class Command(BaseCommand):
    help = ("Move a season to another number of ledger partitions, online: batches wait for the moment it takes "
            "(every partition's write lock), nothing already written moves (docs/operations.md, Repartitioning "
            "a season).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("partitions", type=int, help="the new number of ledger partitions")
        parser.add_argument("--reason", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        season = season_get(slug=options["slug"])
        if season is None:
            raise CommandError(f"no season {options['slug']!r}")
        before = season.partitions
        try:
            season = season_repartition(season=season, partitions=options["partitions"], reason=options["reason"],
                                        actor=Actor(kind="system", id="", label="manage.py season_repartition"))
        except SeasonError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"season {season.slug}: {before} -> {season.partitions} ledger partitions "
                          f"(ids {season.partition_base}..{season.partition_base + season.partitions - 1}), "
                          f"state {season.state}")
