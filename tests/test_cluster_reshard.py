"""docs/operations.md's "Growing or shrinking a Redis Cluster" run for real, with redis-cli,
while the service serves: a 4th master started with the local cluster's options and
joined (`--cluster add-node`), 1/16 of the slots moved to it from every master (`--cluster
reshard --cluster-from all`), then every slot of it moved back to one master (the one
serving the season's control slot) and the node removed (`--cluster del-node`). Before
each step the test waits until `--cluster check` says every node agrees and no slot is
open, and every node knows every other one (check compares only the masters serving
slots: a node that has not heard of the empty new master refuses the reshard's SETSLOT);
a step that fails anyway gets `--cluster fix` and is run again, as the runbook says, and
what was retried is printed.

Meanwhile reader threads read every player's rank and neighbours and the top 100 through
the real read functions, a writer posts scores through the write API and epochs publish
in a thread of their own. Every 200 must be exactly the ledger's board at the version it
names; Unavailable or an outage (the API's 503) is allowed, anything else fails. The
reshards move slots one key a MIGRATE (`--cluster-pipeline 1`), and the season is one
whose control slot (the pointer and the copies' metas, in every read's round trips) is
among those the grow moves, so the readers meet its migration both ways: ASK while it
moves, MOVED once it has. Both are counted on the servers (INFO errorstats, and the
ASKING commands as tests/test_cluster_migration.py counts them) and in this process (the
refusals leaderboard/views/rankview/wire.py sends again, by the readers and the rest).
A slot migrates for milliseconds, and the keys every read names may move last: when no
read followed an ASK, the whole runbook runs again with a new node (at most 3 times)."""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from config.local_cluster import HOST, free_ports
from leaderboard.core.ranking import Standings
from leaderboard.models import ApiClient
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views import rankview
from leaderboard.views.rankview import wire
from leaderboard.views.rankview.keys import COPY_NAMES
from leaderboard.views.season_index import season_keys
from seasons.models import Season
from tests.support import Events, apply_events, assert_matches_ledger, epoch, keys_of, publish, reader_of
from tests.support.cluster import SLOTS, FailoverCluster, cluster_start, cluster_stop, rank_views_on
from tests.support.failover import failure
from tests.support.readload import LedgerWriter, version_standings

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAYERS = [f"rs{i:04d}" for i in range(3000)]
RADIUS = 5
# What a read that cannot be answered raises: the API answers each with 503.
REFUSED: tuple[type[Exception], ...] = (rankview.Unavailable, *REDIS_OUTAGES)
READERS = 4
READER_NAME = "reshard-reader"
# The grow's share of the slots: 1/16, the lowest 341 or 342 of each master (each slot costs
# redis-cli a handful of round trips and a nodes.conf fsync: 2-5 ms on a loaded 2-core machine).
GROW_SLOTS = SLOTS // 16
# Keys a MIGRATE: each slot holding keys stays migrating for as many round trips.
PIPELINE = 1
# `--cluster check` asked again until every node agrees, for up to this long.
AGREE_SECONDS = 20.0
# A redis-cli step run again after `--cluster fix` up to this many times in all.
STEP_ATTEMPTS = 4
# Grow and shrink again, up to this many times in all, until a read has met ASK.
CYCLES = 3
# Each phase lasts at least this long, so that the readers read through it whatever its step.
PHASE_MIN_SECONDS = 1.0
# Reads answered (200) each phase must reach, at the least.
PHASE_MIN_READS = 100
# As tests/support/failover.py: readers overlap the copies' mutations here (epochs every
# EPOCH_INTERVAL), so a real grace period, longer than a read's deadline on a loaded machine.
READ_DEADLINE_SECONDS = 1.0
COPY_GRACE_SECONDS = 1.5
EPOCH_INTERVAL = 0.3
PHASES = ("serving", "add-node", "grow", "shrink", "del-node", "after")


