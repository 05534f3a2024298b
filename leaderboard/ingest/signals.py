"""What ingest announces to the rest of the service.

The write path must not know who listens (the metrics counters, anything later): it sends
a signal once the batch's transaction commits, and listeners connect in their app's
ready(). A listener must never fail the request for trouble of its own (the metrics'
counting catches Redis errors): the batch is committed whether or not anyone is told.
"""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

# Sent with season_slug and outcomes (the batch's (status, reason) pairs, one per event,
# in batch order) once the transaction writing them commits, so that listeners need no query.
batch_committed = Signal()


def batch_committed_on_commit(*, season_slug: str, outcomes: list[tuple[str, str]], using: str) -> None:
    """Send `batch_committed` after the transaction on `using` commits (at once outside one)."""
    transaction.on_commit(lambda: batch_committed.send(sender=None, season_slug=season_slug, outcomes=outcomes),
                          using=using)
