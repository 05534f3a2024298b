"""A partial index of the change stream's region moves (event_id "region:<profile_version>"),
by player: the staff player page lists a player's moves in every season without scanning
the stream.

On PostgreSQL it is built CONCURRENTLY: the stream is the largest table and its writers
must not wait for the build (hence a migration outside a transaction)."""

from collections.abc import Callable
from typing import Any

from django.db import migrations, models

INDEX = models.Index(fields=["player_id", "season"], condition=models.Q(event_id__startswith="region:"),
                     name="score_change_region_moves")


def _index(operation: str) -> Callable[[Any, Any], None]:
    """`operation` (add_index or remove_index) of INDEX, CONCURRENTLY on PostgreSQL."""

    def run(apps: Any, schema_editor: Any) -> None:
        model = apps.get_model("leaderboard", "ScoreChange")
        concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
        getattr(schema_editor, operation)(model, INDEX, **concurrently)

    return run


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("leaderboard", "0015_player_regions_in_seasons"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="scorechange", index=INDEX)],
            database_operations=[migrations.RunPython(_index("add_index"), _index("remove_index"))],
        ),
    ]
