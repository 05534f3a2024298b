"""What the rank views announce to the rest of the service.

Publication must not know who listens (the live boards, anything later): it sends a
signal once the transaction recording the version commits, and listeners connect in
their app's ready(). A listener must never raise: the version is published whether or
not anyone is told.
"""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

# Sent with season_slug, version, state (the season's lifecycle state) and final_version,
# the season's as the publishing transaction saw them, so that listeners need no query.
version_published = Signal()

# Sent with `specs` (a list of views.parts.PartSpec.as_json()): an epoch's parts the
# coordinator wants run on workers. It runs whatever nobody claims, so without a listener
# (no Celery: tests, a one-process deployment) every part still runs.
epoch_parts_wanted = Signal()

# Sent with season_id, copy and report (a views.parts.RangeReport) once every part of one
# apply reported: what each part did, where it ran and its CPU time (benchmarks, metrics).
epoch_parts_applied = Signal()


def version_published_on_commit(*, season_slug: str, version: int, state: str, final_version: int | None) -> None:
    """Send `version_published` after the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: version_published.send(
        sender=None, season_slug=season_slug, version=version, state=state, final_version=final_version))
