"""RebuildJob: the PUBLISHING claim of a READY split, and the worker's heartbeat."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0007_ledger_hot_tables_without_fk_checks'),
    ]

    operations = [
        migrations.AddField(
            model_name='rebuildjob',
            name='heartbeat_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='rebuildjob',
            name='status',
            field=models.CharField(choices=[('queued', 'Queued'), ('building', 'Building'), ('comparing', 'Comparing'), ('ready', 'Ready'), ('publishing', 'Publishing'), ('published', 'Published'), ('failed', 'Failed'), ('discarded', 'Discarded')], default='queued', max_length=16),
        ),
    ]