@pytest.fixture(scope="module")
def growing() -> Iterator[FailoverCluster]:
    """The module's own cluster (3 masters), which the test grows and shrinks. Started only
    in a session whose rank views are on a cluster, with redis-cli to run the runbook."""
    if not settings.REDIS_CLUSTER:
        pytest.skip("a Redis Cluster session's test: TEST_REDIS_CLUSTER=1 pytest tests/test_cluster_reshard.py")
    missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} to run the runbook (apt-get install redis-server)")
    cluster = cluster_start(masters=3, replicas=0)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_growing(growing: FailoverCluster, settings: Any) -> Iterator[FailoverCluster]:
    settings.READ_DEADLINE_SECONDS = READ_DEADLINE_SECONDS
    settings.COPY_GRACE_SECONDS = COPY_GRACE_SECONDS
    with rank_views_on(growing, settings):
        yield growing


# ------------------------------------------------------------------ phases and counts


class Phases:
    """The phase the test is in (each reader's and epoch's outcome is filed under it), when
    each began and ended, and the servers' counts of the refusals they answered meanwhile."""

    def __init__(self, cluster: FailoverCluster) -> None:
        self.cluster = cluster
        self.current = "setup"
        self.seconds: dict[str, float] = {}
        self.served: dict[str, Counter[str]] = {}
        self._began = time.monotonic()
        self._stats: dict[int, Counter[str]] = {}

    def begin(self, name: str) -> None:
        self._stats = self._snapshot()
        self.current = name
        self._began = time.monotonic()

    def end(self) -> None:
        """Ends the current phase, once it has lasted PHASE_MIN_SECONDS."""
        time.sleep(max(0.0, PHASE_MIN_SECONDS - (time.monotonic() - self._began)))
        now = self._snapshot()
        served: Counter[str] = Counter()
        for port, stats in now.items():
            served.update(stats - self._stats.get(port, Counter()))
        self.served.setdefault(self.current, Counter()).update(served)
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + time.monotonic() - self._began

    def _snapshot(self) -> dict[int, Counter[str]]:
        return {port: node_refusals(self.cluster, port) for port in self.cluster.live_ports()}


def node_refusals(cluster: FailoverCluster, port: int) -> Counter[str]:
    """What a node has answered its clients so far: ASK, MOVED and TRYAGAIN refusals (INFO
    errorstats) and the commands it ran behind ASKING, as it follows an ASK it gave."""
    node = cluster.node(port)
    errors, commands = node.info("errorstats"), node.info("commandstats")
    out = Counter({kind: int(errors.get(f"errorstat_{kind}", {}).get("count", 0))
                   for kind in ("ASK", "MOVED", "TRYAGAIN")})
    out["ASKING"] = int(commands.get("cmdstat_asking", {}).get("calls", 0))
    return out


