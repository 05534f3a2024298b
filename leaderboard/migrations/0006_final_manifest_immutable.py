"""A manifest approved as FINAL keeps its hash: the database refuses to update or delete it."""

from django.db import migrations

from audit.triggers import refuse_changes


class Migration(migrations.Migration):
    dependencies = [("leaderboard", "0005_rebuilds_and_reconciliation")]
    operations = [
        refuse_changes(table="leaderboard_manifest", trigger="manifest_final_immutable",
                       function="leaderboard_refuse_final_manifest_change", message="a FINAL manifest is immutable",
                       when="OLD.is_final"),
    ]
