from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import (
    RebuildError,
    rebuild_jobs_fail_stale,
    rebuild_run,
    season_rebuild_start,
    season_split_propose,
)
from seasons.selectors import season_get


class Command(BaseCommand):
    help = ("Rebuild a season's rank views from the ledger in the foreground, with a progress bar; "
            "the old version serves until the shadow passes its comparison.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--split", help="comma-separated score boundaries: build a split layout instead")
        parser.add_argument("--reason", default="")
        parser.add_argument("--fail-stale", action="store_true",
                            help="only fail the season's jobs whose worker stopped beating (audited), then exit")
        parser.add_argument("--stale-seconds", type=float, default=None,
                            help="with --fail-stale: the heartbeat age that counts as stale "
                                 "(default REBUILD_STALE_SECONDS)")

    def handle(self, *args: Any, **options: Any) -> None:
        season = season_get(slug=options["slug"])
        if season is None:
            raise CommandError(f"no season {options['slug']!r}")
        actor = Actor(kind="system", id="", label="manage.py rebuild_views")
        if options["fail_stale"]:
            stale = options["stale_seconds"]
            if stale is not None and not stale > 0:
                raise CommandError("--stale-seconds must be a positive number")
            failed = rebuild_jobs_fail_stale(season=season, actor=actor, stale_seconds=stale)
            for job in failed:
                self.stdout.write(f"job {job.pk} ({job.kind}): {job.status}: {job.error}")
            self.stdout.write(f"{len(failed)} stale job(s) of {season.slug}")
            return
        try:
            if options["split"]:
                points: list[object] = [p.strip() for p in options["split"].split(",") if p.strip()]
                job = season_split_propose(season=season, actor=actor, split_points=points, reason=options["reason"])
            else:
                job = season_rebuild_start(season=season, actor=actor, reason=options["reason"])
        except RebuildError as exc:
            raise CommandError(str(exc)) from exc
        job = rebuild_run(job_id=job.pk, on_progress=self._bar)
        sys.stdout.write("\n")
        report = job.report or {}
        for finding in report.get("findings", []):
            mark = "ok  " if finding["ok"] else "FAIL"
            self.stdout.write(f"  {mark} {finding['check']}: {finding['detail']}"[:200])
        if job.status == RebuildJob.Status.FAILED:
            raise CommandError(f"rebuild {job.pk} failed, the old version keeps serving: {job.error}")
        if job.status == RebuildJob.Status.READY:
            self.stdout.write(f"split shadow {job.pk} is ready; publish it from the console")
        else:
            self.stdout.write(f"rebuild {job.pk}: {job.status}, version {job.published_version}")

    def _bar(self, job: RebuildJob) -> None:
        width = 40
        filled = int(width * job.percent / 100)
        eta = f"{job.eta_seconds:5.0f}s" if job.eta_seconds is not None else "   --"
        sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {job.percent:5.1f}% "
                         f"{job.done:>10,}/{job.total:,} {job.rate:>9,.0f}/s eta {eta} {job.status:<9}")
        sys.stdout.flush()
