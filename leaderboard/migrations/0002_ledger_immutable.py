"""The ledger is append-only: the database itself refuses to rewrite a row."""

from django.db import migrations

from audit.triggers import refuse_changes


class Migration(migrations.Migration):
    dependencies = [("leaderboard", "0001_initial")]
    operations = [
        refuse_changes(table="leaderboard_scoreevent", trigger="score_event_append_only",
                       function="leaderboard_refuse_ledger_change", message="the score ledger is append-only"),
    ]
