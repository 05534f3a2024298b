from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.text import slugify

from audit.services import Actor
from leaderboard.core.buckets import DEFAULT_BUCKET_WIDTH, MAX_SCORE, BucketLayout, LayoutError
from leaderboard.core.events import parse_rfc3339
from leaderboard.core.season_options import (
    MAX_REGIONS,
    MODE_BEST,
    MODES,
    ORDER_DESC,
    ORDERS,
    REGION_RULE,
    TIE_BREAK_SHARED,
    TIE_BREAKS,
)
from leaderboard.ledger_databases import ledger_aliases
from seasons.services import SeasonError, season_create


class Command(BaseCommand):
    help = "Create a season. Times are RFC 3339 with an offset, e.g. 2026-12-01T00:00:00Z."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--starts-at", required=True)
        parser.add_argument("--cutoff", required=True)
        parser.add_argument("--bucket-width", type=int, default=None,
                            help=f"points per score bucket (default {DEFAULT_BUCKET_WIDTH:,} over the default range: "
                                 "101 buckets; over another range, the range in 100 buckets)")
        parser.add_argument("--max-score", type=int, default=MAX_SCORE,
                            help=f"scores are integers in 0..N (default {MAX_SCORE:,}, at most 2^40); the buckets "
                                 "follow the range")
        parser.add_argument("--single-bucket", action="store_true", help="one bucket for the whole range")
        parser.add_argument("--regions", default="",
                            help=f"comma-separated region names, e.g. na,eu,apac (each {REGION_RULE}; at most "
                                 f"{MAX_REGIONS}; default none); changeable until the season opens")
        parser.add_argument("--tie-break", choices=TIE_BREAKS, default=TIE_BREAK_SHARED,
                            help="equal scores: shared (share a rank; default) or first_reached (who reached the "
                                 "score first ranks ahead)")
        parser.add_argument("--mode", choices=MODES, default=MODE_BEST,
                            help="how a result sets a score: best (the highest settled best score; default), "
                                 "latest (the newest settled value, even when lower) or sum (events carry points, "
                                 "the score is their sum; a correction amends one result's points)")
        parser.add_argument("--order", choices=ORDERS, default=ORDER_DESC,
                            help="which end ranks first: desc (a higher score; default) or asc (a lower one, race "
                                 "times)")
        parser.add_argument("--tiers", default="",
                            help="named tiers, best first, each bounded by a rank (topN) or a top share (P%%), the "
                                 "last unbounded, e.g. \"Champion:top100,Diamond:1%%,Gold:10%%,Silver:50%%,Bronze\" "
                                 "(default none)")
        parser.add_argument("--partitions", type=int, default=None,
                            help="ledger partitions (default SEASON_PARTITIONS); see manage.py season_repartition")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["slug"]
        if slugify(slug) != slug or len(slug) > 64:
            raise CommandError("SLUG must be lowercase letters, digits and dashes, at most 64 characters")
        starts_at = parse_rfc3339(options["starts_at"])
        cutoff = parse_rfc3339(options["cutoff"])
        if starts_at is None or cutoff is None:
            raise CommandError("--starts-at and --cutoff must be RFC 3339 date-times with an offset")
        try:
            layout = (BucketLayout.single(max_score=options["max_score"]) if options["single_bucket"]
                      else BucketLayout.uniform(width=options["bucket_width"], max_score=options["max_score"]))
        except LayoutError as exc:
            raise CommandError(str(exc)) from exc
        try:
            season = season_create(
                layout=layout, regions=[r.strip() for r in options["regions"].split(",") if r.strip()],
                tie_break=options["tie_break"], mode=options["mode"], order=options["order"],
                partitions=options["partitions"], tiers=options["tiers"],
                slug=slug, name=options["name"], starts_at=starts_at, cutoff=cutoff,
                actor=Actor(kind="system", id="", label="manage.py create_season"),
            )
        except SeasonError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"season {season.slug} created, state {season.state}, {season.partitions} ledger partitions")
        if season.ledger_databases:
            where = ledger_aliases(season=season)
            self.stdout.write("ledger databases: " + "; ".join(
                f"{alias} partitions {', '.join(map(str, parts))}" for alias, parts in where.items()))
        if (season.regions or season.tie_break != TIE_BREAK_SHARED or season.mode != MODE_BEST
                or season.max_score != MAX_SCORE or season.order != ORDER_DESC):
            self.stdout.write(f"regions: {', '.join(season.regions) or 'none'}; tie-break: {season.tie_break}; "
                              f"mode: {season.mode}; scores: 0..{season.max_score}, {season.order}")
        if season.tiers:
            self.stdout.write(f"tiers: {season.tiers}")
