from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from leaderboard.profiles import names_refill


class Command(BaseCommand):
    help = ("Write every player's display name and country from the database to Redis, where reads "
            "find them: after Redis lost its data, or onto a new Redis. Safe to run during writes.")

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(done: int) -> None:
            self.stdout.write(f"{done:,} profiles written")

        done = names_refill(progress=progress)
        self.stdout.write(f"names of {done:,} profiles written")
