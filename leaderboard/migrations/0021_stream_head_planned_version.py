from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leaderboard", "0020_player_score_revoked_to"),
    ]

    operations = [
        migrations.AddField(
            model_name="streamhead",
            name="planned_version",
            field=models.BigIntegerField(default=0, db_default=0),
        ),
    ]
