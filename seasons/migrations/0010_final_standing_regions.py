"""FINAL standings keep each player's region and regional position and rank.

Rows written before stay valid and keep their hash: region "" and no regional place, which
the check constraint admits, nothing is UPDATEd (the rows are immutable), and their season's
final_regional is false, so their lines stay the ones they were hashed with."""

from django.db import migrations, models

from audit.triggers import refuse_changes_again_on_sqlite


class Migration(migrations.Migration):

    dependencies = [
        ('seasons', '0009_final_standing_reached_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='season',
            name='final_regional',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='finalstanding',
            name='region',
            field=models.CharField(blank=True, db_default='', default='', max_length=16),
        ),
        migrations.AddField(
            model_name='finalstanding',
            name='regional_position',
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name='finalstanding',
            name='regional_rank',
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddConstraint(
            model_name='finalstanding',
            constraint=models.UniqueConstraint(condition=models.Q(('regional_position__isnull', False)), fields=('season', 'region', 'regional_position'), name='final_standing_unique_regional_position'),
        ),
        migrations.AddConstraint(
            model_name='finalstanding',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('region', ''), ('regional_position__isnull', True), ('regional_rank__isnull', True)), models.Q(models.Q(('region', ''), _negated=True), ('regional_position__isnull', False), ('regional_rank__isnull', False)), _connector='OR'), name='final_standing_regional_place_iff_region'),
        ),
        refuse_changes_again_on_sqlite(table="seasons_finalstanding", trigger="final_standing_immutable",
                                       function="seasons_refuse_final_change", message="FINAL standings are immutable"),
    ]