class Refusals:
    """The cluster refusals this process's reads and writes met and sent again
    (wire._refused_resend, spied: nothing is changed), by phase, by who met them (the
    reader threads, or the rest: epochs and writes) and kind; "ASK answered" counts the
    commands an ASK named another node for that were then answered, "ASKING sends" the
    batches sent behind ASKING to the node an ASK named (wire._asked_client, spied too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, phases: Phases) -> None:
        self.phases = phases
        self.seen: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        resend = wire._refused_resend

        def spied(cluster: Any, calls: Any, out: list[Any], **kwargs: Any) -> None:
            asked = [i for i, reply in enumerate(out) if isinstance(reply, AskError)
                     and not isinstance(reply, MovedError)]
            kinds = Counter(_refusal_kind(reply) for reply in out)
            resend(cluster, calls, out, **kwargs)
            kinds["ASK answered"] = sum(1 for i in asked if not isinstance(out[i], Exception))
            self._add(kinds)

        def asked_spied(cluster: Any, host: str, port: int) -> Any:
            self._add(Counter({"ASKING sends": 1}))
            return asked_client(cluster, host, port)

        asked_client = wire._asked_client
        monkeypatch.setattr(wire, "_refused_resend", spied)
        monkeypatch.setattr(wire, "_asked_client", asked_spied)

    def _add(self, kinds: Counter[str]) -> None:
        who = "reads" if threading.current_thread().name.startswith(READER_NAME) else "others"
        phase = self.phases.current
        with self._lock:
            for kind, n in kinds.items():
                if kind and n:
                    self.seen[(phase, who, kind)] += n

    def reads_followed_ask(self) -> bool:
        """Whether the readers sent commands behind ASKING to the node an ASK named, and
        had commands answered after an ASK."""
        return self.count("reads", "ASKING sends") > 0 and self.count("reads", "ASK answered") > 0

    def count(self, who: str, kind: str, *, phase: str | None = None) -> int:
        return sum(n for (p, w, k), n in self.seen.items() if w == who and k == kind and phase in (None, p))

    def said(self, phase: str) -> str:
        return ", ".join(f"{who} {kind} {n}" for (p, who, kind), n in sorted(self.seen.items()) if p == phase) or "-"


def _refusal_kind(reply: Any) -> str:
    if isinstance(reply, MovedError):
        return "MOVED"
    if isinstance(reply, AskError):
        return "ASK"
    if isinstance(reply, TryAgainError):
        return "TRYAGAIN"
    if isinstance(reply, ClusterDownError):
        return "CLUSTERDOWN"
    return ""


# ------------------------------------------------------------------ the service's load


@dataclass(frozen=True, slots=True)
class Answer:
    phase: str
    kind: str  # rank, neighbors, top
    player: str
    version: int
    answer: Any


@dataclass
class Readers:
    """READERS threads, each reading every player's rank and neighbours (in an order of its
    own) and the top 100 every 50 players, through the real read functions, until stopped.
    A 200's answer is kept with its version, to be checked against the ledger afterwards."""

    slug: str
    phases: Phases
    answers: list[Answer] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (phase, what)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(READERS):
            thread = threading.Thread(target=self._run, args=(n,), name=f"{READER_NAME}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in self._threads), "the readers did not stop"

    def _run(self, n: int) -> None:
        reader = reader_of(self.slug)
        order = list(PLAYERS)
        random.Random(n).shuffle(order)
        at = 0
        while not self._stop.is_set():
            player = order[at % len(order)]
            self._read(reader, "rank", player)
            self._read(reader, "neighbors", player)
            if at % 50 == 0:
                self._read(reader, "top", "")
            at += 1

    def _read(self, reader: rankview.RankReader, kind: str, player: str) -> None:
        phase = self.phases.current
        try:
            answer: Any
            if kind == "rank":
                view = reader.rank(player)
                version, answer = view.manifest.version, view.entry
            elif kind == "neighbors":
                manifest, me, around = reader.neighbors(player, RADIUS)
                version, answer = manifest.version, (me, around)
            else:
                manifest, top = reader.top(100)
                version, answer = manifest.version, top
        except REFUSED as exc:
            self.refused.append((phase, f"{type(exc).__name__}: {exc}"[:80]))
            return
        except Exception as exc:  # noqa: BLE001 - every other exception is a 500: a finding
            self.failures.append(f"{phase}: {kind} {player}: {failure(exc)}")
            time.sleep(0.05)
            return
        self.answers.append(Answer(phase, kind, player, version, answer))

    def answered(self, phase: str) -> int:
        return sum(1 for a in self.answers if a.phase == phase)

    def refused_in(self, phase: str) -> int:
        return sum(1 for p, _ in self.refused if p == phase)

    def wrong(self, season: Season) -> list[str]:
        """Every answer against the ledger's board at the version it names; the mismatches."""
        boards: dict[int, Standings] = {}
        found = []
        for a in self.answers:
            if a.version not in boards:
                boards[a.version] = version_standings(season, a.version)
            expected = boards[a.version]
            if a.kind == "rank":
                ok = a.answer == expected.entry(a.player)
            elif a.kind == "neighbors":
                me, around = a.answer
                ok = me == expected.entry(a.player) and around == expected.neighbors(a.player, RADIUS)
            else:
                ok = a.answer == [e.as_dict() for e in expected.top(100)]
            if not ok:
                found.append(f"{a.phase}: {a.kind} {a.player} v{a.version}: {a.answer!r}"[:300])
        return found


class Epochs:
    """Epochs of the season in a thread of their own, every EPOCH_INTERVAL, as the beat runs
    them. An epoch refused by a node (an outage: the epoch fails whole, the next one
    publishes) is allowed; any other exception, or views found lost, is a failure."""

    def __init__(self, season: Season, phases: Phases) -> None:
        self.season_pk = season.pk
        self.phases = phases
        self.outcomes: list[tuple[str, str, int | None]] = []  # (phase, what, version published)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reshard-epochs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the epochs did not stop"

    def _run(self) -> None:
        try:
            season = Season.objects.get(pk=self.season_pk)  # this thread's own, on its own connection
            while not self._stop.wait(EPOCH_INTERVAL):
                phase = self.phases.current
                try:
                    result = epoch(season)
                except REDIS_OUTAGES as exc:
                    self.outcomes.append((phase, f"refused ({type(exc).__name__})", None))
                    continue
                except Exception as exc:  # noqa: BLE001 - a finding
                    self.failures.append(f"{phase}: {failure(exc)}")
                    continue
                if result.status in ("published", "idle", "skipped"):
                    self.outcomes.append((phase, result.status,
                                          result.version if result.status == "published" else None))
                else:
                    self.failures.append(f"{phase}: epoch {result.status}: {result.detail}")
        finally:
            connections.close_all()

    def published(self, *phases: str) -> list[int]:
        return [version for phase, _, version in self.outcomes if version is not None and phase in phases]

    def said(self, phase: str) -> str:
        counts = Counter(what for p, what, _ in self.outcomes if p == phase)
        return ", ".join(f"{what} x{n}" for what, n in counts.items()) or "-"


# ------------------------------------------------------------------ the runbook, with redis-cli


def redis_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """redis-cli's answer, uncoloured (it colours its [OK]/[ERR] lines on an xterm)."""
    return subprocess.run(["redis-cli", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, "TERM": "dumb"})


def _tail(done: subprocess.CompletedProcess[str], lines: int = 4) -> str:
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return " | ".join(said[-lines:])


class Runbook:
    """The runbook's redis-cli steps against the cluster, through its first master."""

    def __init__(self, cluster: FailoverCluster) -> None:
        self.cluster = cluster
        self.entry_port = cluster.master_ports()[0]
        self.entry = f"{HOST}:{self.entry_port}"
        self.new_port = 0
        self.new_id = ""
        self.retried: list[str] = []
        self.checks = 0
        self.waits: list[tuple[str, float]] = []  # (before or after what, seconds until the nodes agreed)

    # -- the cluster's state

    def check(self) -> tuple[bool, str]:
        """`--cluster check`: whether every node agrees about the slots, all are covered and
        none is open (no [ERR] or [WARNING]); and what it said."""
        done = redis_cli("--cluster", "check", self.entry, timeout=30)
        self.checks += 1
        out = done.stdout + done.stderr
        agreed = (done.returncode == 0 and "[OK] All nodes agree about slots configuration." in out
                  and f"[OK] All {SLOTS} slots covered." in out and "[ERR]" not in out and "[WARNING]" not in out)
        return agreed, out

    def acquainted(self) -> bool:
        """Whether every node of the cluster (as the entry node lists them) knows every other
        one by its id and address, none still in handshake.
        `--cluster check` compares the nodes' views of the slots' masters only: a node that
        has not heard of a master just added, which serves no slot yet, passes it, and then
        refuses the reshard's SETSLOT naming it ("ERR I don't know about node")."""
        def known(port: int) -> dict[str, int] | None:
            table = self.cluster.node(port).cluster("NODES")
            if any("handshake" in entry["flags"] or "noaddr" in entry["flags"] for entry in table.values()):
                return None
            return {entry["node_id"]: int(address.rsplit(":", 1)[1]) for address, entry in table.items()}

        members = known(self.entry_port)
        return members is not None and all(known(port) == members for port in members.values())

    def agreement_wait(self, what: str) -> float:
        """Until `--cluster check` says every node agrees and no slot is open, and every node
        knows every other one (asked again for up to AGREE_SECONDS: a node learns of another
        and of its slots by gossip); the seconds it took."""
        began = time.monotonic()
        while True:
            agreed, out = self.check()
            if agreed and self.acquainted():
                self.waits.append((what, time.monotonic() - began))
                return time.monotonic() - began
            if time.monotonic() - began > AGREE_SECONDS:
                problems = [line for line in out.splitlines() if "[ERR]" in line or "[WARNING]" in line]
                raise AssertionError(f"{what}: the nodes did not agree within {AGREE_SECONDS:.0f}s (check said "
                                     f"{'OK' if agreed else problems[:6] or out[-600:]}; every node knows every "
                                     f"other: {self.acquainted()})")
            time.sleep(0.25)

    def slots_of(self, node_id: str) -> list[int]:
        """The slots the entry node says `node_id` serves, in order."""
        for node in self.cluster.nodes(port=self.entry_port):
            if node.node_id == node_id:
                return [slot for first, last in node.slots for slot in range(first, last + 1)]
        return []

    def masters(self) -> dict[str, list[int]]:
        """Each master's id and its slots, as the entry node says."""
        return {node.node_id: [slot for first, last in node.slots for slot in range(first, last + 1)]
                for node in self.cluster.nodes(port=self.entry_port)
                if node.role == "master" and node.slots}

    # -- the steps

    def step(self, what: str, argv: Callable[[], list[str] | None]) -> None:
        """A redis-cli step once the nodes agree; failed (a node not agreeing yet, SETSLOT
        refused by a node that does not know the new master yet, a slot left open), the
        cluster fixed (`--cluster fix`) and the step run again, its arguments asked again
        (None: nothing left to do)."""
        for attempt in range(1, STEP_ATTEMPTS + 1):
            self.agreement_wait(f"before {what}")
            args = argv()
            if args is None:
                return
            done = redis_cli(*args)
            out = done.stdout + done.stderr
            if done.returncode == 0 and "[ERR]" not in out:
                return
            said = f"{what}, attempt {attempt}: exit {done.returncode}: {_tail(done)}"
            self.retried.append(said)
            print(f"\nretried: {said}")
            if attempt == STEP_ATTEMPTS:
                raise AssertionError(f"{what} failed {STEP_ATTEMPTS} times: {self.retried}")
            time.sleep(0.5)
            fixed = redis_cli("--cluster", "fix", self.entry, "--cluster-yes")
            self.retried.append(f"--cluster fix: exit {fixed.returncode}: {_tail(fixed, 2)}")

    def node_start(self) -> int:
        """A 4th redis-server, cluster-enabled with the cluster's own options (its
        `_node_start`), on a free port above the cluster's, answering PING."""
        for attempt in range(3):
            port = free_ports(count=1, start=max(self.cluster.ports) + 1)[0]
            self.cluster._node_start(port)
            try:
                self.cluster._ping_wait(port)
            except RuntimeError:  # another process took the port between the check and the bind
                if attempt == 2:
                    raise
                continue
            self.new_port = port
            self.new_id = self.cluster.node(port).execute_command("CLUSTER MYID").decode()
            return port
        raise AssertionError("unreachable")

    def add_node(self) -> None:
        def argv() -> list[str] | None:
            known = {node.node_id for node in self.cluster.nodes(port=self.entry_port)}
            if self.new_id in known:
                return None
            return ["--cluster", "add-node", f"{HOST}:{self.new_port}", self.entry]

        self.step("add-node", argv)

    def grow(self, slots: int, *, sources: str = "all") -> None:
        """`slots` slots to the new master from `sources` ("all" masters, or one's id)."""
        def argv() -> list[str] | None:
            left = slots - len(self.slots_of(self.new_id))
            if left <= 0:
                return None
            return ["--cluster", "reshard", self.entry, "--cluster-from", sources, "--cluster-to", self.new_id,
                    "--cluster-slots", str(left), "--cluster-yes", "--cluster-pipeline", str(PIPELINE)]

        self.step("reshard to the new master", argv)

    def shrink(self, to_id: str) -> None:
        def argv() -> list[str] | None:
            held = len(self.slots_of(self.new_id))
            if held == 0:
                return None
            return ["--cluster", "reshard", self.entry, "--cluster-from", self.new_id, "--cluster-to", to_id,
                    "--cluster-slots", str(held), "--cluster-yes", "--cluster-pipeline", str(PIPELINE)]

        self.step("reshard away from the new master", argv)

    def del_node(self) -> None:
        def argv() -> list[str] | None:
            known = {node.node_id for node in self.cluster.nodes(port=self.entry_port)}
            if self.new_id not in known:
                return None
            return ["--cluster", "del-node", self.entry, self.new_id]

        self.step("del-node", argv)
        # Removed from the cluster (and reset or shut down by redis-cli): stopped for good.
        process = self.cluster.processes[self.new_port]
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def reshard_moves(masters: dict[str, list[int]], slots: int) -> set[int]:
    """The slots `--cluster reshard --cluster-from all --cluster-slots N` takes from
    `masters` (redis-cli's clusterManagerComputeReshardTable): from each master, the
    biggest first, its share of N (rounded up for the first, down for the rest), its
    lowest slots first."""
    total = sum(len(held) for held in masters.values())
    moved: set[int] = set()
    for i, held in enumerate(sorted(masters.values(), key=len, reverse=True)):
        share = slots / total * len(held)
        take = math.ceil(share) if i == 0 else math.floor(share)
        moved.update(sorted(held)[: min(take, slots - len(moved))])
    return moved


def season_slug_moved(moves: set[int]) -> str:
    """The first of a few slugs whose season's control slot (every read's first round trip:
    the pointer, the copies' metas, the manifests) and at least two slot groups of its
    first index are among the slots the grow moves."""
    for n in range(5000):
        slug = f"reshard-{n}"
        keys = season_keys(slug)
        groups = {key_slot(keys.fence(COPY_NAMES[0], g).encode()) for g in range(settings.VIEW_SLOT_GROUPS)}
        if key_slot(keys.ptr.encode()) in moves and len(groups & moves) >= 2:
            return slug
    raise AssertionError("no slug's control slot among the slots moved")


def season_keys_on(cluster: FailoverCluster, port: int, season: Season) -> int:
    """How many of the season's keys the node on `port` holds."""
    return sum(1 for _ in cluster.node(port).scan_iter(match=f"{keys_of(season).prefix}*", count=1000))


# ------------------------------------------------------------------ the test


def test_grow_and_shrink_a_cluster_with_redis_cli_while_serving(
        on_growing: FailoverCluster, season_factory: Callable[..., Season], writer: tuple[ApiClient, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = on_growing
    began = time.monotonic()
    runbook = Runbook(cluster)
    moves = reshard_moves(runbook.masters(), GROW_SLOTS)
    season = season_factory(slug=season_slug_moved(moves))
    keys = keys_of(season)
    rnd = random.Random(29)
    events = Events(tag="rs")
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS])
    publish(season)
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS[::7]])
    first = publish(season)
    meta = rankview.copy_meta_load(redis_get(), keys, rankview.copies_get(redis_get(), keys)[0])
    assert meta is not None
    control = key_slot(keys.ptr.encode())
    season_slots = {control} | {key_slot(keys.fence(meta.index, g).encode()) for g in range(meta.groups)}
    published_at = time.monotonic()

    phases = Phases(cluster)
    refusals = Refusals(monkeypatch, phases)
    reads = Readers(season.slug, phases)
    writes = LedgerWriter(season.slug, PLAYERS, writer[1], seed=29)
    epochs = Epochs(season, phases)
    moved_keys = moved_slots = left_on_new = -1
    cycles = 0
    control_moved = False
    try:
        reads.start()
        writes.start()
        epochs.start()

        phases.begin("serving")
        phases.end()

        # The master serving the control slot: the shrink gives it every slot back.
        home = next(i for i, held in runbook.masters().items() if control in held)
        while True:
            cycles += 1
            phases.begin("add-node")
            runbook.node_start()
            runbook.add_node()
            runbook.agreement_wait("after add-node")
            phases.end()

            phases.begin("grow")
            if cycles == 1:
                runbook.grow(GROW_SLOTS)
            else:
                # Again: from the control slot's master alone, up to the control slot (its
                # lowest slots are those the shrink gave it, then its own).
                runbook.grow(sorted(runbook.masters()[home]).index(control) + 1, sources=home)
            runbook.agreement_wait("after the reshard to the new master")
            on_new = set(runbook.slots_of(runbook.new_id))
            moved_slots = len(on_new & season_slots)
            control_moved = control in on_new
            moved_keys = season_keys_on(cluster, runbook.new_port, season)
            phases.end()

            phases.begin("shrink")
            runbook.shrink(home)
            runbook.agreement_wait("after the reshard away from the new master")
            # Emptied, the node turns into a replica of `home` (cluster-allow-replica-migration,
            # so no reshard can take it as a target again): its keys are then home's, so its
            # own slots are what is counted.
            left_on_new = len(runbook.slots_of(runbook.new_id))
            phases.end()

            phases.begin("del-node")
            runbook.del_node()
            runbook.agreement_wait("after del-node")
            cluster.ready_wait(timeout=30)
            phases.end()
            if refusals.reads_followed_ask() or cycles == CYCLES:
                break
            # A slot is migrating for milliseconds: the readers may miss every moment of it
            # in which a key they read has moved and its slot has not (few when the keys
            # every read names, the pointer and the copies' metas, move last). Once more,
            # with a new node.
            print(f"\nno read followed an ASK in grow-and-shrink {cycles}: once more")

        phases.begin("after")
        deadline = time.monotonic() + 20
        while not epochs.published("after") and time.monotonic() < deadline:
            time.sleep(0.1)
        phases.end()
    finally:
        writes.stop()
        epochs.stop()
        reads.stop()
        phases.current = "final"

    final = None
    for _ in range(20):  # the writes stopped: one more version covers all of them
        try:
            result = epoch(season)
        except REDIS_OUTAGES:
            time.sleep(0.3)
            continue
        assert result.status in ("published", "idle"), result
        final = result.version
        break
    assert final is not None, "no epoch after the writes stopped"
    version = assert_matches_ledger(season, exhaustive=False)
    wrong = reads.wrong(season)
    seconds = time.monotonic() - began

    print(f"\ngrow and shrink with redis-cli (season {season.slug}, {len(PLAYERS)} players, v{first} published "
          f"in {published_at - began:.1f}s): {GROW_SLOTS} slots to the new master on port {runbook.new_port} "
          f"and back ({cycles} time{'s' if cycles > 1 else ''}), {moved_slots} of the season's {len(season_slots)} "
          f"slots ({moved_keys} keys) moved there, {left_on_new} slots left after the shrink; "
          f"{runbook.checks} `--cluster check`s; retried: "
          f"{runbook.retried or 'nothing'}; the control slot {control} moved: {control_moved}; waited for "
          f"agreement: {', '.join(f'{what} {took:.1f}s' for what, took in runbook.waits)}")
    for phase in PHASES:
        served = phases.served.get(phase, Counter())
        print(f"  {phase:9} {phases.seconds.get(phase, 0.0):5.1f}s: {reads.answered(phase):6} reads answered, "
              f"{reads.refused_in(phase):4} 503; servers answered ASK {served['ASK']}, MOVED {served['MOVED']}, "
              f"TRYAGAIN {served['TRYAGAIN']}, ran {served['ASKING']} behind ASKING; this process sent again: "
              f"{refusals.said(phase)}; epochs: {epochs.said(phase)}")
    print(f"  reads: {len(reads.answers)} answered, {len(reads.refused)} 503, {len(wrong)} wrong, "
          f"{len(reads.failures)} failed; writes accepted {len(writes.accepted)}; final v{version}; "
          f"{seconds:.1f}s in all; 503s: {Counter(what for _, what in reads.refused).most_common(4)}")

    assert reads.failures == [], reads.failures[:5]
    assert wrong == [], wrong[:5]
    assert epochs.failures == [], epochs.failures[:5]
    for phase in PHASES:
        assert reads.answered(phase) >= PHASE_MIN_READS, (phase, reads.answered(phase))
    # Some of the season's keys moved to the new master, its control slot among them, and
    # none was left behind there.
    assert control_moved and moved_keys > 0 and moved_slots > 1, (control_moved, moved_keys, moved_slots)
    assert left_on_new == 0
    served = sum(phases.served.values(), Counter())
    assert served["ASK"] > 0 and served["MOVED"] > 0 and served["ASKING"] > 0, served
    # The readers themselves met both and answered through ASK.
    assert refusals.count("reads", "MOVED") > 0, refusals.seen
    assert refusals.reads_followed_ask(), refusals.seen
    # Epochs published while the cluster was being changed, and after.
    assert epochs.published("add-node", "grow", "shrink", "del-node"), epochs.outcomes
    assert epochs.published("after"), epochs.outcomes
    # The ledger holds every write the API accepted, and the views answer as it does.
    assert writes.refused == [], writes.refused[:5]
    assert writes.accepted, "the writer wrote nothing"
    assert writes.missing(season) == []
    assert version == final
