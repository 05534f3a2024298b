from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from leaderboard.core.buckets import DEFAULT_BUCKET_WIDTH, MAX_SCORE
from leaderboard.core.events import parse_rfc3339
from leaderboard.core.season_options import MODE_BEST, MODES, ORDER_DESC, ORDERS, TIE_BREAK_SHARED, TIE_BREAKS
from leaderboard.core.series import APPROVAL_TWO_PERSON, APPROVALS, EVERIES
from seasons.series.services import series_create
from seasons.services import SeasonError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def duration_seconds(text: str) -> int:
    """'10m' -> 600; a number of seconds, minutes, hours or days."""
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.isdigit():
        raise CommandError(f"--grace takes a whole number with s, m, h or d (e.g. 10m), got {text!r}")
    return int(number) * _UNITS[unit]


class Command(BaseCommand):
    help = ("Create a series of recurring seasons: one season per window (SERIES_ID-1, SERIES_ID-2, ...), "
            "opened, sealed and proposed on time by the clock.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("series_id")
        parser.add_argument("--name", required=True)
        parser.add_argument("--every", required=True, choices=EVERIES, help="a window's length: a day, a week or a "
                            "calendar month")
        parser.add_argument("--anchor", required=True, help="when the first window starts (RFC 3339 with an offset)")
        parser.add_argument("--grace", default="10m", help="how long after a window's cutoff its ingest is sealed "
                            "(default 10m)")
        parser.add_argument("--approval", choices=APPROVALS, default=APPROVAL_TWO_PERSON,
                            help="two-person (default: two staff members approve each FINAL) or auto (the service "
                                 "approves a candidate whose reconciliation passed)")
        parser.add_argument("--mode", choices=MODES, default=MODE_BEST)
        parser.add_argument("--order", choices=ORDERS, default=ORDER_DESC)
        parser.add_argument("--tie-break", choices=TIE_BREAKS, default=TIE_BREAK_SHARED)
        parser.add_argument("--regions", default="", help="comma-separated region names of every window")
        parser.add_argument("--bucket-width", type=int, default=None,
                            help=f"points per score bucket (default {DEFAULT_BUCKET_WIDTH:,} over the default range, "
                                 "else the range in 100 buckets)")
        parser.add_argument("--max-score", type=int, default=MAX_SCORE,
                            help=f"every window's scores are in 0..N (default {MAX_SCORE:,}, at most 2^40)")
        parser.add_argument("--tiers", default="",
                            help="every window's named tiers, as create_season --tiers (default none)")

    def handle(self, *args: Any, **options: Any) -> None:
        anchor = parse_rfc3339(options["anchor"])
        if anchor is None:
            raise CommandError("--anchor must be an RFC 3339 date-time with an offset")
        try:
            series = series_create(
                slug=options["series_id"], name=options["name"], every=options["every"], anchor=anchor,
                grace_seconds=duration_seconds(options["grace"]), approval=options["approval"],
                mode=options["mode"], order=options["order"], tie_break=options["tie_break"],
                regions=[r.strip() for r in options["regions"].split(",") if r.strip()],
                bucket_width=options["bucket_width"], max_score=options["max_score"], tiers=options["tiers"],
                actor=Actor(kind="system", id="", label="manage.py create_series"),
            )
        except SeasonError as exc:
            raise CommandError(str(exc)) from exc
        windows = list(series.seasons.order_by("series_window").values_list("slug", "state"))
        self.stdout.write(f"series {series.slug} created: every {series.every} from {series.anchor.isoformat()}, "
                          f"approval {series.approval}")
        for slug, state in windows:
            self.stdout.write(f"window {slug}: {state}")
