"""Rank views on a Redis Cluster whose slots are being migrated, as `redis-cli --cluster
reshard` (or `--cluster add-node` followed by a reshard) migrates them while the service
runs: a slot MIGRATING on its master and IMPORTING on another, its keys moved one batch
at a time, then handed over with SETSLOT NODE.

While a slot is half-moved its master answers ASK for every key it no longer holds, and
TRYAGAIN for a multi-key command whose keys are split. The reads send what was refused
once more, behind ASKING, to the node named; the epoch's group writes do the same. Every
200 answers as the ledger at the version it names; what cannot be answered is a 503,
never a 500 or a wrong rank. The test holds the slots half-moved for as long as it reads,
which a reshard does for milliseconds a slot, so every read meets the migration."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    Events,
    apply_events,
    assert_matches_ledger,
    db_standings,
    epoch,
    keys_of,
    publish,
    reader_of,
)
from tests.support.cluster import LocalCluster, cluster_start, cluster_stop, rank_views_on

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAYERS = [f"g{i:03d}" for i in range(240)]
# What a read that cannot be answered raises: the API answers each with 503.
REFUSED: tuple[type[Exception], ...] = (rankview.Unavailable, *REDIS_OUTAGES)


@pytest.fixture(scope="module")
def migrating() -> Iterator[LocalCluster]:
    """This module's own cluster (3 masters): its slots are left half-moved by the tests."""
    cluster = cluster_start(masters=3, replicas=0)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_migrating(migrating: LocalCluster, settings: Any) -> Iterator[LocalCluster]:
    with rank_views_on(migrating, settings):
        yield migrating


class Migration:
    """Every slot holding the season's keys on the masters other than the control slot's,
    migrating to the control slot's master: begun, some or all of their keys moved, then
    ended with SETSLOT NODE. Nearly every read then meets a migrating slot."""

    def __init__(self, cluster: LocalCluster, season: Season) -> None:
        self.cluster = cluster
        keys = keys_of(season)
        self.target = cluster.key_master(keys.ptr)
        self.keys_by_slot: dict[int, tuple[int, list[bytes]]] = {}  # slot: (its master, its keys)
        for port in cluster.master_ports():
            if port == self.target:
                continue
            for key in cluster.node(port).scan_iter(match=f"{keys.prefix}*", count=1000):
                self.keys_by_slot.setdefault(cluster.key_slot(key), (port, []))[1].append(key)
        self.ids = {node.port: node.node_id for node in cluster.nodes()}

    def begin(self) -> None:
        for slot, (source, _) in self.keys_by_slot.items():
            self.cluster.node(self.target).execute_command("CLUSTER SETSLOT", slot, "IMPORTING", self.ids[source])
            self.cluster.node(source).execute_command("CLUSTER SETSLOT", slot, "MIGRATING", self.ids[self.target])

    def keys_move(self, *, share: float) -> int:
        """MIGRATE `share` of each slot's keys (at least one) to the target; returns how many."""
        moved = 0
        for source, keys in self.keys_by_slot.values():
            batch = keys[: max(1, round(len(keys) * share))]
            self.cluster.node(source).execute_command("MIGRATE", "127.0.0.1", self.target, "", 0, 5000, "KEYS", *batch)
            moved += len(batch)
        return moved

    def asking_count(self) -> int:
        """ASKING commands the target has run: each is a command a client sent it as ASK said."""
        stats = self.cluster.node(self.target).info("commandstats")
        return int(stats.get("cmdstat_asking", {}).get("calls", 0))

    def end(self) -> None:
        """The rest of each slot's keys moved, then the slot handed to the target on every
        master, as `--cluster reshard` finishes a slot."""
        for slot, (source, _) in self.keys_by_slot.items():
            node = self.cluster.node(source)
            while rest := node.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000):
                node.execute_command("MIGRATE", "127.0.0.1", self.target, "", 0, 5000, "KEYS", *rest)
            for port in (self.target, source, *self.cluster.master_ports()):
                self.cluster.node(port).execute_command("CLUSTER SETSLOT", slot, "NODE", self.ids[self.target])
        self.cluster.ready_wait()


def _season_published(season_factory: Callable[..., Season], slug: str) -> tuple[Season, Events, random.Random]:
    season = season_factory(slug=slug)
    rnd = random.Random(slug)
    events = Events(tag=slug)
    apply_events(season, [events.result(p, rnd.randint(0, 50_000)) for p in PLAYERS])
    publish(season)
    apply_events(season, [events.result(p, rnd.randint(0, 50_000)) for p in PLAYERS[::4]])
    publish(season)
    return season, events, rnd


