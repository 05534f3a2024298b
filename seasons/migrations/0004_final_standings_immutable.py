"""FINAL standings are written once, on approval, and never change."""

from django.db import migrations

from audit.triggers import refuse_changes


class Migration(migrations.Migration):
    dependencies = [("seasons", "0003_final_standings")]
    operations = [
        refuse_changes(table="seasons_finalstanding", trigger="final_standing_immutable",
                       function="seasons_refuse_final_change", message="FINAL standings are immutable"),
    ]
