"""Ledger partitions of a season (docs/architecture.md, Partitions).

Every existing season keeps one partition numbered 0: its change stream, watermarks and
seal stay exactly what they were."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('seasons', '0010_final_standing_regions'),
    ]

    operations = [
        migrations.AddField(
            model_name='season',
            name='partitions',
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddField(
            model_name='season',
            name='partition_base',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='season',
            name='ingest_watermark_vector',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
