from django.apps import AppConfig


class LeaderboardConfig(AppConfig):
    name = "leaderboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The live boards subscribe to publications; the views never import them.
        from leaderboard.live.hub import live_version_published
        from leaderboard.views.signals import version_published

        version_published.connect(live_version_published, dispatch_uid="leaderboard.live.version_published")
