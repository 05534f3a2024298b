from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from leaderboard.api_clients import api_client_deactivate
from leaderboard.core.errors import DomainError


class Command(BaseCommand):
    help = ("Deactivate an API client: its token stops authenticating (401). Audited. "
            "Rotate a token by creating a new client first, then deactivating the old one.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--reason", default="", help="why, for the audit trail")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            client = api_client_deactivate(
                name=options["name"], reason=options["reason"],
                actor=Actor(kind="system", id="", label="manage.py deactivate_api_client"),
            )
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"api client {client.name} deactivated")
