"""`make run`: the whole service on one machine, with a demo season and simulated matches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from audit.services import Actor
from config import embedded_redis
from leaderboard.services import api_client_create
from seasons.selectors import season_get
from seasons.services import season_create

DEMO_ACTOR = Actor(kind="system", id="", label="manage.py rundemo")


class Command(BaseCommand):
    help = "Run the service with a demo season: ASGI server, Celery worker and beat, match simulator."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--season", default="demo")
        parser.add_argument("--players", type=int, default=5000)
        parser.add_argument("--rate", type=int, default=500, help="simulated events per second")
        parser.add_argument("--no-simulator", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        slug = options["season"]
        if season_get(slug=slug) is None:
            now = timezone.now()
            season_create(
                slug=slug, name="Demo season", starts_at=now - timedelta(days=1),
                cutoff=now + timedelta(days=30), actor=DEMO_ACTOR,
            )
            self.stdout.write(f"created season {slug}")
        client, token = api_client_create(
            name=f"demo-match-service-{timezone.now():%Y%m%d%H%M%S}", scopes=["scores:write"],
            actor=DEMO_ACTOR,
        )
        base = f"http://{options['host']}:{options['port']}"
        python = sys.executable
        env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
        commands: list[tuple[str, list[str]]] = [
            ("web", [python, "-m", "uvicorn", "config.asgi:application", "--host", options["host"],
                     "--port", str(options["port"]), "--workers", "2", "--log-level", "warning"]),
            ("worker", [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "WARNING",
                        "--concurrency", "2"]),
            ("beat", [python, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                      "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]),
        ]
        if not options["no_simulator"]:
            commands.append(
                ("simulator", [python, "manage.py", "simulate_matches", slug, "--url", base,
                               "--token", token, "--players", str(options["players"]),
                               "--rate", str(options["rate"])])
            )
        children: list[tuple[str, subprocess.Popen[bytes]]] = []
        # A shell's background job starts with SIGINT ignored; Ctrl-C (and a SIGTERM from
        # a supervisor) must still stop everything this command started.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            for name, argv in commands:
                children.append((name, subprocess.Popen(argv, env=env, start_new_session=True)))
            self.stdout.write(
                "\n".join(
                    [
                        "",
                        f"  match-service token ({client.name}): {token}",
                        f"  write API   POST {base}/internal/v1/seasons/{slug}/scores:apply",
                        f"  health      {base}/healthz   {base}/readyz",
                        f"  admin       {base}/admin/",
                        f"  redis       {settings.REDIS_URL}{' (embedded)' if settings.REDIS_EMBEDDED else ''}",
                        f"  database    {settings.DATABASES['default']['NAME']}",
                        "  Ctrl-C stops everything.",
                        "",
                    ]
                )
            )
            while True:
                for name, proc in children:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                        return
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stdout.write("stopping…")
        finally:
            _stop(children)
            if settings.REDIS_EMBEDDED:
                embedded_redis.stop(settings.VAR_DIR)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(children: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    for _, proc in children:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for _, proc in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
