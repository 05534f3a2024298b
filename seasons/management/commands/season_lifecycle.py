from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from leaderboard.core.lifecycle import SeasonState
from seasons.models import FinalCandidate, Season
from seasons.selectors import final_candidate_current, season_get
from seasons.services import (
    FinalNotReady,
    SeasonError,
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_final_reject,
    season_seal_ingest,
    season_transition,
)
from seasons.staff.accounts.services import ROLE_PERMISSIONS, staff_role_of

ACTIONS = ("open", "close", "seal", "candidate", "propose", "approve", "reject")
# The states in which an action's step is already taken.
ALREADY = {
    "open": (SeasonState.OPEN, SeasonState.CLOSING, SeasonState.FINALIZING, SeasonState.FINAL),
    "close": (SeasonState.CLOSING, SeasonState.FINALIZING, SeasonState.FINAL),
    "seal": (SeasonState.FINALIZING, SeasonState.FINAL),
}
# The console permission each action needs of the staff member named by --as: the command
# acts as that person, so it checks what the console would.
ACTION_PERMISSIONS = {
    "open": "season_transition", "close": "season_transition", "seal": "season_transition",
    "candidate": "final_propose", "propose": "final_propose", "approve": "final_approve", "reject": "final_approve",
}


class Command(BaseCommand):
    help = "Move a season through its lifecycle by hand (the staff console does the same)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("action", choices=ACTIONS)
        parser.add_argument("--as", dest="username", help="the staff member acting (propose/approve/reject)")
        parser.add_argument("--reason", default="")
        parser.add_argument("--wait", type=float, default=30.0,
                            help="candidate: seconds to wait for the board to cover the seal (default 30)")

    def handle(self, *args: Any, **options: Any) -> None:
        season = season_get(slug=options["slug"])
        if season is None:
            raise CommandError(f"no season {options['slug']!r}")
        action = options["action"]
        actor = self._actor(options["username"], action)
        # With the service running, the clock takes these steps by itself (Celery beat):
        # one it already took is reported, not refused, so the steps run in any case.
        if SeasonState(season.state) in ALREADY.get(action, ()):
            self.stdout.write(f"{season.slug}: {season.state} already")
            return
        try:
            if action == "open":
                season = season_transition(season=season, target=SeasonState.OPEN, actor=actor,
                                           reason=options["reason"])
            elif action == "close":
                season = season_transition(season=season, target=SeasonState.CLOSING, actor=actor,
                                           reason=options["reason"])
            elif action == "seal":
                season = season_seal_ingest(season=season, actor=actor, reason=options["reason"])
            elif action == "candidate":
                candidate = final_candidate_current(season=season) or self._built(season, actor, options["wait"])
                failed = [f["check"] for f in candidate.report["findings"] if not f["ok"]]
                self.stdout.write(f"candidate #{candidate.pk}: v{candidate.version}, reconciliation "
                                  + ("ok" if candidate.reconciliation_ok else f"FAILED: {', '.join(failed)}"))
                return
            else:
                candidate = self._candidate(season.pk, action)
                if action == "propose":
                    season_final_propose(candidate=candidate, actor=actor, reason=options["reason"])
                elif action == "approve":
                    season = season_final_approve(candidate=candidate, actor=actor, reason=options["reason"])
                else:
                    season_final_reject(candidate=candidate, actor=actor, reason=options["reason"])
        except (SeasonError, FinalNotReady) as exc:
            raise CommandError(str(exc)) from exc
        season.refresh_from_db()
        self.stdout.write(f"{season.slug}: {season.state}")

    def _built(self, season: Season, actor: Actor, wait: float) -> FinalCandidate:
        """A new candidate, once the published board covers the seal (the epochs of a running
        service publish it within a second or two of the seal)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return season_final_candidate_build(season=season, actor=actor)
            except FinalNotReady:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)

    def _actor(self, username: str | None, action: str) -> Actor:
        if not username:
            return Actor(kind="system", id="", label="manage.py season_lifecycle")
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        role = staff_role_of(user)
        if ACTION_PERMISSIONS[action] not in ROLE_PERMISSIONS.get(role or "", ()):
            raise CommandError(f"{username} ({role or 'no staff role'}) may not {action}: "
                               f"that needs a role with {ACTION_PERMISSIONS[action]}")
        return Actor(kind="user", id=str(user.pk), label=user.get_username())

    def _candidate(self, season_id: int, action: str) -> FinalCandidate:
        wanted = FinalCandidate.Status.BUILT if action == "propose" else FinalCandidate.Status.PROPOSED
        candidate = FinalCandidate.objects.filter(season_id=season_id, status=wanted).order_by("-id").first()
        if candidate is None and action == "reject":
            candidate = FinalCandidate.objects.filter(season_id=season_id, status=FinalCandidate.Status.BUILT).first()
        if candidate is None:
            raise CommandError(f"no {wanted} FINAL candidate")
        return candidate
