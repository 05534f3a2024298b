from __future__ import annotations

import getpass
import os
import sys
from typing import Any

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from seasons.staff.accounts.services import ROLES, staff_user_create
from seasons.staff.common import StaffError

PASSWORD_ENV = "STAFF_PASSWORD"


class Command(BaseCommand):
    help = ("Create a staff console account with one role (or change an existing account's role and password). "
            f"The password comes from --password, else ${PASSWORD_ENV}, else a prompt.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--password", help=f"visible in the process list; prefer ${PASSWORD_ENV} or the prompt")

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or os.environ.get(PASSWORD_ENV) or self._prompt()
        try:
            validate_password(password)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        try:
            user, created = staff_user_create(
                username=options["username"], role=options["role"], password=password,
                actor=Actor(kind="system", id="", label="manage.py create_staff"),
            )
        except StaffError as exc:
            raise CommandError(str(exc)) from exc
        verb = "created" if created else "updated"
        self.stdout.write(f"staff account {user.get_username()} {verb} with role {options['role']}")

    def _prompt(self) -> str:
        if not sys.stdin.isatty():
            raise CommandError(f"no password: pass --password, set ${PASSWORD_ENV}, or run in a terminal")
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the passwords differ")
        return first
