"""Conflicting deliveries append-only again on SQLite: 0018 altered the table's foreign
keys, which SQLite does by rebuilding the table, and that dropped 0010's trigger there.
Nothing changes on PostgreSQL, whose ALTER TABLE kept it."""

from django.db import migrations

from audit.triggers import refuse_changes_again_on_sqlite


class Migration(migrations.Migration):

    dependencies = [
        ("leaderboard", "0018_ledger_databases"),
    ]

    operations = [
        refuse_changes_again_on_sqlite(table="leaderboard_scoreeventconflict",
                                       trigger="score_event_conflict_append_only",
                                       function="leaderboard_refuse_conflict_change",
                                       message="conflicting deliveries are append-only"),
    ]