def _reads_tally(season: Season) -> tuple[int, int]:
    """Rank and neighbours of every player and the top 100: each answer checked against
    the ledger at the version it names; returns (answered, refused with 503)."""
    expected = db_standings(season)
    reader = reader_of(season)
    answered = refused = 0
    for player_id in PLAYERS:
        try:
            view = reader.rank(player_id)
            _, me, around = reader.neighbors(player_id, 5)
        except REFUSED:
            refused += 1
            continue
        assert view.entry == expected.entry(player_id) == me, f"rank of {player_id}"
        assert around == expected.neighbors(player_id, 5), f"neighbours of {player_id}"
        answered += 1
    try:
        assert reader.top(100)[1] == [e.as_dict() for e in expected.top(100)]
        answered += 1
    except REFUSED:
        refused += 1
    return answered, refused


def _reads_tally_asked(season: Season, migration: Migration, label: str) -> tuple[int, int, int]:
    """`_reads_tally` during the migration, and how many commands it sent behind ASKING."""
    before = migration.asking_count()
    answered, refused = _reads_tally(season)
    asked = migration.asking_count() - before
    print(f"{label}: {answered} reads answered, {refused} refused (503), {asked} commands behind ASKING")
    return answered, refused, asked


def _epoch_tried(season: Season) -> int | None:
    """An epoch: the version it published, or None when a node refused a group write twice
    (the epoch fails whole and the next one, a second later in production, publishes)."""
    try:
        result = epoch(season)
    except REDIS_OUTAGES as exc:
        print(f"epoch refused: {exc}")
        return None
    assert result.status == "published", result
    return result.version


def test_reads_and_epochs_follow_ask_while_every_key_of_the_slots_has_moved(
        on_migrating: LocalCluster, season_factory: Callable[..., Season]) -> None:
    """The last moment of a slot's migration, before SETSLOT NODE: the source answers ASK
    for every key of the slot, the client's map still names the source. Reads go behind
    ASKING to the target (without, each was a 503 "slots still moving" until the
    hand-over); a script naming a key that exists on neither node (an empty hidden set)
    is refused with TRYAGAIN there too: a 503, never a wrong answer or a 500."""
    season, events, rnd = _season_published(season_factory, "ask-all")
    migration = Migration(on_migrating, season)
    migration.begin()
    assert migration.keys_move(share=1.0) > 0
    slots_cache = redis_get().nodes_manager.slots_cache  # type: ignore[attr-defined]
    assert all(slots_cache[slot][0].port == source for slot, (source, _) in migration.keys_by_slot.items())

    answered, refused, asked = _reads_tally_asked(season, migration, "every key moved")
    apply_events(season, [events.correction(p, rnd.randint(0, 50_000)) for p in PLAYERS[::3]])
    published = _epoch_tried(season)
    migration.end()  # the client's map now stale: MOVED, then the fresh map
    version = published or _epoch_tried(season)
    assert _reads_tally(season) == (len(PLAYERS) + 1, 0)
    assert assert_matches_ledger(season) == version
    # Most bucket reads name a key neither node holds (an empty bucket or hidden set) and
    # are refused with TRYAGAIN until the hand-over; the rest are answered through ASK.
    assert asked > 0 and answered > 0, (asked, answered, refused)


def test_reads_while_the_slots_are_half_moved_answer_as_the_ledger_or_503(
        on_migrating: LocalCluster, season_factory: Callable[..., Season]) -> None:
    """Half of each slot's keys moved: a read's keys may be split between two nodes, which
    Redis refuses for a multi-key script (TRYAGAIN) however often it is asked. Each read
    answers as the ledger or is Unavailable (503); then the epochs go on once the slots
    are handed over."""
    season, events, rnd = _season_published(season_factory, "ask-half")
    migration = Migration(on_migrating, season)
    migration.begin()
    migration.keys_move(share=0.5)
    answered, refused, asked = _reads_tally_asked(season, migration, "half-moved slots")

    apply_events(season, [events.correction(p, rnd.randint(0, 50_000)) for p in PLAYERS[::3]])
    published = _epoch_tried(season)
    migration.end()
    version = published or _epoch_tried(season)
    assert assert_matches_ledger(season) == version
    assert asked > 0 and answered > 0, (asked, answered, refused)
