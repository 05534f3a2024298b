"""Conflicting deliveries become append-only and findable by event id; the server-side
samples behind the console's overview charts."""

import django.db.models.deletion
from django.db import migrations, models

from audit.triggers import refuse_changes


class Migration(migrations.Migration):

    dependencies = [
        ("leaderboard", "0009_stream_head"),
        ("seasons", "0006_staff_roles"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="scoreeventconflict",
            index=models.Index(fields=["season", "event_id"], name="score_conflict_by_event"),
        ),
        refuse_changes(table="leaderboard_scoreeventconflict", trigger="score_event_conflict_append_only",
                       function="leaderboard_refuse_conflict_change",
                       message="conflicting deliveries are append-only"),
        migrations.CreateModel(
            name="SeasonSample",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("slot", models.BigIntegerField()),
                ("sampled_at", models.DateTimeField()),
                ("events_total", models.BigIntegerField(null=True)),
                ("lag_sum", models.FloatField(null=True)),
                ("lag_count", models.BigIntegerField(null=True)),
                ("epoch_ms_sum", models.FloatField(null=True)),
                ("epoch_count", models.BigIntegerField(null=True)),
                ("ingest_per_second", models.FloatField(null=True)),
                ("publish_lag_seconds", models.FloatField(null=True)),
                ("backlog_seconds", models.FloatField()),
                ("epoch_ms", models.FloatField(null=True)),
                ("version", models.BigIntegerField()),
                ("version_age_seconds", models.FloatField(null=True)),
                ("season", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                             to="seasons.season")),
            ],
            options={
                "indexes": [models.Index(fields=["sampled_at"], name="season_sample_by_time")],
                "constraints": [models.UniqueConstraint(fields=("season", "slot"), name="season_sample_one_per_tick")],
            },
        ),
    ]
