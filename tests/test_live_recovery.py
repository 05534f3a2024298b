"""Live boards while the views are lost and a recovery runs (docs/operations.md, Redis lost),
through the real ASGI application, the channels-redis layer and a real Redis flushed under
it: sockets that showed a board are told it is unavailable without waiting for a version
(none is published meanwhile), then the recovery's progress as it advances, and a socket
opened meanwhile gets the same; the write API and the FINAL endpoints go on answering, and
what was written meanwhile is on the board the recovery publishes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

from leaderboard.live import hub as live
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    Events,
    announcements_muted,
    closing_season,
    db_standings,
    epoch,
    finalize,
    in_season,
    post_ok,
    publish,
    staff,
)
from tests.test_live_consumer import board, connect, expected_player, expected_top, receive, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


@pytest.fixture
def quick_checks(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The flush takes the channel layer's groups too: the listener re-joins on its refresh.
    settings.LIVE_GROUP_REFRESH_SECONDS = 0.2
    monkeypatch.setattr(live, "VIEWS_CHECK_SECONDS", 0.2)


async def receive_until(comm: Any, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first message `wanted` accepts; the ones before it must be progress notices."""
    while True:
        message = await receive(comm)
        if wanted(message):
            return message
        assert message["type"] == "unavailable", message


def views_lose(r: Any) -> None:
    r.flushdb()  # Redis restarted empty: the views are gone, the ledger is not
    rankview.manifest_cache_clear()


def recovery_job(season: Season) -> RebuildJob:
    return RebuildJob.objects.get(season=season, kind=RebuildJob.Kind.RECOVERY)


