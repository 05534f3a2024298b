"""LeaseFence: the fencing tokens of the coordinator leases come from the database."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0010_conflicts_append_only_and_season_samples'),
    ]

    operations = [
        migrations.CreateModel(
            name='LeaseFence',
            fields=[
                ('season_id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('token', models.BigIntegerField()),
            ],
        ),
    ]
