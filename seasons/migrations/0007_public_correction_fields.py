from django.db import migrations, models


class Migration(migrations.Migration):
    """FINAL corrections name their actor by an opaque id and carry a public reason."""

    dependencies = [
        ("seasons", "0006_staff_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="scorerevocation",
            name="public_reason",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="finalcorrection",
            name="actor_ref",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="finalcorrection",
            name="public_reason",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