@pytest.mark.usefixtures("quick_checks")
def test_sockets_follow_a_recovery_from_the_loss_to_its_publication(season: Season, post_scores: Post,
                                                                    rank_views: Any) -> None:
    ev = Events()
    board(season, post_scores, ev, {f"p{i:03d}": 1000 + 10 * i for i in range(120)})
    assert publish(season) == 1
    apost = sync_to_async(post_ok)

    async def body() -> None:
        watcher = await connect(season.slug)
        player = await connect(season.slug, "player_id=p010&radius=2")
        assert (await receive(watcher))["leaderboard_version"] == 1
        assert (await receive(player))["leaderboard_version"] == 1

        await sync_to_async(views_lose)(rank_views)
        # No version is published while the views are lost: the hub finds it out itself.
        for comm in (watcher, player):
            lost = await receive(comm)
            assert (lost["type"], lost["season_id"], lost["recovery"]) == ("unavailable", season.slug, None)
            assert lost["retry_after"] >= 1

        # The next epoch starts a recovery instead of publishing: its progress follows.
        assert (await sync_to_async(epoch)(season)).status == "lost"
        queued = await receive(watcher)
        assert queued["recovery"] == {"status": "queued", "done": 0, "total": 0, "percent": 0.0,
                                      "eta_seconds": None}
        assert (await receive(player))["recovery"] == queued["recovery"]

        # Writes keep committing to the ledger meanwhile.
        await apost(post_scores, season, [ev.result("p010", 5000), ev.result("newcomer", 4000)])

        # The recovery runs. It holds at its first progress report, which the test makes
        # that of a large season a quarter of the way through its copy, until the sockets
        # were told of it.
        job = await sync_to_async(recovery_job)(season)
        seen = threading.Event()

        def hold_a_quarter_through(progress: RebuildJob) -> None:
            if progress.status == "building" and not seen.is_set():
                RebuildJob.objects.filter(pk=progress.pk).update(done=progress.total // 4, eta_seconds=12.5)
                assert seen.wait(timeout=20), "no socket was told of the recovery's progress"

        running = asyncio.ensure_future(sync_to_async(rebuild_run, thread_sensitive=False)(
            job_id=job.pk, on_progress=hold_a_quarter_through))
        building = await receive_until(watcher, lambda m: (m.get("recovery") or {}).get("done", 0) > 0)
        progress = building["recovery"]
        total = progress["total"]
        assert total >= 121  # the players to copy (counted once or per copy)
        assert progress == {"status": "building", "done": total // 4, "total": total,
                            "percent": round(100 * (total // 4) / total, 1), "eta_seconds": 13}

        # A socket opened now gets the notice first, with the same progress.
        late = await connect(season.slug, "player_id=newcomer")
        first = await receive(late)
        assert first["type"] == "unavailable" and first["recovery"] == progress
        seen.set()

        done = await running
        assert done.status == "published", done.error
        v2 = await sync_to_async(db_standings)(season)
        for comm, player_id in ((watcher, None), (player, "p010"), (late, "newcomer")):
            pushed = await receive_until(comm, lambda m: m["type"] == "version")
            # The whole board of the recovered version: nothing to diff against, no events.
            assert (pushed["leaderboard_version"], pushed["previous_version"]) == (done.published_version, None)
            assert "top_diff" not in pushed and pushed["top"] == expected_top(v2)
            if player_id is None:
                assert "player" not in pushed
                continue
            entry, around = expected_player(v2, player_id, pushed["player"]["radius"])
            assert pushed["player"]["entry"] == entry and pushed["player"]["neighbors"] == around
            assert pushed["player"]["events"] == []
        # The writes made during the recovery are on it.
        assert [e["player_id"] for e in expected_top(v2)[:2]] == ["p010", "newcomer"]
        for comm in (watcher, player, late):
            await comm.disconnect()

    run(body)


@pytest.mark.usefixtures("quick_checks")
def test_a_lost_announcement_is_made_up_for_by_the_watcher(season: Season, post_scores: Post,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ev = Events()
    board(season, post_scores, ev, {"a": 1, "b": 2})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug, "player_id=a")
        assert (await receive(comm))["leaderboard_version"] == 1
        with announcements_muted():
            await sync_to_async(post_ok)(post_scores, season, [ev.result("a", 9)])
            assert await sync_to_async(publish)(season) == 2
        pushed = await receive(comm)
        assert (pushed["leaderboard_version"], pushed["previous_version"]) == (2, 1)
        assert pushed["player"]["entry"]["rank"] == 1
        assert pushed["player"]["events"] == [{"type": "score_changed", "from": 1, "to": 9},
                                              {"type": "rank_changed", "from": 2, "to": 1}]
        await comm.disconnect()

    run(body)


def test_writes_and_final_reads_answer_during_a_recovery(season_factory: Callable[..., Season], post_scores: Post,
                                                         rank_views: Any) -> None:
    final = closing_season(season_factory, "fin")
    events = Events("fin", in_season(final))
    post_ok(post_scores, final, [events.result(f"f{i:02d}", 10 * i) for i in range(20)])
    finalize(final, proposer=staff("carol"), approver=staff("dave"))
    final_paths = [f"/v1/seasons/{final.slug}/{path}"
                   for path in ("final", "final/standings", "final/players/f03", "final/corrections")]
    before = {path: APIClient().get(path).json() for path in final_paths}

    season = season_factory(slug="open")
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 10), ev.result("b", 20)])
    publish(season)
    views_lose(rank_views)
    assert epoch(season).status == "lost"
    assert recovery_job(season).status == "queued"

    # The public reads have no version to answer from...
    assert APIClient().get(f"/v1/seasons/{season.slug}/players/a/rank").status_code == 503
    # ...but the ledger takes writes, and FINAL standings come from PostgreSQL.
    (result,) = post_ok(post_scores, season, [ev.result("a", 30)])
    assert result["status"] == "applied"
    for path in final_paths:
        response = APIClient().get(path)
        assert response.status_code == 200, (path, response.content)
        assert response.json() == before[path]

    job = rebuild_run(job_id=recovery_job(season).pk)
    assert job.status == "published", job.error
    rank = APIClient().get(f"/v1/seasons/{season.slug}/players/a/rank")
    assert rank.status_code == 200
    assert (rank.json()["score"], rank.json()["rank"]) == (30, 1)
