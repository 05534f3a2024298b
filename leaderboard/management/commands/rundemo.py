"""`make run`: the whole service on one machine, with a demo season and simulated matches."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from audit.services import Actor
from config import embedded_redis
from leaderboard.api_clients import api_client_create
from leaderboard.core.humanize import instant_text
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.profiles import MAX_PROFILE_BATCH, ProfileWrite
from leaderboard.core.series import APPROVAL_AUTO, EVERY_DAY
from leaderboard.ledger_databases import ledger_aliases_configured
from leaderboard.management.commands.simulate_matches import TOKEN_ENV
from leaderboard.profiles import player_profiles_apply
from leaderboard.simulation import player_ids
from seasons.models import Season, Series
from seasons.selectors import season_get
from seasons.series.selectors import series_current
from seasons.series.services import series_create, series_windows_open
from seasons.services import season_create
from seasons.staff.accounts.services import staff_user_create

DEMO_ACTOR = Actor(kind="system", id="", label="manage.py rundemo")
# One account per role, and a second approver so the two-person flows (FINAL approval,
# revocations, splits) can be tried: one proposes, the other approves.
DEMO_STAFF = (("viewer", "viewer"), ("reviewer", "reviewer"), ("approver", "approver"), ("approver2", "approver"))
# Stopped in this order, each with this long to go before it is killed: nothing is left
# writing into a server that is already gone, and the worker gets a warm shutdown (its
# main process alone is signalled, so it finishes its task and stops its own pool).
# The web server's: its 2 s of graceful shutdown, then its live hubs leaving their groups
# (live.routing.lifespan, up to ~6 s).
STOP_ORDER = (("simulator", 3.0), ("cup simulator", 3.0), ("web", 9.0), ("beat", 3.0), ("worker", 8.0))
# Children whose clean exit is expected: the cup's players stop at its cutoff.
ENDS_BY_ITSELF = frozenset({"cup simulator", "series simulator"})
CUP_SLUG = "demo-cup"
SERIES_SLUG = "demo-daily"
# The start of the warning Celery prints when it runs as root (celery.platforms).
CELERY_ROOT_WARNING = "You're running the worker with superuser privileges"


class Command(BaseCommand):
    help = "Run the service with a demo season: ASGI server, Celery worker and beat, match simulator."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--season", default="demo")
        parser.add_argument("--players", type=int, default=5000)
        parser.add_argument("--rate", type=int, default=500, help="simulated events per second")
        parser.add_argument("--no-simulator", action="store_true")
        parser.add_argument("--cup-minutes", type=float, default=5.0,
                            help="the demo cup's cutoff, minutes from now: a season to take to FINAL")

    def handle(self, *args: Any, **options: Any) -> None:
        # Every ledger database (LEDGER_PARTITION_URLS) runs the same migrations as "default".
        for alias in ledger_aliases_configured():
            call_command("migrate", verbosity=0, interactive=False, database=alias)
        slug = options["season"]
        if season_get(slug=slug) is None:
            now = timezone.now()
            season_create(
                slug=slug, name="Demo season", starts_at=now - timedelta(days=1),
                cutoff=now + timedelta(days=30), actor=DEMO_ACTOR, tiers=DEMO_TIERS,
            )
        _demo_names(player_ids(options["players"]))
        cup = _demo_cup(minutes=options["cup_minutes"])
        today = _demo_series()
        client, token = api_client_create(
            name=f"demo-match-service-{timezone.now():%Y%m%d%H%M%S}", scopes=["scores:write"],
            actor=DEMO_ACTOR,
        )
        token_file = _private_write(settings.VAR_DIR / "demo-token", token)
        staff = [(username, role, _demo_staff(username, role)) for username, role in DEMO_STAFF]
        base = f"http://{options['host']}:{options['port']}"
        python = sys.executable
        # The children resolve the same servers as this process, the embedded Redis included.
        env = {
            **os.environ, "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CHANNEL_LAYER_URL": ",".join(settings.CHANNEL_LAYER_URLS),
        }
        # Celery warns at length when run as root, which a container often is; it is not
        # something the demo's user can act on, and it buries the lines printed below. By
        # its message: a filter naming celery.exceptions' class is refused at interpreter
        # start, before celery can be imported ("Invalid -W option ignored").
        celery_env = {**env, "PYTHONWARNINGS": f"ignore:{CELERY_ROOT_WARNING}"}
        commands: list[tuple[str, list[str], dict[str, str]]] = [
            ("worker", [python, "-m", "celery", "-A", "config", "--quiet", "worker", "--loglevel", "WARNING",
                        "--concurrency", "2"], celery_env),
            ("beat", [python, "-m", "celery", "-A", "config", "--quiet", "beat", "--loglevel", "WARNING",
                      "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")], celery_env),
            ("web", [python, "-m", "uvicorn", "config.asgi:application", "--host", options["host"],
                     "--port", str(options["port"]), "--workers", "2", "--log-level", "warning",
                     "--no-access-log", "--timeout-graceful-shutdown", "2",
                     # The service reads client addresses itself (BEHIND_TLS_PROXY); uvicorn
                     # would otherwise take X-Forwarded-For from any local client.
                     "--no-proxy-headers",
                     # Compressed live-board messages built once per version, not per socket.
                     "--ws", "leaderboard.live.protocol:LiveWebSocketProtocol"], env),
        ]
        simulator = [python, "manage.py", "simulate_matches", slug, "--url", base, "--players",
                     str(options["players"]), "--rate", str(options["rate"]), "--report-every", "0"]
        # The cup's players play until its cutoff, a tenth of the demo's; then they stop.
        cup_seconds = (cup.cutoff - timezone.now()).total_seconds()
        cup_simulator = [python, "manage.py", "simulate_matches", cup.slug, "--url", base, "--players",
                         str(max(1, options["players"] // 10)), "--rate", str(max(1, options["rate"] // 10)),
                         "--report-every", "0", "--duration", f"{max(0.0, cup_seconds):.0f}"]
        # Today's window of the daily series gets a few players until its cutoff (midnight UTC).
        today_seconds = (today.cutoff - timezone.now()).total_seconds()
        today_simulator = [python, "manage.py", "simulate_matches", today.slug, "--url", base, "--players",
                           str(max(1, options["players"] // 10)), "--rate", str(max(1, options["rate"] // 10)),
                           "--report-every", "0", "--duration", f"{max(0.0, today_seconds):.0f}"]
        children: dict[str, subprocess.Popen[bytes]] = {}
        # A shell's background job starts with SIGINT ignored; Ctrl-C (and a SIGTERM from
        # a supervisor) must still stop everything this command started.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        terminal = _terminal_take()
        try:
            for name, argv, child_env in commands:
                # Their own sessions: the terminal's Ctrl-C reaches this command only, which
                # then stops them in order.
                children[name] = subprocess.Popen(argv, env=child_env, start_new_session=True)
            self._wait_ready(f"{base}/healthz", children)
            if not options["no_simulator"]:
                children["simulator"] = subprocess.Popen(
                    simulator, env={**env, TOKEN_ENV: token}, start_new_session=True
                )
                if cup_seconds > 1:
                    children["cup simulator"] = subprocess.Popen(
                        cup_simulator, env={**env, TOKEN_ENV: token}, start_new_session=True
                    )
                if today_seconds > 1:
                    children["series simulator"] = subprocess.Popen(
                        today_simulator, env={**env, TOKEN_ENV: token}, start_new_session=True
                    )
            sample = player_ids(1)[0]
            lines = [
                "",
                f"  Demo season {slug!r} is live at {base}",
                "",
                f"  live board      {base}/seasons/{slug}/live",
                f"  staff console   {base}/staff/   (passwords are new on every run)",
                *[f"                    {u:<10} {p}   role {r}" for u, r, p in staff],
                f"  demo cup        {base}/staff/seasons/{cup.slug}/   a short season to take to FINAL:",
                f"                  its cutoff is {instant_text(cup.cutoff)}; then approver seals it,",
                "                  reviewer proposes the FINAL candidate, approver2 approves it",
                f"                  (live board {base}/seasons/{cup.slug}/live)",
                f"  daily series    {base}/staff/series/{SERIES_SLUG}/   a season a day, opened, sealed and",
                f"                  approved by the clock; today's is {today.slug}",
                f"                  curl '{base}/v1/series/{SERIES_SLUG}'",
                f"  read API        curl '{base}/v1/seasons/{slug}/leaderboard/top?limit=10'",
                f"                  curl '{base}/v1/seasons/{slug}/players/{sample}/rank'",
                f"  API docs        {base}/api/docs/",
                f"  write API       POST {base}/internal/v1/seasons/{slug}/scores:apply",
                f"                  token (scores:write) in {token_file}",
                f"  health          {base}/healthz   {base}/readyz",
                f"  redis           {settings.REDIS_URL}{' (embedded)' if settings.REDIS_EMBEDDED else ''}",
                f"  celery broker   {_without_password(settings.CELERY_BROKER_URL)}",
                f"  channel layer   {', '.join(_without_password(url) for url in settings.CHANNEL_LAYER_URLS)}",
                f"  database        {settings.DATABASES['default']['NAME']}",
                "",
                "  Ctrl-C stops everything.",
                "",
            ]
            self.stdout.write("\n".join(lines))
            while True:
                for name, proc in children.items():
                    if proc.poll() is not None and not (name in ENDS_BY_ITSELF and proc.returncode == 0):
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                        return
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            started = time.monotonic()
            _stop(children)
            if settings.REDIS_EMBEDDED:
                embedded_redis.release(settings.VAR_DIR)
            self.stdout.write(f"stopped in {time.monotonic() - started:.1f} s")
            _terminal_give_back(terminal)

    def _wait_ready(self, url: str, children: dict[str, subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name, proc in children.items():
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited with {proc.returncode} while starting")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise CommandError(f"the web server did not answer {url} within 60 s")


# The demo season's tiers (create_season --tiers).
DEMO_TIERS = "Champion:top10,Diamond:1%,Gold:10%,Silver:50%,Bronze"
_NAME_PARTS = ("Nova", "Kai", "Mira", "Zed", "Luna", "Orin", "Sasha", "Teo", "Yuki", "Amélie", "Łukasz", "Ines")
_COUNTRIES = ("US", "DE", "BR", "JP", "KR", "FR", "PL", "SE", "IN", "MX", "ES", "CA")


def _demo_names(players: list[str]) -> None:
    """Names and countries for 9 of 10 demo players, as the profile service would send them
    (a first run writes them; a later one finds them stored, unchanged)."""
    writes = [ProfileWrite(player_id=p, region=None, profile_version=1, carries=frozenset({"display_name", "country"}),
                           display_name=f"{_NAME_PARTS[i % len(_NAME_PARTS)]} {i}",
                           country=_COUNTRIES[(i * 7) % len(_COUNTRIES)])
              for i, p in enumerate(players) if i % 10]
    for start in range(0, len(writes), MAX_PROFILE_BATCH):
        player_profiles_apply(profiles=writes[start:start + MAX_PROFILE_BATCH], client=None)


def _demo_series() -> Season:
    """The demo's daily series (automatic FINAL approval), its windows starting at midnight
    UTC, created once; today's window season. A series made by an earlier run has opened
    the windows it missed meanwhile."""
    series = Series.objects.filter(slug=SERIES_SLUG).first()
    if series is None:
        midnight = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        series = series_create(slug=SERIES_SLUG, name="Daily challenge", every=EVERY_DAY, anchor=midnight,
                               approval=APPROVAL_AUTO, grace_seconds=60, actor=DEMO_ACTOR)
    series_windows_open(series=series)
    today = series_current(series=series)
    assert today is not None
    return today


def _demo_cup(*, minutes: float) -> Season:
    """A short season to take to FINAL in the demo: open now, its cutoff `minutes` away. A
    cup from an earlier run that is still open is kept; one past its cutoff stays as it is
    (FINAL, perhaps) and a new one is created beside it (demo-cup-2, ...)."""
    now = timezone.now()
    for n in itertools.count(1):
        slug = CUP_SLUG if n == 1 else f"{CUP_SLUG}-{n}"
        existing = season_get(slug=slug)
        if existing is None:
            return season_create(slug=slug, name=f"Demo cup{'' if n == 1 else f' {n}'}",
                                 starts_at=now - timedelta(minutes=1), cutoff=now + timedelta(minutes=minutes),
                                 actor=DEMO_ACTOR)
        if existing.state == SeasonState.OPEN and existing.cutoff > now:
            return existing
    raise AssertionError("unreachable")


def _demo_staff(username: str, role: str) -> str:
    password = secrets.token_urlsafe(9)
    staff_user_create(username=username, role=role, password=password, actor=DEMO_ACTOR)
    return password


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def _private_write(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    os.chmod(path, 0o600)  # an older file keeps its mode through O_CREAT
    return path


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _terminal_take() -> tuple[int, int] | None:
    """In a terminal, become the terminal's foreground process group (as a shell does for
    a job), so that Ctrl-C reaches this command alone and not `make run` above it: make
    answers a Ctrl-C by waiting for its child and then printing "*** [run] Interrupt"
    and exiting 130, after the demo stopped cleanly. Returns (terminal, the group it
    had) for _terminal_give_back, or None outside a terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    try:
        before = os.tcgetpgrp(fd)
        if before == os.getpgrp():  # in the foreground (a background job leaves it be)
            os.setpgid(0, 0)
            _tcsetpgrp(fd, os.getpgrp())
            return fd, before
    except OSError:
        pass
    _terminal_closed(fd)
    return None


def _terminal_give_back(terminal: tuple[int, int] | None) -> None:
    if terminal is None:
        return
    fd, before = terminal
    with contextlib.suppress(OSError):
        _tcsetpgrp(fd, before)
    _terminal_closed(fd)


def _tcsetpgrp(fd: int, group: int) -> None:
    # A process outside the foreground group that changes it gets SIGTTOU (and stops)
    # unless it ignores it.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _terminal_closed(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _stop(children: dict[str, subprocess.Popen[bytes]]) -> None:
    # A second Ctrl-C while stopping must not abandon the children half-stopped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name, grace in STOP_ORDER:
        proc = children.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Whatever a child left in its session (a pool process, a uvicorn worker) goes too.
    for proc in children.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
