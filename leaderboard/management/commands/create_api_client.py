from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from leaderboard.api_clients import api_client_create
from leaderboard.core.errors import DomainError
from leaderboard.models import ApiClient


class Command(BaseCommand):
    help = "Create an API client. Its token is printed once, as the last line, and never stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--scope", action="append", dest="scopes", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        if ApiClient.objects.filter(name=options["name"]).exists():
            raise CommandError(f"an API client named {options['name']!r} already exists")
        try:
            client, token = api_client_create(
                name=options["name"], scopes=options["scopes"],
                actor=Actor(kind="system", id="", label="manage.py create_api_client"),
            )
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"api client {client.name} created with scopes {', '.join(client.scopes)}")
        self.stdout.write(token)
