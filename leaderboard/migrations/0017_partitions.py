"""Ledger partitions: a stream head per (season, partition), and manifests and rebuild jobs
that record a watermark of several partitions.

A season's existing head becomes its partition 0's: commit numbers of partition 0 are the
plain numbers every season had, so nothing in the stream is renumbered. The watermark
columns keep partition 0's cursor; the vector is written only for a watermark that names
more partitions, so every existing row stays valid.

The stream heads are copied under an exclusive lock of the table: a writer of the
release before waits for it instead of committing an increment into the old table after
the copy (which would hand out its commit number a second time, below a reader's
cursor). Each head is seeded with the largest of its old value and the season's largest
commit number, so it is never below a number already in the stream. The old release
cannot write once this has run (its upsert names the old key): stop its writers first
(docs/operations.md, Upgrades). Irreversible: going back would restart every head at
partition 0's numbers and lose the partitioned seasons' heads."""

import django.db.models.deletion
from django.db import migrations, models


def _heads_lock(apps, schema_editor):
    # Held until the migration's transaction commits (PostgreSQL runs it in one). SQLite
    # has one writer at a time already.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("LOCK TABLE leaderboard_streamhead IN ACCESS EXCLUSIVE MODE")


class Migration(migrations.Migration):

    dependencies = [
        ("seasons", "0011_season_partitions"),
        ("leaderboard", "0016_score_change_region_moves"),
    ]

    operations = [
        migrations.RunPython(_heads_lock),
        migrations.RunSQL(
            "CREATE TABLE leaderboard_streamhead_old AS SELECT season_id, head FROM leaderboard_streamhead",
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
            "SELECT season_id, 0, max(head) FROM ("
            " SELECT season_id, head FROM leaderboard_streamhead_old"
            " UNION ALL SELECT season_id, max(txid) FROM leaderboard_scorechange"
            f" WHERE txid < {1 << 48} GROUP BY season_id) AS h GROUP BY season_id; "
            "DROP TABLE leaderboard_streamhead_old",
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
