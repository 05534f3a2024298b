"""`pending_version` is exact: the version a write is told is the first one that holds its
change, while epochs run back to back beside the writers. An epoch fixes its range by
marking the version it will publish on the stream heads in the statement that reads them
(ingest.services.season_version_range_plan), and a batch reads that mark with the heads
locked (ledger_store.stream_planned_lock): before, a batch committing while an epoch was
between reading the heads and publishing was told the epoch's version and landed in the
next one."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connections

from leaderboard.core.ledger import APPLIED
from leaderboard.models import Manifest as ManifestRow
from leaderboard.models import ScoreChange
from leaderboard.recovery.rebuild import season_epoch_advance
from seasons.models import Season
from tests.support import Events, apply_events, epoch, ledger_rows, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

# The writers and epochs run until this many versions are published beside them (a slow
# machine takes longer), for at most MAX_RUN_SECONDS.
VERSIONS = 8
MAX_RUN_SECONDS = 30.0
WRITERS = 2


def _first_versions(season: Season) -> dict[str, int]:
    """Each change's event id: the first version recorded whose watermark holds it."""
    versions = [(row.version, row.watermark) for row in ManifestRow.objects.filter(season=season).order_by("version")]
    first: dict[str, int] = {}
    for event_id, txid, ident in ledger_rows(ScoreChange, season, "event_id", "txid", "id"):
        first[event_id] = next((version for version, watermark in versions if watermark.covers(txid, ident)), 0)
    return first


def test_each_write_is_told_the_first_version_that_holds_it_while_epochs_run(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="pending-exact")
    events = Events(tag="pe")
    players = [f"q{i:04d}" for i in range(400)]
    apply_events(season, [events.result(p, i) for i, p in enumerate(players)])
    publish(season)

    told: dict[str, int] = {}
    failures: list[BaseException] = []
    stop = threading.Event()

    def write(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                batch = [events.result(p, rnd.randint(1_000, 900_000)) for p in rnd.sample(players, 5)]
                for outcome in apply_events(season, batch):
                    if outcome.status == APPLIED:
                        told[outcome.event_id] = outcome.pending_version
        except BaseException as exc:  # the test thread reports it
            failures.append(exc)
        finally:
            connections.close_all()

    def run_epochs() -> None:
        try:
            while not stop.is_set():
                season_epoch_advance(season=season)
                time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(seed,)) for seed in range(WRITERS)]
    threads.append(threading.Thread(target=run_epochs))
    for thread in threads:
        thread.start()
    started, recorded = time.monotonic(), ManifestRow.objects.filter(season=season).count()
    while (ManifestRow.objects.filter(season=season).count() < recorded + VERSIONS
           and time.monotonic() - started < MAX_RUN_SECONDS):
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert epoch(season).status in {"published", "idle"}  # the last writes, unless the thread's epoch took them

    first = _first_versions(season)
    versions = set(first.values())
    wrong = {event_id: (pending, first.get(event_id)) for event_id, pending in told.items()
             if first.get(event_id) != pending}
    print(f"{len(told)} writes over {len(versions)} versions; {len(wrong)} told another version")
    assert len(versions) >= 5, "too few versions published beside the writes to test anything"
    assert not wrong, sorted(wrong.items())[:10]
