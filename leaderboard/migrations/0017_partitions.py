"""Ledger partitions: a stream head per (season, partition), and manifests and rebuild jobs
that record a watermark of several partitions.

A season's existing head becomes its partition 0's: commit numbers of partition 0 are the
plain numbers every season had, so nothing in the stream is renumbered. The watermark
columns keep partition 0's cursor; the vector is written only for a watermark that names
more partitions, so every existing row stays valid."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("seasons", "0011_season_partitions"),
        ("leaderboard", "0016_score_change_region_moves"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE TABLE leaderboard_streamhead_old AS SELECT season_id, head FROM leaderboard_streamhead",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.DeleteModel(name="StreamHead"),
        migrations.CreateModel(
            name="StreamHead",
            fields=[
                ("pk", models.CompositePrimaryKey("season_id", "partition", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("season", models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT,
                                             related_name="+", to="seasons.season")),
                ("partition", models.PositiveSmallIntegerField(default=0)),
                ("head", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunSQL(
            "INSERT INTO leaderboard_streamhead (season_id, partition, head) "
            "SELECT season_id, 0, head FROM leaderboard_streamhead_old; DROP TABLE leaderboard_streamhead_old",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddField(
            model_name="manifest",
            name="watermark_vector",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="rebuildjob",
            name="watermark_vector",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
