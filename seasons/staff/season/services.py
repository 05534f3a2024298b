"""A season's console actions besides its lifecycle (seasons/services.py): a
reconciliation run on demand."""

from __future__ import annotations

from django.db import transaction

from audit.services import Actor, audit_log
from leaderboard.models import ReconciliationRun
from leaderboard.recovery.reconcile import reconciliation_run
from seasons.models import Season


def reconciliation_trigger(*, season: Season, actor: Actor) -> ReconciliationRun:
    """Run a reconciliation now; the run row and its audit row commit together."""
    with transaction.atomic():
        run = reconciliation_run(season=season)
        failed = [f["check"] for f in run.findings if not f["ok"]]
        audit_log(actor=actor, action="views.reconciliation.run", target_type="reconciliation_run",
                  target_id=str(run.pk), season_slug=season.slug,
                  after={"version": run.version, "ok": run.ok, "mode": run.mode, "failed_checks": failed})
    return run
