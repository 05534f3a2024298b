from django.apps import AppConfig


class LeaderboardConfig(AppConfig):
    name = "leaderboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The live boards subscribe to publications; the views never import them.
        # Registers the system check of the seasons' ledger databases.
        import leaderboard.ledger_databases  # noqa: F401
        from leaderboard.ingest.signals import batch_committed
        from leaderboard.live.announce import live_version_published
        from leaderboard.metrics.counters import batch_committed_count
        from leaderboard.recovery.rebuild import rebuild_job_queued
        from leaderboard.tasks import epoch_parts_enqueue, rebuild_job_enqueue
        from leaderboard.views.signals import epoch_parts_wanted, version_published

        version_published.connect(live_version_published, dispatch_uid="leaderboard.live.version_published")
        # Shadow builds run on the Celery workers.
        rebuild_job_queued.connect(rebuild_job_enqueue, dispatch_uid="leaderboard.tasks.rebuild_job_enqueue")
        # So do an epoch's parts, but the one its coordinator runs.
        epoch_parts_wanted.connect(epoch_parts_enqueue, dispatch_uid="leaderboard.tasks.epoch_parts_enqueue")
        # The metrics count a batch's outcomes once it commits; ingest never imports them.
        batch_committed.connect(batch_committed_count, dispatch_uid="leaderboard.metrics.batch_committed_count")
