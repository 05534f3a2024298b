import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Per-season commit numbers for the change stream (models.StreamHead).

    Existing changes keep their transaction ids as commit numbers; each season's head
    starts at its largest, so new changes sort after every earlier one.
    """

    dependencies = [
        ("seasons", "0006_staff_roles"),
        ("leaderboard", "0008_rebuild_job_publishing_and_heartbeat"),
    ]

    operations = [
        migrations.CreateModel(
            name="StreamHead",
            fields=[
                (
                    "season",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="seasons.season",
                    ),
                ),
                ("head", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunSQL(
            "INSERT INTO leaderboard_streamhead (season_id, head) "
            "SELECT season_id, MAX(txid) FROM leaderboard_scorechange GROUP BY season_id",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
