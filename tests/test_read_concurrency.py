"""Readers hammer the read side while a writer posts results and an epoch loop publishes
versions (docs/rules.md, Publication): every answer must be exactly the board of the one version it
names, no read may fail, and 410 only ever answers a pinned version."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from rest_framework.test import APIClient

from leaderboard.core.ranking import Entry, Standings
from leaderboard.models import Manifest as ManifestRow
from leaderboard.recovery.rebuild import season_epoch_advance
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.selectors import leaderboard_reader
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    assert_board_equals,
    board_read,
    db_standings,
    epoch,
    keys_of,
    post_ok,
    scores_at_watermark,
)

pytestmark = pytest.mark.django_db(transaction=True)

RUN_SECONDS = 3.5
READERS = 3
PLAYERS = [f"p{i:03d}" for i in range(150)]


@dataclass
class Answer:
    kind: str  # top | rank | neighbors | window
    params: tuple[Any, ...]
    version: int
    entries: list[dict[str, Any]]  # for rank/neighbours: [player] / the neighbourhood
    total: int
    me: dict[str, Any] | None = None
    as_of: str | None = None


class Shared:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.answers: list[Answer] = []
        self.expired: list[tuple[int, int | None]] = []  # (pinned, current) of each 410
        self.published: list[int] = []
        self.snapshots: dict[int, list[Entry]] = {}
        self.writes = 0

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


def consistent(entries: list[dict[str, Any]], first: int | None = None) -> str:
    """Internal consistency of a run of entries: contiguous positions, display order,
    and competition ranks (equal to the position whenever the score changes)."""
    for i, e in enumerate(entries):
        if first is not None and e["position"] != first + i:
            return f"position {e['position']} at offset {i}, expected {first + i}"
        if i == 0:
            continue
        prev = entries[i - 1]
        if e["position"] != prev["position"] + 1:
            return f"positions {prev['position']} -> {e['position']}"
        if (-e["score"], e["player_id"].encode()) <= (-prev["score"], prev["player_id"].encode()):
            return f"order {prev} -> {e}"
        if e["score"] == prev["score"] and e["rank"] != prev["rank"]:
            return f"tie with different ranks {prev} -> {e}"
        if e["score"] != prev["score"] and e["rank"] != e["position"]:
            return f"rank {e['rank']} != position {e['position']} after a lower score"
    return ""


def reader_loop(shared: Shared, slug: str, seed: int) -> None:
    rnd = random.Random(seed)
    reader = leaderboard_reader(season_slug=slug)  # the API's reader, with its read deadline
    while not shared.stop.is_set():
        with shared.lock:
            versions = list(shared.published)
        pinned = None
        if rnd.random() < 0.3 and versions:
            pinned = rnd.choice(versions[-3:])
        kind = rnd.choice(["top", "rank", "neighbors", "window"])
        player = rnd.choice(PLAYERS + ["never-seen"])
        try:
            if kind == "top":
                limit = rnd.randint(1, 100)
                manifest, top = reader.top(limit, pinned)
                answer = Answer(kind, (limit,), manifest.version, list(top), manifest.total)
                problem = consistent(answer.entries, 1)
            elif kind == "rank":
                view = reader.rank(player, pinned)
                me = view.entry.as_dict() if view.entry else None
                answer = Answer(kind, (player,), view.manifest.version, [], view.total, me=me)
                problem = ""
            elif kind == "neighbors":
                radius = rnd.randint(0, 10)
                manifest, me_entry, around = reader.neighbors(player, radius, pinned)
                me = me_entry.as_dict() if me_entry else None
                answer = Answer(kind, (player, radius), manifest.version, [e.as_dict() for e in around],
                                manifest.total, me=me)
                problem = consistent(answer.entries)
                if me is not None and (me not in answer.entries
                                       or answer.entries[me["position"] - answer.entries[0]["position"]] != me):
                    problem = f"the player is not in its neighbourhood: {me}"
            else:
                first = rnd.randint(1, len(PLAYERS) + 20)
                limit = rnd.randint(1, 100)
                manifest, window = reader.window(first, limit, pinned)
                answer = Answer(kind, (first, limit), manifest.version, [e.as_dict() for e in window],
                                manifest.total)
                problem = consistent(answer.entries, first)
            if pinned is not None and answer.version != pinned:
                problem = f"pinned {pinned}, answered {answer.version}"
            if problem:
                shared.error(f"{kind} v{answer.version}: {problem}")
            with shared.lock:
                shared.answers.append(answer)
        except rankview.VersionExpired as exc:
            if pinned is None:
                shared.error(f"410 for an unpinned {kind}")
            with shared.lock:
                shared.expired.append((pinned or 0, exc.current))
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            shared.error(f"{kind} pinned={pinned}: {exc!r}")


def ranking_of(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("position", "rank", "player_id", "score")}


def http_loop(shared: Shared, slug: str, seed: int) -> None:
    rnd = random.Random(seed)
    client = Client()
    try:
        while not shared.stop.is_set():
            player = rnd.choice(PLAYERS)
            kind = rnd.choice(["top", "rank", "neighbors", "window"])
            url, params = {
                "top": (f"/v1/seasons/{slug}/leaderboard/top", {"limit": 100}),
                "rank": (f"/v1/seasons/{slug}/players/{player}/rank", {}),
                "neighbors": (f"/v1/seasons/{slug}/players/{player}/neighbors", {"radius": 10}),
                "window": (f"/v1/seasons/{slug}/leaderboard", {"from_position": rnd.randint(1, 160), "limit": 50}),
            }[kind]
            response = client.get(url, params)
            if response.status_code == 404 and kind in ("rank", "neighbors"):
                continue  # a player not written yet
            if response.status_code != 200:
                shared.error(f"HTTP {kind}: {response.status_code} {response.content[:200]!r}")
                continue
            body = response.json()
            version = body["leaderboard_version"]
            # What this test checks of an entry: its place (names and tiers are other tests').
            body["entries"] = [ranking_of(e) for e in body.get("entries", [])]
            if "player" in body:
                body["player"] = ranking_of(body["player"])
            if kind == "rank":
                me = {k: body[k] for k in ("position", "rank", "player_id", "score")}
                answer = Answer(kind, (player,), version, [], body["total_players"], me=me, as_of=body["as_of"])
            elif kind == "neighbors":
                answer = Answer(kind, (player, 10), version, body["entries"], body["total_players"],
                                me=body["player"], as_of=body["as_of"])
            else:
                first = 1 if kind == "top" else params["from_position"]
                limit = params["limit"]
                answer = Answer(kind, (limit,) if kind == "top" else (first, limit), version, body["entries"],
                                body["total_players"], as_of=body["as_of"])
            problem = consistent(answer.entries)
            if problem:
                shared.error(f"HTTP {kind} v{version}: {problem}")
            with shared.lock:
                shared.answers.append(answer)
    finally:
        connections.close_all()


def writer_loop(shared: Shared, slug: str, token: str, seed: int) -> None:
    rnd = random.Random(seed)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    ev = Events(tag=f"w{seed}")
    try:
        while not shared.stop.is_set():
            batch = []
            for _ in range(rnd.randint(1, 15)):
                player = rnd.choice(PLAYERS)
                score = rnd.choice([rnd.randint(0, 1000), 500, 500, 999])  # moves, and ties
                if rnd.random() < 0.15:
                    batch.append(ev.correction(player, score))
                else:
                    batch.append(ev.result(player, score))
            response = client.post(f"/internal/v1/seasons/{slug}/scores:apply", {"events": batch}, format="json")
            if response.status_code != 200:
                shared.error(f"write: {response.status_code} {response.content[:200]!r}")
            shared.writes += len(batch)
            time.sleep(rnd.uniform(0.005, 0.03))
    except Exception as exc:  # noqa: BLE001
        shared.error(f"writer: {exc!r}")
    finally:
        connections.close_all()


def epoch_loop(shared: Shared, season: Season) -> None:
    # Its own reader with no deadline: nothing else mutates a copy while this thread reads.
    snapshot_reader = rankview.RankReader(redis_get(), keys_of(season), deadline=3600)
    try:
        while not shared.stop.is_set():
            result = season_epoch_advance(season=season)
            if result.status == "published":
                version = int(result.version)  # type: ignore[arg-type]
                pinned, board = board_read(snapshot_reader, version)
                assert pinned == version
                with shared.lock:
                    shared.snapshots[version] = board
                    shared.published.append(version)
            time.sleep(0.02)
    except Exception as exc:  # noqa: BLE001
        shared.error(f"epoch: {exc!r}")
    finally:
        connections.close_all()


def verify(answer: Answer, board: list[Entry]) -> str:
    """The answer against the snapshot of its version."""
    dicts = [e.as_dict() for e in board]
    if answer.total != len(board):
        return f"total {answer.total} != {len(board)}"
    by_player = {e["player_id"]: e for e in dicts}
    if answer.kind == "top":
        expected: Any = dicts[: answer.params[0]]
        return "" if answer.entries == expected else "top differs"
    if answer.kind == "window":
        first, limit = answer.params
        return "" if answer.entries == dicts[first - 1 : first - 1 + limit] else f"window {first}+{limit} differs"
    player = answer.params[0]
    me = by_player.get(player)
    if answer.me != me:
        return f"{answer.kind} of {player}: {answer.me} != {me}"
    if answer.kind == "neighbors" and me is not None:
        radius = int(answer.params[1])  # type: ignore[call-overload]
        position = int(me["position"])  # type: ignore[call-overload]
        lo = max(0, position - 1 - radius)
        if answer.entries != dicts[lo : position + radius]:
            return f"neighbours of {player} differ"
    return ""


@pytest.mark.slow
def test_reads_are_consistent_while_versions_are_published(
    season_factory: Callable[..., Season], post_scores: Callable[..., Any], writer: Any, redis_flushed: Any
) -> None:
    rankview.manifest_cache_clear()
    season = season_factory(slug="busy", layout=NARROW)
    ev = Events(tag="seed")
    post_ok(post_scores, season, [ev.result(p, random.Random(i).randint(0, 1000)) for i, p in enumerate(PLAYERS[:100])])
    # The first two versions (one per copy) are built before the load starts; all later
    # ones apply changes to a copy.
    for number in (1, 2):
        assert epoch(season).status == "published"
        if number == 1:
            post_ok(post_scores, season, [ev.result("p000", 1000)])
    shared = Shared()
    with shared.lock:
        shared.published.append(2)
        shared.snapshots[2] = board_read(rankview.RankReader(redis_get(), keys_of(season), deadline=3600), 2)[1]
    threads = [threading.Thread(target=epoch_loop, args=(shared, season), name="epochs"),
               threading.Thread(target=writer_loop, args=(shared, season.slug, writer[1], 7), name="writer"),
               threading.Thread(target=http_loop, args=(shared, season.slug, 99), name="http")]
    threads += [threading.Thread(target=reader_loop, args=(shared, season.slug, i), name=f"reader-{i}")
                for i in range(READERS)]
    for thread in threads:
        thread.start()
    time.sleep(RUN_SECONDS)
    # Keep the load on until versions were published under it (on a shared PostgreSQL
    # server other sessions' transactions can hold the change stream back for a while).
    deadline = time.monotonic() + 20
    while len(shared.published) < 4 and time.monotonic() < deadline and not shared.errors:
        time.sleep(0.1)
    shared.stop.set()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name

    assert not shared.errors, shared.errors[:20]
    assert shared.writes > 0
    assert len(shared.published) >= 4, f"only versions {shared.published} were published"
    assert len(shared.answers) > 300

    # Each version's snapshot is the board its watermark promises: the change stream
    # replayed up to it, independently of Redis.
    for version, board in shared.snapshots.items():
        row = ManifestRow.objects.get(season=season, version=version)
        expected = Standings(scores_at_watermark(season, row.watermark))
        assert board == expected.window(from_position=1, limit=len(expected) + 1), f"v{version}"
        assert row.total_players == len(board)

    # Every answer is exactly the board of the version it names.
    wrong = []
    as_of: dict[int, set[str]] = defaultdict(set)
    for answer in shared.answers:
        if answer.version not in shared.snapshots:
            wrong.append(f"{answer.kind} answered v{answer.version}, which was never published")
            continue
        problem = verify(answer, shared.snapshots[answer.version])
        if problem:
            wrong.append(f"v{answer.version} {answer.kind}{answer.params}: {problem}")
        if answer.as_of is not None:
            as_of[answer.version].add(answer.as_of)
    assert not wrong, wrong[:20]
    assert all(len(stamps) == 1 for stamps in as_of.values()), as_of
    # 410 only for a pinned version that a newer one replaced (or, for a read that
    # outlived its deadline, the current one): never a version newer than the current.
    for pinned, current in shared.expired:
        assert current is not None and pinned <= current, (pinned, current)

    # Once the load stops, the next version holds every committed change.
    result = epoch(season)
    assert result.status in ("published", "idle")
    rankview.manifest_cache_clear()
    quiet_reader = rankview.RankReader(redis_get(), keys_of(season), deadline=3600)
    assert_board_equals(quiet_reader, db_standings(season), window_limits=(5,))
