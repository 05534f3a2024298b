"""Reads and writes under load across a failure, checked against the ledger afterwards.

`VersionedReadLoad` issues the public read URLs (top, rank, neighbours, windows) through
the fast read path from several concurrent clients while versions come and go, and keeps
every answer with the moment it came back. Since the versions served change during the
run, an answer is checked afterwards against the standings of the version it names,
replayed from the change stream up to that version's watermark: a 200 answer must be
exactly that board (no mix of two versions, no partial bucket), a 503 must be the
`unavailable` error with nothing of a board in it, and any other answer is a failure.

`LedgerWriter` posts score events through the write API meanwhile and keeps the ids of
the events it was told were accepted, for the check that the ledger holds them all."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
from django.db import connections
from django.test import Client

from leaderboard.api.fastpath import ReadFastPath
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import Standings
from leaderboard.ledger_reads import ledger_rows_list
from leaderboard.models import Manifest as ManifestRow
from leaderboard.models import ScoreEvent
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support.publication import keys_of
from tests.support.reference import answer_entry
from tests.support.writes import Events, scores_at_watermark

WINDOW = 50
RADIUS = 10


@dataclass(frozen=True, slots=True)
class Answered:
    at: float  # time.monotonic() when the answer came back
    kind: str
    url: str
    player: str
    first: int
    status: int
    body: dict[str, Any]


def version_standings(season: Season, version: int) -> Standings:
    """The board `version` must serve: the change stream replayed up to its watermark, as
    the database recorded it at publication (or, for a version whose record the
    publishing process did not live to write, as its manifest in Redis says)."""
    row = ManifestRow.objects.filter(season=season, version=version).first()
    if row is not None:
        watermark = Watermark.from_columns(row.watermark_txid, row.watermark_id, row.watermark_vector)
    else:
        manifest = rankview.manifest_get(redis_get(), keys_of(season), version)
        assert manifest is not None, f"an answer named v{version}, which neither the database nor Redis knows"
        watermark = manifest.watermark
    return Standings(scores_at_watermark(season, watermark))


def answer_mismatch(answered: Answered, expected: Standings) -> str | None:
    """Why a 200 answer is not the board `expected`, or None when it is exactly it."""
    body = answered.body
    if body.get("total_players") != len(expected):
        return f"total_players {body.get('total_players')} != {len(expected)}"
    if answered.kind == "top":
        ok = body["entries"] == [answer_entry(e) for e in expected.top(100)]
    elif answered.kind == "rank":
        me = expected.entry(answered.player)
        ok = me is not None and {k: body[k] for k in ("position", "rank", "player_id", "score")} == me.as_dict()
    elif answered.kind == "neighbors":
        me = expected.entry(answered.player)
        ok = me is not None and body["player"] == answer_entry(me) and body["entries"] == [
            answer_entry(e) for e in expected.neighbors(answered.player, RADIUS)]
    else:
        ok = body["entries"] == [answer_entry(e) for e in expected.window(from_position=answered.first,
                                                                          limit=WINDOW)]
    return None if ok else "a wrong or partial answer"


class VersionedReadLoad:
    """`clients` concurrent readers of the fast read path (one event loop in a thread of
    its own, `threads` read threads behind it, as a server process runs them)."""

    def __init__(self, slug: str, players: list[str], *, clients: int = 4, threads: int = 4, seed: int = 0):
        self.slug = slug
        self.players = players
        self.clients = clients
        self.threads = threads
        self.rnd = random.Random(seed)
        self.answers: list[Answered] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="read-load", daemon=True)
        self._httpx_level = logging.NOTSET

    def start(self) -> None:
        # httpx logs every request at INFO: thousands of lines in a failing test's report.
        self._httpx_level = logging.getLogger("httpx").level
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        logging.getLogger("httpx").setLevel(self._httpx_level)
        assert not self._thread.is_alive(), "the readers did not stop"

    def _url(self, rnd: random.Random) -> tuple[str, str, str, int]:
        kind = rnd.choice(["top", "rank", "neighbors", "window"])
        player = rnd.choice(self.players)
        first = rnd.randint(1, len(self.players))
        url = {
            "top": f"/v1/seasons/{self.slug}/leaderboard/top?limit=100",
            "rank": f"/v1/seasons/{self.slug}/players/{player}/rank",
            "neighbors": f"/v1/seasons/{self.slug}/players/{player}/neighbors?radius={RADIUS}",
            "window": f"/v1/seasons/{self.slug}/leaderboard?from_position={first}&limit={WINDOW}",
        }[kind]
        return kind, url, player, first

    def _run(self) -> None:
        async def behind(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError(f"the fast path handed {scope['path']!r} on")

        app = ReadFastPath(behind, threads=self.threads)

        async def client_loop(client: httpx.AsyncClient, rnd: random.Random) -> None:
            while not self._stop.is_set():
                kind, url, player, first = self._url(rnd)
                try:
                    response = await client.get(url)
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    self.failures.append(f"{url}: {exc!r}")
                    await asyncio.sleep(0.05)
                    continue
                self.answers.append(Answered(at=time.monotonic(), kind=kind, url=url, player=player, first=first,
                                             status=response.status_code, body=response.json()))

        async def main() -> None:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
                await asyncio.gather(*(client_loop(client, random.Random(self.rnd.random()))
                                       for _ in range(self.clients)))

        try:
            asyncio.run(main())
        finally:
            # The read threads' database connections, closed where they were opened.
            for _ in range(self.threads):
                app.pool.submit(connections.close_all)
            app.pool.shutdown(wait=True)

    # -- what was answered

    def count(self, status: int, *, since: float = 0.0) -> int:
        return sum(1 for a in self.answers if a.status == status and a.at >= since)

    def versions(self, *, since: float = 0.0) -> dict[int, int]:
        seen: dict[int, int] = {}
        for a in self.answers:
            if a.status == 200 and a.at >= since:
                seen[a.body["leaderboard_version"]] = seen.get(a.body["leaderboard_version"], 0) + 1
        return seen

    def unavailable_window(self) -> tuple[float, float] | None:
        """(first, last) moment a 503 came back, or None when none did."""
        times = [a.at for a in self.answers if a.status == 503]
        return (min(times), max(times)) if times else None

    def wait(self, *, answers: int, timeout: float, version: int | None = None, since: float = 0.0) -> None:
        """Until `answers` 200s of `version` (or a later one) came back; with no version,
        until `answers` answers of any kind came back after `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.failures:
            if version is None:
                if sum(1 for a in self.answers if a.at >= since) >= answers:
                    return
            elif sum(n for v, n in self.versions().items() if v >= version) >= answers:
                return
            time.sleep(0.05)
        raise AssertionError(f"{answers} answers of v{version} not within {timeout:.0f}s: "
                             f"{self.versions()} {self.failures[:3]}")

    def check(self, season: Season) -> list[str]:
        """Every answer against the ledger; the failures (empty: all of them right)."""
        found = list(self.failures)
        boards: dict[int, Standings] = {}
        for answered in self.answers:
            if answered.status == 503:
                body = answered.body
                if body.get("error") != "unavailable" or "retry_after" not in body or "entries" in body:
                    found.append(f"{answered.url}: a 503 with {body}")
                continue
            if answered.status != 200:
                found.append(f"{answered.url}: {answered.status} {answered.body}")
                continue
            version = answered.body["leaderboard_version"]
            if version not in boards:
                boards[version] = version_standings(season, version)
            why = answer_mismatch(answered, boards[version])
            if why is not None:
                found.append(f"{answered.url} v{version}: {why}")
        return found


class LedgerWriter:
    """Posts batches of score events through the write API from a thread of its own until
    stopped; `accepted` holds the ids of the events answered applied, unchanged or stale
    (written to the ledger), `refused` what was answered otherwise."""

    def __init__(self, slug: str, players: list[str], token: str, *, batch: int = 5, pause: float = 0.05,
                 seed: int = 0):
        self.slug = slug
        self.players = players
        self.token = token
        self.batch = batch
        self.pause = pause
        self.rnd = random.Random(seed)
        self.events = Events(tag=f"w{seed}")
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the writer did not stop"

    def _run(self) -> None:
        client = Client(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        try:
            while not self._stop.is_set():
                events = [self.events.result(self.rnd.choice(self.players), self.rnd.randint(0, 1_000_000))
                          for _ in range(self.batch)]
                response = client.post(f"/internal/v1/seasons/{self.slug}/scores:apply", {"events": events},
                                       content_type="application/json")
                if response.status_code != 200:
                    self.refused.append(f"{response.status_code} {response.content[:200]!r}")
                else:
                    for event, result in zip(events, response.json()["results"], strict=True):
                        if result["status"] in ("applied", "unchanged", "stale"):
                            self.accepted.append(event["event_id"])
                        else:
                            self.refused.append(f"{event['event_id']}: {result}")
                time.sleep(self.pause)
        except Exception as exc:  # noqa: BLE001 - reported by missing()
            self.refused.append(f"writer: {exc!r}")
        finally:
            connections.close_all()

    def missing(self, season: Season) -> list[str]:
        """The accepted events the ledger does not hold."""
        held = set(ledger_rows_list(season=season, queryset=ScoreEvent.objects.filter(
            season=season, event_id__in=self.accepted).values_list("event_id", flat=True)))
        return [event_id for event_id in self.accepted if event_id not in held]

