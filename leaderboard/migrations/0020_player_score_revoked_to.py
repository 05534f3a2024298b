# A staff revocation stands until the match service acknowledges it with a correction:
# results that would raise the score above it are held meanwhile (docs/rules.md).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0019_conflicts_append_only_again_on_sqlite'),
    ]

    operations = [
        migrations.AddField(
            model_name='playerscore',
            name='revoked_to',
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
