"""The failure matrix (docs/architecture.md, Tests), each case on a real database and a real Redis,
each ending with exact answers checked against the ledger: every player's rank, the top,
every neighbourhood and window against `Standings` built from the current-scores table,
and the full invariant check of the version.

Crashes are injected at internal seams (a function replaced by one that raises), or by
SIGKILL of a real child process; the database and Redis are never mocked.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import RangeValues
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import Entry, Standings
from leaderboard.models import LateResult, PlayerScore, RebuildJob
from leaderboard.models import Manifest as ManifestRow
from leaderboard.recovery import rebuild
from leaderboard.recovery.rebuild import (
    rebuild_publish,
    rebuild_run,
    season_epoch_advance,
    season_rebuild_start,
    season_split_propose,
)
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.epoch import season_epoch_run_locked, season_lease_acquire
from leaderboard.views.selectors import leaderboard_reader
from seasons.models import Season
from seasons.services import season_seal_ingest
from tests.support import (
    COMPLETED_AT,
    NARROW,
    TEST_ACTOR,
    Events,
    apply_events,
    assert_matches_ledger,
    board_snapshot,
    builds_counted,
    current_manifest,
    db_standings,
    epoch,
    epoch_child,
    epoch_child_killed_inside_apply,
    full_check,
    held_correction_approve,
    keys_of,
    ledger_rows,
    part_worker,
    post_ok,
    publish,
    reader_of,
    recovery_jobs,
    scores_at_watermark,
    season_in_parts,
)
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
_ids = itertools.count(1)


def event(player_id: str, score: int, version: int, *, kind: str = "result", event_id: str | None = None,
          completed_at: str = COMPLETED_AT) -> dict[str, Any]:
    n = next(_ids)
    body: dict[str, Any] = {"event_id": event_id or f"fm-{n}", "match_id": f"m-{n}", "player_id": player_id,
                            "best_score": score, "score_version": version, "completed_at": completed_at}
    if kind == "correction":
        body.update(kind="correction", reason="dispute upheld")
    return body


def statuses(results: list[dict[str, Any]]) -> list[str]:
    return [r["status"] for r in results]


def season_keys_dump(r: Any, season: Season) -> dict[bytes, bytes]:
    """Every Redis key of the season, serialized: to prove that nothing changed."""
    keys = keys_of(season)
    found: set[bytes] = set()
    for pattern in (f"{keys.prefix}:{{{keys.season}}}:*", f"{keys.prefix}:{{{keys.season}:*"):
        found.update(r.scan_iter(match=pattern, count=1000))
    return {k: r.dump(k) for k in sorted(found)}


# --- ingest: duplicates, order, moves ---------------------------------------------------------------


def test_duplicate_and_out_of_order_events_keep_the_newest_version(season_factory: Callable[..., Season],
                                                                    post_scores: Post) -> None:
    season = season_factory(slug="dups", layout=NARROW)
    first = [event("a", 100, 1), event("b", 200, 1), event("c", 300, 1), event("d", 400, 5)]
    assert statuses(post_ok(post_scores, season, first)) == ["applied"] * 4
    a3 = event("a", 500, 3)
    # In one batch: a newer event, then an older one for the same player, then the newer
    # one again, and a lower result (a result never lowers a score).
    batch = [a3, event("a", 900, 2), a3, event("b", 150, 2)]
    results = post_ok(post_scores, season, batch)
    assert statuses(results) == ["applied", "stale", "duplicate", "unchanged"]
    assert results[2]["first_status"] == "applied"
    # Two batches that land in the same epoch, the newer one first.
    post_ok(post_scores, season, [event("e", 300, 10)])
    assert statuses(post_ok(post_scores, season, [event("e", 800, 9)])) == ["stale"]
    v1 = publish(season)
    assert assert_matches_ledger(season, absent=["zz"]) == v1
    assert {e.player_id: e.score for e in db_standings(season).top(10)} == {
        "a": 500, "b": 200, "c": 300, "d": 400, "e": 300}

    # After a version is out: the newer event, then an old one delivered late, a retry of
    # an already applied event, a reuse of its id with another payload, and a correction
    # followed by an older result.
    c4 = event("c", 350, 4, kind="correction")
    assert statuses(post_ok(post_scores, season, [c4])) == ["applied"]
    v2 = publish(season)
    board = board_snapshot(season)
    late = [event("c", 999, 3), first[2], dict(c4, best_score=1), event("d", 50, 7, kind="correction")]
    results = post_ok(post_scores, season, late)
    assert statuses(results) == ["stale", "duplicate", "conflict", "applied"]
    assert statuses(post_ok(post_scores, season, [event("d", 999, 6)])) == ["stale"]
    assert statuses(post_ok(post_scores, season, late[:2])) == ["duplicate", "duplicate"]
    assert board_snapshot(season) == board  # nothing of it is published before the next epoch
    assert publish(season) == v2 + 1
    assert assert_matches_ledger(season) == v2 + 1
    assert reader_of(season).rank("c").entry == Entry(position=2, rank=2, player_id="c", score=350)
    assert reader_of(season).rank("d").entry == Entry(position=5, rank=5, player_id="d", score=50)
    # The stale and duplicate events changed nothing: the next epoch has nothing to do.
    post_ok(post_scores, season, [event("c", 1, 2), first[0]])
    assert epoch(season).status == "idle"
    assert assert_matches_ledger(season) == v2 + 1


def test_moves_across_buckets_up_and_down(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="moves", layout=NARROW)
    rnd = random.Random(5)
    ev = Events(tag="mv")
    scores = {f"p{i:02d}": rnd.randint(0, 999) for i in range(40)}
    post_ok(post_scores, season, [ev.result(p, s) for p, s in scores.items()])
    publish(season)
    assert_matches_ledger(season)

    # Increases across one or several buckets, up to the open-ended last bucket and the maximum.
    raised = [ev.result(p, min(s + rnd.choice([100, 250, 700]), 999)) for p, s in list(scores.items())[:12]]
    raised += [ev.result("p20", 1000), ev.result("p21", 1_000_000), ev.result("p22", 54_321)]
    post_ok(post_scores, season, raised)
    publish(season)
    assert_matches_ledger(season)

    # Downward corrections across buckets (to 0 too), a player moved up and back within
    # one epoch, one moved up twice, one moved down twice, and a newcomer.
    down = [ev.correction(p, max(0, s - rnd.choice([100, 300, 900]))) for p, s in list(scores.items())[12:24]]
    down += [ev.correction("p21", 0), ev.correction("p22", 5)]
    s30 = scores["p30"]
    down += [ev.result("p30", 999), ev.correction("p30", s30)]
    down += [ev.result("p31", 500), ev.result("p31", 950)]
    down += [ev.correction("p32", 600), ev.correction("p32", 10)]
    down += [ev.result("new", 333)]
    post_ok(post_scores, season, down)
    publish(season)
    assert_matches_ledger(season)

    # And back: every player to another bucket, in both directions.
    back = [ev.correction(p, (s + 500) % 1000) for p, s in scores.items()]
    post_ok(post_scores, season, back)
    publish(season)
    version = assert_matches_ledger(season)
    manifest = current_manifest(season)
    assert manifest is not None and manifest.version == version
    expected_counts = [0] * NARROW.size
    for score in ledger_rows(PlayerScore, season, "score"):
        expected_counts[NARROW.bucket_of(score)] += 1
    assert manifest.counts == expected_counts


# --- a materializer killed mid-apply -------------------------------------------------------------------


class KillableSeason:
    """600 players in NARROW buckets with both copies built. `move_all()` moves every
    player to another bucket, so the next epoch (and its catch-up) applies hundreds of
    two-player chunks: many moments for a SIGKILL to land in."""

    def __init__(self, season: Season, seed: int):
        self.season = season
        self.rnd = random.Random(seed)
        self.scores = {f"k{i:05d}": self.rnd.randint(0, 999) for i in range(600)}
        self.versions = itertools.count(1)
        apply_events(season, [event(p, s, next(self.versions)) for p, s in self.scores.items()])
        publish(season)
        self.set("k00000", 1000)
        self.before = publish(season)

    def set(self, player_id: str, score: int) -> None:
        apply_events(self.season, [event(player_id, score, next(self.versions))])

    def move_all(self) -> None:
        self.scores = {p: (s + self.rnd.randint(100, 800)) % 1000 for p, s in self.scores.items()}
        apply_events(self.season, [event(p, s, next(self.versions), kind="correction")
                                   for p, s in self.scores.items()])


def lease_expired_wait(season: Season) -> None:
    """Until a dead coordinator's lease (EPOCH_LEASE_SECONDS=2 in its child) runs out."""
    r = redis_get()
    deadline = time.monotonic() + 10
    while r.get(keys_of(season).lease) is not None:
        assert time.monotonic() < deadline, "the dead coordinator's lease never expired"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_materializer_killed_mid_apply_leaves_the_previous_version_serving(
    season_factory: Callable[..., Season], settings: Any
) -> None:
    season = season_factory(slug="killed", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    killable = KillableSeason(season, seed=11)
    before = killable.before  # the next epoch applies changes to the other copy
    served = board_snapshot(season)
    target = next(c for c in rankview.copies_get(r, keys) if c != current_manifest(season).copy)

    landed = False
    for _attempt in range(6):
        killable.move_all()
        landed = epoch_child_killed_inside_apply(season, target, killable.rnd)
        if landed:
            break
        # The epoch finished first: make the next one bigger.
        before = rankview.pointer_get(r, keys)  # type: ignore[assignment]
        served = board_snapshot(season)
        target = next(c for c in rankview.copies_get(r, keys) if c != current_manifest(season).copy)
    assert landed, "no kill landed inside the apply"

    # The dead coordinator's lease still blocks the season; the previous version serves
    # exactly the same answers, and its copy is intact.
    assert r.get(keys.lease) is not None
    assert season_epoch_advance(season=season).status == "skipped"
    assert board_snapshot(season) == served
    full_check(season, before)
    # The lease expires (2 s); the next coordinator resumes the half-applied copy and publishes.
    lease_expired_wait(season)
    assert board_snapshot(season) == served
    assert publish(season) == before + 1
    assert assert_matches_ledger(season, window_limits=(3,)) == before + 1
    assert ManifestRow.objects.filter(season=season, version=before + 1).exists()
    killable.set("k00002", 1000)
    assert publish(season) == before + 2
    assert assert_matches_ledger(season, exhaustive=False) == before + 2


@pytest.mark.slow
def test_a_coordinator_killed_while_catching_up_the_older_copy_leaves_the_next_epoch_to_finish_it(
    season_factory: Callable[..., Season], settings: Any
) -> None:
    season = season_factory(slug="killed-catch-up", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    killable = KillableSeason(season, seed=12)
    before = killable.before  # both copies built and caught up

    landed = False
    for _attempt in range(6):
        # The published copy and then the older one each apply every player.
        killable.move_all()
        older = current_manifest(season).copy  # the copy the catch-up will touch
        landed = epoch_child_killed_inside_apply(season, older, killable.rnd, EPOCH_CATCH_UP="true")
        assert rankview.pointer_get(r, keys) == before + 1, "the catch-up runs only after the publication"
        before += 1
        if landed:
            break
        # The catch-up finished first: try again with the next round.
        lease_expired_wait(season)
    assert landed, "no kill landed inside the catch-up"

    # The version the dead coordinator published serves the ledger exactly.
    served = board_snapshot(season)
    assert assert_matches_ledger(season, window_limits=(3,)) == before
    full_check(season, before)
    lease_expired_wait(season)
    assert board_snapshot(season) == served
    # The next epoch targets the half caught-up copy. Found broken (some chunks landed,
    # not all), it is not rebuilt in place (it is one side of the index the current copy
    # serves from): a new index is built from the scores beside it, published under new
    # names, and the copies it replaced are dropped. Found "applying" (every chunk landed,
    # the kill came before its finish), its changes are applied to it again.
    half = rankview.copy_meta_load(r, keys, older)
    assert half is not None and half.state in (rankview.STATE_BROKEN, rankview.STATE_APPLYING)
    replaced = rankview.copies_get(r, keys)
    killable.set("k00002", 1000)
    assert publish(season) == before + 1
    manifest = current_manifest(season)
    if half.state == rankview.STATE_BROKEN:
        assert manifest.copy not in replaced and manifest.index == manifest.copy, manifest.copy
        assert rankview.copies_get(r, keys) == [manifest.copy, f"{manifest.copy}b"]
        assert [rankview.copy_meta_load(r, keys, name) for name in replaced] == [None, None]
    else:
        assert manifest.copy == older and rankview.copies_get(r, keys) == replaced
    assert assert_matches_ledger(season, exhaustive=False) == before + 1
    full_check(season, before + 1)


# --- coordinators: death around the pointer swap, stale fencing tokens --------------------------------


class CoordinatorDied(RuntimeError):
    pass


def dying_publish(when: str) -> Callable[..., None]:
    real = rankview.pointer_publish

    def publish_(*args: Any, **kwargs: Any) -> None:
        if when == "after":
            real(*args, **kwargs)
        raise CoordinatorDied(f"the coordinator died {when} the pointer swap")

    return publish_


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_epoch_coordinator_dying_around_the_pointer_swap(season_factory: Callable[..., Season], post_scores: Post,
                                                            monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    season = season_factory(slug=f"swap-{when}", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    ev = Events(tag=f"sw{when}")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 71) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    previous = publish(season)
    served = board_snapshot(season)
    post_ok(post_scores, season, [ev.result("p02", 998), ev.correction("p03", 1), ev.result("new", 550)])

    monkeypatch.setattr(rankview, "pointer_publish", dying_publish(when))
    with pytest.raises(CoordinatorDied):
        epoch(season)
    monkeypatch.undo()
    assert r.get(keys.lease) is None  # released on the way out
    season.refresh_from_db()
    assert season.published_version == previous
    assert not ManifestRow.objects.filter(season=season, version=previous + 1).exists()
    if when == "before":
        # Nothing was published: the previous version serves the same answers.
        assert rankview.pointer_get(r, keys) == previous
        assert board_snapshot(season) == served
        full_check(season, previous)
        with pytest.raises(rankview.VersionExpired):
            reader_of(season).rank("p01", previous + 1)
        # The next coordinator publishes the same version number, complete.
        assert publish(season) == previous + 1
    else:
        # The swap happened: the new version is complete and exact, and the next epoch
        # (even an idle one) records it in the database.
        assert rankview.pointer_get(r, keys) == previous + 1
        assert_matches_ledger(season)
        assert epoch(season).status == "idle"
        season.refresh_from_db()
        assert season.published_version == previous + 1
        assert ManifestRow.objects.filter(season=season, version=previous + 1).exists()
    assert assert_matches_ledger(season) == previous + 1
    post_ok(post_scores, season, [ev.result("p04", 997)])
    assert publish(season) == previous + 2
    assert_matches_ledger(season)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_rebuild_coordinator_dying_around_the_pointer_swap(season_factory: Callable[..., Season],
                                                             post_scores: Post, monkeypatch: pytest.MonkeyPatch,
                                                             when: str) -> None:
    season = season_factory(slug=f"rb-swap-{when}", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    ev = Events(tag=f"rs{when}")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 53) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    previous = publish(season)
    served = board_snapshot(season)
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)

    monkeypatch.setattr(rankview, "pointer_publish", dying_publish(when))
    with pytest.raises(CoordinatorDied):
        rebuild_run(job_id=job.pk)
    monkeypatch.undo()
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.FAILED and "CoordinatorDied" in job.error
    assert r.get(keys.lease) is None
    if when == "before":
        assert rankview.pointer_get(r, keys) == previous
        assert board_snapshot(season) == served
        full_check(season, previous)
        assert rankview.copy_meta_load(r, keys, job.copy) is None  # the shadows were dropped
        assert rankview.copies_get(r, keys) == ["0", "1"]
    else:
        # The swap happened: the shadow is the live copy now, whatever became of the job.
        assert rankview.pointer_get(r, keys) == previous + 1
        assert current_manifest(season).copy == job.copy
        assert job.copy in rankview.copies_get(r, keys)
        assert_matches_ledger(season)
    # Epochs carry on from there, exactly.
    post_ok(post_scores, season, [ev.result("p02", 998), ev.correction("p03", 2)])
    published = publish(season)
    assert published == previous + (1 if when == "before" else 2)
    assert_matches_ledger(season)
    post_ok(post_scores, season, [ev.result("p04", 997)])
    assert publish(season) == published + 1
    assert_matches_ledger(season)


def test_two_coordinators_with_stale_fencing_tokens(season_factory: Callable[..., Season], post_scores: Post,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="fenced", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    ev = Events(tag="fence")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 37) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    previous = publish(season)
    post_ok(post_scores, season, [ev.result("p02", 998), ev.correction("p03", 0), ev.result("new", 450)])

    # Coordinator A takes the lease; as it starts applying, its lease "expires" (deleted)
    # and coordinator B runs a whole epoch with a newer token and publishes.
    token_a = season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert token_a is not None
    real_apply = rankview.copy_range_apply
    seen: dict[str, Any] = {}

    def apply_(r_: Any, keys_: Any, token: int | None, meta: Any, values: Any, **kwargs: Any) -> Any:
        if token == token_a and "b" not in seen:
            r_.delete(keys_.lease)
            seen["b"] = season_epoch_advance(season=season)
        return real_apply(r_, keys_, token, meta, values, **kwargs)

    monkeypatch.setattr(rankview, "copy_range_apply", apply_)
    with pytest.raises(rankview.FenceLost):
        season_epoch_run_locked(season=season, r=r, keys=keys, token=token_a)
    monkeypatch.undo()
    assert seen["b"].status == "published" and seen["b"].version == previous + 1
    assert rankview.pointer_get(r, keys) == previous + 1
    assert_matches_ledger(season)

    # A third coordinator holds the season now; A goes on with its stale token: every
    # write and the publication are refused, and nothing in Redis changes.
    token_c = season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert token_c is not None and token_c > token_a
    manifest = current_manifest(season)
    assert manifest is not None
    stale_meta = rankview.copy_meta_load(r, keys, "0" if manifest.copy == "1" else "1")
    assert stale_meta is not None
    before = season_keys_dump(r, season)
    candidate = dataclasses.replace(manifest, version=manifest.version + 1)
    attempts: list[Callable[[], Any]] = [
        lambda: rankview.copy_begin_mutation(r, keys, token_a, stale_meta),
        lambda: rankview.copy_range_apply(r, keys, token_a, stale_meta,
                                          RangeValues(new={"p05": 5}, old={"p05": 185}, taken={})),
        lambda: rankview.copy_finish(r, keys, token_a, stale_meta, watermark=Watermark.single(0, 10**9), version=99),
        lambda: rankview.manifest_store(r, keys, candidate, token=token_a),
        lambda: rankview.pointer_publish(r, keys, token=token_a, expected=manifest.version,
                                         version=manifest.version + 1),
        lambda: season_epoch_run_locked(season=season, r=r, keys=keys, token=token_a),
    ]
    post_ok(post_scores, season, [ev.result("p06", 996)])
    for attempt in attempts:
        with pytest.raises(rankview.FenceLost):
            attempt()
    assert season_keys_dump(r, season) == before
    assert rankview.pointer_get(r, keys) == previous + 1
    # The holder releases; the next epoch publishes everything, exactly.
    rankview.lease_release(r, keys, token_c)
    assert publish(season) == previous + 2
    assert_matches_ledger(season)


# --- Redis flushed under read load ------------------------------------------------------------------


class ReadLoad:
    def __init__(self, slug: str, expected: Standings):
        self.slug = slug
        self.expected = expected
        self.players = [e.player_id for e in expected.window(from_position=1, limit=len(expected))]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.unavailable = 0
        self.versions: dict[int, int] = {}

    def answered(self, version: int) -> None:
        with self.lock:
            self.versions[version] = self.versions.get(version, 0) + 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def count_unavailable(self) -> None:
        with self.lock:
            self.unavailable += 1

    def reader_loop(self, seed: int) -> None:
        rnd = random.Random(seed)
        reader = leaderboard_reader(season_slug=self.slug)
        expected = self.expected
        try:
            while not self.stop.is_set():
                kind = rnd.choice(["top", "rank", "neighbors", "window"])
                player = rnd.choice(self.players)
                try:
                    if kind == "top":
                        manifest, top = reader.top(100)
                        ok = top == [e.as_dict() for e in expected.top(100)] and manifest.total == len(expected)
                    elif kind == "rank":
                        view = reader.rank(player)
                        manifest = view.manifest
                        ok = view.entry == expected.entry(player) and view.total == len(expected)
                    elif kind == "neighbors":
                        manifest, me, around = reader.neighbors(player, 10)
                        ok = me == expected.entry(player) and around == expected.neighbors(player, 10)
                    else:
                        first = rnd.randint(1, len(expected) + 5)
                        manifest, window = reader.window(first, 50)
                        ok = window == expected.window(from_position=first, limit=50)
                except rankview.Unavailable:
                    self.count_unavailable()
                    continue
                if not ok:
                    self.error(f"reader {kind} {player} v{manifest.version}: a wrong or partial answer")
                self.answered(manifest.version)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            self.error(f"reader: {exc!r}")
        finally:
            connections.close_all()

    def http_loop(self, seed: int) -> None:
        rnd = random.Random(seed)
        client = Client()
        expected = self.expected
        try:
            while not self.stop.is_set():
                kind = rnd.choice(["top", "rank", "neighbors", "window"])
                player = rnd.choice(self.players)
                first = rnd.randint(1, len(expected) + 5)
                url = {
                    "top": f"/v1/seasons/{self.slug}/leaderboard/top?limit=100",
                    "rank": f"/v1/seasons/{self.slug}/players/{player}/rank",
                    "neighbors": f"/v1/seasons/{self.slug}/players/{player}/neighbors?radius=10",
                    "window": f"/v1/seasons/{self.slug}/leaderboard?from_position={first}&limit=50",
                }[kind]
                response = client.get(url)
                if response.status_code == 503:
                    body = response.json()
                    if body.get("error") != "unavailable" or "retry_after" not in body or "entries" in body:
                        self.error(f"HTTP 503 body {body}")
                    self.count_unavailable()
                    continue
                if response.status_code != 200:
                    self.error(f"HTTP {kind}: {response.status_code} {response.content[:200]!r}")
                    continue
                body = response.json()
                me = expected.entry(player)
                if kind == "top":
                    ok = body["entries"] == [answer_entry(e) for e in expected.top(100)]
                elif kind == "rank":
                    ok = me is not None and {k: body[k] for k in ("position", "rank", "player_id", "score")} == (
                        me.as_dict())
                elif kind == "neighbors":
                    ok = body["player"] == answer_entry(me) and body["entries"] == [  # type: ignore[arg-type]
                        answer_entry(e) for e in expected.neighbors(player, 10)]
                else:
                    ok = body["entries"] == [answer_entry(e) for e in expected.window(from_position=first, limit=50)]
                if not ok or body["total_players"] != len(expected):
                    self.error(f"HTTP {kind} {url} v{body['leaderboard_version']}: a wrong or partial answer")
                self.answered(body["leaderboard_version"])
        except Exception as exc:  # noqa: BLE001
            self.error(f"http: {exc!r}")
        finally:
            connections.close_all()


@pytest.mark.slow
def test_redis_flushed_under_read_load_answers_503_then_recovers_exactly(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season = season_factory(slug="flushed", layout=NARROW)
    r = redis_get()
    ev = Events(tag="fl")
    rnd = random.Random(3)
    post_ok(post_scores, season, [ev.result(f"f{i:03d}", rnd.choice([rnd.randint(0, 999), 500]))
                                  for i in range(150)])
    publish(season)
    post_ok(post_scores, season, [ev.result("f001", 1000)])
    before = publish(season)
    expected = db_standings(season)
    served = board_snapshot(season)

    load = ReadLoad(season.slug, expected)
    threads = [threading.Thread(target=load.reader_loop, args=(i,), name=f"reader-{i}") for i in range(2)]
    threads.append(threading.Thread(target=load.http_loop, args=(9,), name="http"))
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 20
        while sum(load.versions.values()) < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        r.flushdb()  # Redis lost everything, under load; the database did not
        time.sleep(0.3)
        # The epoch does not publish a board from nothing: it starts one recovery build.
        assert epoch(season).status == "lost"
        assert epoch(season).status == "lost"
        jobs = recovery_jobs(season)
        assert [(j.kind, j.status) for j in jobs] == [("recovery", "queued")]
        unavailable_before_recovery = load.unavailable
        job = rebuild_run(job_id=jobs[0].pk)
        assert job.status == RebuildJob.Status.PUBLISHED, (job.error, job.report)
        assert job.published_version == before + 1
        deadline = time.monotonic() + 20
        while load.versions.get(before + 1, 0) < 50 and time.monotonic() < deadline and not load.errors:
            time.sleep(0.02)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not load.errors, load.errors[:10]
    assert unavailable_before_recovery > 0, "no read saw the flush"
    assert load.versions.get(before, 0) >= 50 and load.versions.get(before + 1, 0) >= 50, load.versions
    assert set(load.versions) == {before, before + 1}
    # Identical answers to before the flush, under the next version number.
    version, board, ranks = board_snapshot(season)
    assert (version, board, ranks) == (before + 1, served[1], served[2])
    assert assert_matches_ledger(season) == before + 1
    assert len(recovery_jobs(season)) == 1


# --- ties ---------------------------------------------------------------------------------------------


def test_mass_ties_straddling_the_top_100_boundary(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="ties", layout=NARROW)
    ev = Events(tag="tie")
    # 80 players above, 60 tied at 900 (positions 81..140), 40 below. The tied ids mix
    # every allowed character class: display order is by UTF-8 bytes, not by locale.
    above = {f"a{i:02d}": 990 - i for i in range(80)}
    alphabet = ["-", ".", "0", "9", ":", "A", "Z", "_", "a", "z"]
    tied = [f"{x}{y}{i}" for i, (x, y) in enumerate(itertools.product(alphabet, repeat=2))][:60]
    below = {f"b{i:02d}": 850 - i for i in range(40)}
    post_ok(post_scores, season, [ev.result(p, s) for p, s in above.items()]
            + [ev.result(p, 900) for p in reversed(tied)] + [ev.result(p, s) for p, s in below.items()])
    publish(season)
    assert_matches_ledger(season, window_limits=(1, 7))
    top = reader_of(season).top(100)[1]
    in_top = sorted(tied, key=str.encode)[:20]
    assert [e["player_id"] for e in top[80:]] == in_top
    assert {e["rank"] for e in top[80:]} == {81}
    assert reader_of(season).rank(sorted(tied, key=str.encode)[-1]).entry == Entry(
        position=140, rank=81, player_id=sorted(tied, key=str.encode)[-1], score=900)

    # One of the 80 falls into the tie, a newcomer joins it with the smallest id, one tied
    # player rises out of it, one falls below it: the boundary moves inside the tie.
    post_ok(post_scores, season, [ev.correction("a00", 900), ev.result("-", 900), ev.result(in_top[5], 995),
                                  ev.correction(in_top[0], 899)])
    publish(season)
    assert_matches_ledger(season, window_limits=(1, 7))

    # Everybody above collapses into the tie: 140 players share rank 1.
    post_ok(post_scores, season, [ev.correction(p, 900) for p in above] + [ev.correction(in_top[5], 900)])
    publish(season)
    assert_matches_ledger(season, window_limits=(1, 7))
    top = reader_of(season).top(100)[1]
    assert len(top) == 100 and {e["rank"] for e in top} == {1}
    assert reader_of(season).rank("b00").entry == Entry(position=142, rank=142, player_id="b00", score=850)


# --- late results around the cutoff and the seal ----------------------------------------------------


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_late_results_around_the_cutoff_and_the_seal(season_factory: Callable[..., Season],
                                                     post_scores: Post) -> None:
    cutoff = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    season = season_factory(slug="late", layout=NARROW, starts_at=cutoff - timedelta(days=10), cutoff=cutoff)
    assert season.state == "CLOSING"
    before, at, after = iso(cutoff - timedelta(milliseconds=1)), iso(cutoff), iso(cutoff + timedelta(milliseconds=1))
    results = post_ok(post_scores, season, [
        event("on-time", 400, 1, completed_at=before), event("at-cutoff", 500, 1, completed_at=at),
        event("too-late", 600, 1, completed_at=after), event("on-time", 900, 2, completed_at=after),
        event("early", 700, 1, completed_at=iso(season.starts_at - timedelta(seconds=1))),
    ])
    assert [(r["status"], r.get("reason")) for r in results] == [
        ("applied", None), ("applied", None), ("rejected", "after_cutoff"), ("rejected", "after_cutoff"),
        ("rejected", "before_season_start")]
    publish(season)
    assert_matches_ledger(season, absent=["too-late", "early"])
    assert reader_of(season).rank("on-time").entry.score == 400  # type: ignore[union-attr]

    # A pre-cutoff result still arriving before the seal is accepted.
    post_ok(post_scores, season, [event("straggler", 650, 1, completed_at=before)])
    season = season_seal_ingest(season=season, actor=TEST_ACTOR, reason="test")
    sealed = season.ingest_watermark
    assert sealed is not None
    version = publish(season)
    assert current_manifest(season).watermark >= sealed
    assert_matches_ledger(season, absent=["too-late", "early"])

    # After the seal: pre-cutoff results go to the late queue, never into the board; a
    # post-cutoff one is rejected outright; a correction waits in the queue for staff.
    correction = event("straggler", 100, 2, kind="correction", completed_at=before)
    results = post_ok(post_scores, season, [
        event("late-new", 800, 1, completed_at=before), event("at-cutoff", 999, 2, completed_at=at),
        event("late-post", 300, 1, completed_at=after), correction,
    ])
    assert [(r["status"], r.get("reason")) for r in results] == [
        ("rejected", "late_after_seal"), ("rejected", "late_after_seal"), ("rejected", "after_cutoff"),
        ("held", "correction_after_seal")]
    assert sorted(ledger_rows(LateResult, season, "player_id", "best_score", "status")) == [
        ("at-cutoff", 999, "pending"), ("late-new", 800, "pending"), ("straggler", 100, "pending")]
    assert epoch(season).status == "idle"  # held: nothing to publish
    assert held_correction_approve(season, correction["event_id"]).applied
    assert publish(season) == version + 1
    assert_matches_ledger(season, absent=["too-late", "early", "late-new", "late-post"])
    assert reader_of(season).rank("at-cutoff").entry.score == 500  # type: ignore[union-attr]
    assert reader_of(season).rank("straggler").entry.score == 100  # type: ignore[union-attr]
    # Nothing else is pending: the late queue stays out of every later version too.
    assert epoch(season).status == "idle"
    assert set(db_standings(season).top(100)[i].player_id for i in range(3)) == {
        "on-time", "at-cutoff", "straggler"}


# --- a corrupted shadow is refused ------------------------------------------------------------------


@pytest.mark.parametrize(("where", "named"), [
    ("empty_bucket", "shadow_index_counts"),  # a stray member where the counts say nobody is
    ("tail", "shadow_index_counts"),  # a stray member among many, far from any sampled window
    ("top_score", "top_100"),  # the leader's score rewritten in place: sizes stay right
])
def test_a_rebuild_whose_shadow_is_corrupted_is_refused(season_factory: Callable[..., Season], post_scores: Post,
                                                        monkeypatch: pytest.MonkeyPatch, settings: Any,
                                                        where: str, named: str) -> None:
    settings.REBUILD_SAMPLE_SIZE = 5  # sampled like a big season: most windows are not looked at
    season = season_factory(slug=f"corrupt-{where.replace('_', '-')}", layout=NARROW)
    r = redis_get()
    keys = keys_of(season)
    ev = Events(tag=f"co{where}")
    rnd = random.Random(8)
    post_ok(post_scores, season, [ev.result(f"c{i:03d}", rnd.randint(0, 998)) for i in range(300)])
    publish(season)
    post_ok(post_scores, season, [ev.result("c001", 999)])
    live = publish(season)
    served = board_snapshot(season)
    live_keys = season_keys_dump(r, season)
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    real_catch_up = rebuild._catch_up
    member, score = {"empty_bucket": ("stray", 1000), "tail": ("stray", 3), "top_score": ("c001", 950)}[where]

    def corrupting(**kwargs: Any) -> Any:
        shadow, replayed = real_catch_up(**kwargs)
        # One bucket of the caught-up shadow changed behind its bookkeeping's back.
        key = keys.bucket(shadow.copy, shadow.layout.layout_id, shadow.layout.bucket_of(score), groups=shadow.groups)
        r.zadd(key, {member: -score})
        return shadow, replayed

    monkeypatch.setattr(rebuild, "_catch_up", corrupting)
    job = rebuild_run(job_id=job.pk)
    assert job.status == RebuildJob.Status.FAILED
    failed = {f["check"] for f in job.report["findings"] if not f["ok"]}  # type: ignore[index]
    assert failed, job.report
    assert "shadow comparison failed: " in job.error and all(check in job.error for check in failed)
    assert named in failed, failed
    # The old version still serves, unchanged; the shadows are gone.
    assert rankview.pointer_get(r, keys) == live
    assert board_snapshot(season) == served
    assert rankview.copy_meta_load(r, keys, job.copy) is None
    assert rankview.copy_meta_load(r, keys, f"{job.copy}b") is None
    leftover = [k for k in season_keys_dump(r, season) if f":{job.copy}".encode() in k]
    assert not leftover, leftover
    # The lease's fence and the slot groups' fences (`}:f`) took the rebuild's token.
    untouched = {k: v for k, v in live_keys.items() if b":fence" not in k and not k.endswith(b"}:f")}
    assert {k: v for k, v in season_keys_dump(r, season).items() if k in untouched} == untouched
    assert_matches_ledger(season, window_limits=(3,))
    # A clean rebuild afterwards is published.
    monkeypatch.undo()
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.status == RebuildJob.Status.PUBLISHED, job.report
    assert assert_matches_ledger(season, window_limits=(3,)) == live + 1


# --- a hot-bucket split under write load --------------------------------------------------------------


class SplitLoad:
    def __init__(self, season: Season, players: list[str]):
        self.season = season
        self.players = players
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.boards: dict[int, tuple[Watermark, list[Entry]]] = {}
        self.reads = 0
        self.writes = 0
        self.published: list[int] = []
        self.layouts: set[int] = set()

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def writer_loop(self, token: str) -> None:
        rnd = random.Random(1)
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        ev = Events(tag="hot")
        try:
            while not self.stop.is_set():
                batch = []
                for _ in range(rnd.randint(1, 10)):
                    player = rnd.choice(self.players)
                    score = rnd.choice([rnd.randint(0, 99), rnd.randint(0, 99), 50, rnd.randint(0, 1200)])
                    batch.append(ev.correction(player, score) if rnd.random() < 0.3 else ev.result(player, score))
                response = client.post(f"/internal/v1/seasons/{self.season.slug}/scores:apply",
                                       json.dumps({"events": batch}), content_type="application/json")
                if response.status_code != 200:
                    self.error(f"write {response.status_code}: {response.content[:200]!r}")
                self.writes += len(batch)
                time.sleep(rnd.uniform(0.005, 0.02))
        except Exception as exc:  # noqa: BLE001
            self.error(f"writer: {exc!r}")
        finally:
            connections.close_all()

    def epoch_loop(self) -> None:
        try:
            while not self.stop.is_set():
                result = season_epoch_advance(season=self.season)
                if result.status == "published":
                    with self.lock:
                        self.published.append(result.version)  # type: ignore[arg-type]
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001
            self.error(f"epoch: {exc!r}")
        finally:
            connections.close_all()

    def reader_loop(self, seed: int) -> None:
        """Whole boards through pinned windows, and single windows and neighbourhoods:
        every answer internally consistent, every board each player exactly once."""
        rnd = random.Random(seed)
        reader = leaderboard_reader(season_slug=self.season.slug)
        try:
            while not self.stop.is_set():
                try:
                    if rnd.random() < 0.5:
                        manifest, window = reader.window(1, 100)
                        board = list(window)
                        while len(board) < manifest.total:
                            board.extend(reader.window(len(board) + 1, 100, manifest.version)[1])
                        problem = consistent(board, 1)
                        if len(board) != manifest.total or len({e.player_id for e in board}) != len(board):
                            problem = f"{len(board)} entries, {len({e.player_id for e in board})} players, " \
                                      f"total {manifest.total}"
                        if manifest.total != sum(manifest.counts):
                            problem = f"total {manifest.total} != sum of bucket counts {sum(manifest.counts)}"
                        with self.lock:
                            self.boards.setdefault(manifest.version, (manifest.watermark, board))
                            self.layouts.add(manifest.layout.layout_id)
                    else:
                        player = rnd.choice(self.players)
                        manifest, me, around = reader.neighbors(player, 10)
                        problem = consistent(around)
                        if me is not None and around[me.position - around[0].position] != me:
                            problem = f"{player} is not at its place in its neighbourhood"
                        if len({e.player_id for e in around}) != len(around):
                            problem = "a player twice in one neighbourhood"
                    if problem:
                        self.error(f"v{manifest.version}: {problem}")
                    with self.lock:
                        self.reads += 1
                except rankview.VersionExpired:
                    continue  # a pinned board outlived its version: start again on the current one
        except Exception as exc:  # noqa: BLE001
            self.error(f"reader: {exc!r}")
        finally:
            connections.close_all()


def consistent(entries: list[Entry], first: int | None = None) -> str:
    for i, e in enumerate(entries):
        if first is not None and e.position != first + i:
            return f"position {e.position} at offset {i}"
        if i == 0:
            continue
        prev = entries[i - 1]
        if e.position != prev.position + 1:
            return f"positions {prev.position} -> {e.position}"
        if (-e.score, e.player_id.encode()) <= (-prev.score, prev.player_id.encode()):
            return f"order {prev} -> {e}"
        if e.rank != (prev.rank if e.score == prev.score else e.position):
            return f"rank {e.rank} at position {e.position}"
    return ""


@pytest.mark.slow
def test_a_hot_bucket_split_under_write_load(season_factory: Callable[..., Season], post_scores: Post,
                                             writer: Any, settings: Any) -> None:
    settings.COPY_GRACE_SECONDS = 0.5  # readers run concurrently with epochs here
    settings.READ_DEADLINE_SECONDS = 0.4
    layout = BucketLayout(layout_id=1, lower_bounds=(0, 100, 1000))
    season = season_factory(slug="hot", layout=layout)
    r = redis_get()
    keys = keys_of(season)
    rnd = random.Random(4)
    players = [f"h{i:03d}" for i in range(200)]
    ev = Events(tag="hotseed")
    # Most players crowd the first bucket [0..99]: it is hot.
    post_ok(post_scores, season, [ev.result(p, rnd.randint(0, 99) if i % 10 else rnd.randint(100, 1100))
                                  for i, p in enumerate(players)])
    publish(season)
    post_ok(post_scores, season, [ev.result("h000", 1000)])
    publish(season)

    recommendations = rebuild.season_split_recommendations(season=season)
    assert [rec.bucket for rec in recommendations] == [0]
    split_points = recommendations[0].split_points
    assert split_points and all(0 < p <= 99 for p in split_points)
    points: list[object] = list(split_points)

    load = SplitLoad(season, players)
    threads = [threading.Thread(target=load.writer_loop, args=(writer[1],), name="writer"),
               threading.Thread(target=load.epoch_loop, name="epochs")]
    threads += [threading.Thread(target=load.reader_loop, args=(i,), name=f"reader-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        job = season_split_propose(season=season, actor=TEST_ACTOR, split_points=points, reason="hot bucket")
        job = rebuild_run(job_id=job.pk)
        assert job.status == RebuildJob.Status.READY, (job.error, job.report)
        time.sleep(0.5)  # epochs go on publishing the old layout meanwhile
        job = rebuild_publish(job=job, actor=TEST_ACTOR)
        assert job.status == RebuildJob.Status.PUBLISHED, (job.error, job.report)
        published_split = int(job.published_version)  # type: ignore[arg-type]
        deadline = time.monotonic() + 20
        while (time.monotonic() < deadline and not load.errors
               and (not load.published or load.published[-1] <= published_split + 1
                    or 2 not in load.layouts)):
            time.sleep(0.05)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive(), thread.name
    assert not load.errors, load.errors[:10]
    assert load.writes > 0 and load.reads > 20
    assert load.layouts == {1, 2}, load.layouts
    assert any(v > published_split for v in load.published), (load.published, published_split)

    # Each whole board a reader put together is exactly the change stream replayed to its
    # version's watermark: nobody twice, nobody missing, before, during and after the split.
    for version, (watermark, board) in sorted(load.boards.items()):
        expected = Standings(scores_at_watermark(season, watermark))
        assert board == expected.window(from_position=1, limit=len(expected) + 1), f"v{version}"

    season.refresh_from_db()
    new_layout = BucketLayout.from_dict(season.layout)
    assert new_layout.layout_id == 2 and set(points) <= set(new_layout.lower_bounds)
    assert current_manifest(season).layout == new_layout
    assert epoch(season).status in ("published", "idle")  # everything the writer committed
    assert_matches_ledger(season, window_limits=(5,))
    # The split copies serve; the old layout's copies are gone.
    assert set(rankview.copies_get(r, keys)) == {job.copy, f"{job.copy}b"}
    assert rankview.copy_meta_load(r, keys, "0") is None and rankview.copy_meta_load(r, keys, "1") is None
    assert not [k for k in r.scan_iter(match=keys.bucket("0", 1, 0, groups=settings.VIEW_SLOT_GROUPS))]


# --- an epoch in parts (EPOCH_PARTS=2) on a real Celery worker -----------------------------------------


@pytest.fixture
def in_parts(season_factory: Callable[..., Season], settings: Any) -> Season:
    """A season of 8 ledger partitions, 400 players published, whose epochs go in 2 parts,
    both sent to the one worker, which claims part 0 at once; the coordinator runs part 1
    once it has waited 3 s for a worker. Leases (and so a part's claim) last 2 s."""
    settings.EPOCH_LEASE_SECONDS = 2.0
    return season_in_parts(season_factory, settings, slug="in-parts", prefix="q", claim_seconds=3.0)


PART_ENV = {"EPOCH_PARTS": "2", "EPOCH_LEASE_SECONDS": "2", "EPOCH_PART_CLAIM_SECONDS": "3"}


def parts_moved(season: Season, tag: str, shift: int) -> None:
    apply_events(season, [Events(tag).correction(f"q{i:03d}", (2_503 * i + shift) % 1_000_001) for i in range(400)])


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.slow
def test_a_part_worker_killed_mid_write_has_its_part_run_again_under_a_newer_token(
        in_parts: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker is SIGKILLed inside part 0's writes. Its claim lapses (one lease); the
    coordinator gives the token up, takes the season under a newer one (stamped into every
    slot group) and hands part 0 out again: run resumed over what the dead worker wrote,
    no index built, the version exact."""
    season = in_parts
    builds = builds_counted(monkeypatch)
    before = current_manifest(season).version
    with part_worker(env=PART_ENV, chunk_players=4, pause=0.02) as worker:
        parts_moved(season, "killed-part", 50_000)
        thread, out = in_thread(lambda: season_epoch_advance(season=season))
        worker.wait_for(lambda line: line.startswith("wrote") and line.endswith(" 0"))
        worker.signal(signal.SIGKILL)
        thread.join(timeout=60)
    assert "error" not in out, out
    assert out["result"].status == "published"
    assert builds["n"] == 0
    assert assert_matches_ledger(season) == current_manifest(season).version > before
    full_check(season, current_manifest(season).version)


@pytest.mark.slow
def test_a_coordinator_killed_after_handing_out_parts_is_resumed_by_the_next_one(
        in_parts: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator (a child process) sent part 0 to the worker and is SIGKILLed while
    the worker writes it. The previous version serves on; the worker's writes go on under
    the dead coordinator's token until the next coordinator stamps a newer one, and are
    refused from then on. The next epoch resumes the copy from where the writes stopped,
    with no index built."""
    season = in_parts
    builds = builds_counted(monkeypatch)
    before = current_manifest(season).version
    served = board_snapshot(season)
    with part_worker(env=PART_ENV, chunk_players=4, pause=0.02) as worker:
        parts_moved(season, "killed-coordinator", 70_000)
        child = epoch_child(season, apply_chunk=2000, **PART_ENV)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        worker.wait_for(lambda line: line.startswith("wrote") and line.endswith(" 0"))
        child.kill()
        child.wait(timeout=30)
        assert board_snapshot(season) == served
        lease_expired_wait(season)
        assert publish(season) == before + 1
        assert builds["n"] == 0
        assert assert_matches_ledger(season) == before + 1
    full_check(season, before + 1)


@pytest.mark.slow
def test_a_part_worker_that_wakes_after_its_part_was_run_again_writes_nothing(
        in_parts: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker is stopped (SIGSTOP) inside part 0: its claim lapses, and the epoch runs
    the part again under a newer token and publishes. Woken, the worker goes on with the
    writes it had planned from what the side held before: every one is refused (its
    token is older than the groups'), and the published version stays exact."""
    season = in_parts
    r = redis_get()
    builds = builds_counted(monkeypatch)
    with part_worker(env=PART_ENV, chunk_players=4, pause=0.02) as worker:
        parts_moved(season, "stopped-part", 90_000)
        thread, out = in_thread(lambda: season_epoch_advance(season=season, catch_up=False))
        worker.wait_for(lambda line: line.startswith("wrote") and line.endswith(" 0"))
        worker.signal(signal.SIGSTOP)
        thread.join(timeout=60)
        assert "error" not in out, out
        assert out["result"].status == "published"
        published = season_keys_dump(r, season)
        worker.signal(signal.SIGCONT)
        worker.wait_for(lambda line: "moved to a newer coordinator" in line, stream="errors")
        assert season_keys_dump(r, season) == published
    assert builds["n"] == 0
    assert assert_matches_ledger(season) == current_manifest(season).version
