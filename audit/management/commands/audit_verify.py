from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.services import audit_chain_verify


class Command(BaseCommand):
    help = ("Recompute the audit trail's hash chain; exits non-zero naming the first row that does not verify. "
            "Prints the head hash: record it elsewhere to detect a rewrite of the whole chain later.")

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_chain_verify()
        if not report.ok:
            where = f" (first broken row: id {report.broken_id}, seq {report.broken_seq})" if report.broken_id else ""
            raise CommandError(f"audit chain BROKEN after {report.checked} good rows{where}: {report.problem}")
        self.stdout.write(f"audit chain ok: {report.checked} rows, head seq {report.head_seq} hash {report.head_hash}")
