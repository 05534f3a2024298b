"""An epoch's apply in parts (views.parts): each part owns some of the season's ledger
partitions, reads its own range of their streams and writes it under the season's token;
the coordinator adds their counts up. Parts run twice write nothing new, a stale or an
abandoned part writes nothing, a dead part is run again, a stuck one stops the epoch and
the next resumes it; parts sent to a real Celery worker run there."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaderboard.ingest.selectors import stream_committed_watermark
from leaderboard.redis_client import redis_get
from leaderboard.views import epoch as views_epoch
from leaderboard.views import parts as views_parts
from leaderboard.views import rankview
from leaderboard.views import signals as views_signals
from leaderboard.views.parts import PartSpec, PartsStuck, part_run, parts_plan
from seasons.models import Season
from tests.support import (
    Events,
    apply_events,
    assert_idle_copy_caught_up,
    assert_matches_ledger,
    builds_counted,
    current_manifest,
    epoch,
    keys_of,
    part_worker,
    publish,
    season_in_parts,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


@pytest.fixture
def eight(season_factory: Callable[..., Season], settings: Any) -> Season:
    """A season of 8 ledger partitions, 400 players, published; its epochs in 2 parts, and
    no worker to wait for (the coordinator runs every part)."""
    return season_in_parts(season_factory, settings, slug="parts", prefix="p", claim_seconds=0.0)


@pytest.fixture
def part_reports(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every report views.parts.parts_apply returns to the epoch, in order."""
    reports: list[Any] = []
    real = views_parts.parts_apply

    def kept(**kwargs: Any) -> Any:
        report = real(**kwargs)
        reports.append(report)
        return report

    monkeypatch.setattr(views_epoch, "parts_apply", kept)
    return reports


def moved(season: Season, tag: str, count: int = 200, shift: int = 50_000) -> None:
    apply_events(season, [Events(tag).correction(f"p{i:03d}", (2_503 * i + shift) % 1_000_001)
                          for i in range(0, 2 * count, 2)])


def test_an_epoch_in_parts_adds_up_what_each_part_applied(eight: Season, part_reports: list[Any]) -> None:
    moved(eight, "a")
    result = epoch(eight)
    assert (result.status, result.parts, result.applied, result.changed_players) == ("published", 2, 200, 200)
    apply_report, catch_up = part_reports
    for report in (apply_report, catch_up):
        assert [p.part for p in report.parts] == [0, 1]
        assert sum(p.rows for p in report.parts) == 200 and all(p.rows for p in report.parts)
    assert_matches_ledger(eight)
    assert_idle_copy_caught_up(eight)


def test_each_part_reads_only_its_own_partitions(eight: Season) -> None:
    current = current_manifest(eight)
    upto = stream_committed_watermark(season_id=eight.pk)
    assert parts_plan(season=eight, after=current.watermark, upto=upto, parts=2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parts_plan(season=eight, after=current.watermark, upto=upto, parts=16) == [[p] for p in range(8)]
    assert parts_plan(season=eight, after=current.watermark, upto=upto, parts=1) == [list(range(8))]


def test_after_a_repartition_a_range_reaching_the_old_partitions_is_one_part(eight: Season) -> None:
    from seasons.services import season_repartition
    from tests.support import TEST_ACTOR

    after = current_manifest(eight).watermark
    moved(eight, "before")
    season_repartition(season=eight, partitions=4, actor=TEST_ACTOR)
    eight.refresh_from_db()
    moved(eight, "after", shift=90_000)
    upto = stream_committed_watermark(season_id=eight.pk)
    # A player's changes are in an old partition and a new one: one part must see both.
    assert parts_plan(season=eight, after=after, upto=upto, parts=2) == [list(range(12))]
    publish(eight)
    assert_matches_ledger(eight)
    # Past the old partitions' last change, the new layout's four partitions in two parts.
    moved(eight, "later", shift=130_000)
    now = current_manifest(eight).watermark
    assert parts_plan(season=eight, after=now, upto=stream_committed_watermark(season_id=eight.pk),
                      parts=2) == [[8, 10], [9, 11]]
    publish(eight)
    assert_matches_ledger(eight)


def spec_of(season: Season, part: int = 0, **changes: Any) -> PartSpec:
    """The spec of part `part` of a 2-part apply to the idle copy, as the coordinator makes it
    (the copy begins its mutation; the test holds the season's lease)."""
    r = redis_get()
    keys = keys_of(season)
    current = current_manifest(season)
    idle = next(c for c in rankview.copies_get(r, keys) if c != current.copy)
    meta = rankview.copy_meta_load(r, keys, idle)
    assert meta is not None
    token = changes.pop("token", None) or int(r.get(keys.lease) or 0)
    upto = stream_committed_watermark(season_id=season.pk).merge(meta.watermark)
    meta = rankview.copy_begin_mutation(r, keys, token, meta, upto=upto)
    planned = parts_plan(season=season, after=meta.watermark, upto=upto, parts=2)
    values: dict[str, Any] = {
        "season_id": season.pk, "token": token, "epoch": f"{token}.{meta.copy}.{meta.gen}", "copy": meta.copy,
        "gen": meta.gen, "part": part, "partitions": planned[part], "after": meta.watermark.dump(),
        "upto": upto.dump(), "current": current.watermark.dump(), "resume": False}
    values.update(changes)
    return PartSpec(**values)


@pytest.fixture
def leased(eight: Season) -> Iterator[int]:
    r = redis_get()
    token = views_epoch.season_lease_acquire(season=eight, r=r, ttl_ms=60_000)
    assert token is not None
    yield token
    rankview.lease_release(r, keys_of(eight), token)


def test_a_part_run_twice_writes_nothing_new(eight: Season, leased: int) -> None:
    moved(eight, "twice")
    spec = spec_of(eight)
    first = part_run(spec)
    assert first is not None and first.applied > 0
    # A second delivery finds the report: the same one, nothing run.
    assert part_run(spec) == first
    # Run again from scratch (its report lost): the same rows, the same counts, and no
    # write it sends changes anything (every entry, record and field is already there).
    r, keys = redis_get(), keys_of(eight)
    r.delete(keys.part_report(spec.epoch, spec.part))
    before = {key: r.dump(key) for key in r.scan_iter(f"{keys.prefix}:{{{eight.slug}:*")}
    again = part_run(PartSpec.from_json({**spec.as_json(), "resume": True}))
    assert again is not None and again.boards == first.boards and again.rows == first.rows
    assert again.applied == 0  # every player's side holds its value already
    assert {key: r.dump(key) for key in r.scan_iter(f"{keys.prefix}:{{{eight.slug}:*")} == before


def test_a_part_of_an_abandoned_apply_or_a_stale_token_writes_nothing(eight: Season, leased: int) -> None:
    moved(eight, "stale")
    spec = spec_of(eight)
    r, keys = redis_get(), keys_of(eight)
    meta = rankview.copy_meta_load(r, keys, spec.copy)
    assert meta is not None
    # The copy moved on to a newer generation (the coordinator gave the apply up): skipped.
    rankview.copy_begin_mutation(r, keys, leased, meta)
    assert part_run(spec) is None
    # Another coordinator holds the season now: its token stamped every group first.
    rankview.lease_release(r, keys, leased)
    newer = views_epoch.season_lease_acquire(season=eight, r=r, ttl_ms=60_000)
    assert newer is not None
    assert part_run(PartSpec.from_json({**spec.as_json(), "gen": meta.gen})) is None  # not its lease
    with pytest.raises(rankview.FenceLost):  # and were it let through, every group refuses it
        views_parts._part_apply(eight, r, keys, PartSpec.from_json({**spec.as_json(), "gen": meta.gen}))
    rankview.lease_release(r, keys, newer)
    assert publish(eight) == current_manifest(eight).version
    assert_matches_ledger(eight)


@pytest.fixture
def worker_claims(eight: Season) -> Iterator[Callable[..., list[PartSpec]]]:
    """What a worker does with the parts it is sent, as far as a test needs: it claims part
    0 of the first `times` applies handed out with a TTL of `ttl` seconds and then...
    whatever the test makes of it (nothing: it died; renewing the claim: it is stuck).
    Returns the specs it claimed."""
    r, keys = redis_get(), keys_of(eight)
    claimed: list[PartSpec] = []
    wanted = {"ttl": 0.6, "times": 1}

    def receiver(specs: list[dict[str, Any]], **_: Any) -> None:
        for raw in specs:
            spec = PartSpec.from_json(raw)
            if spec.part == 0 and len(claimed) < wanted["times"]:
                claimed.append(spec)
                r.set(keys.part_claim(spec.epoch, 0), "a-worker", px=int(wanted["ttl"] * 1000))
                r.set(keys.part_started(spec.epoch, 0), "a-worker", ex=60)

    views_signals.epoch_parts_wanted.connect(receiver, dispatch_uid="test-worker-claims")

    def start(ttl: float, times: int = 1) -> list[PartSpec]:
        wanted.update(ttl=ttl, times=times)
        return claimed

    yield start
    views_signals.epoch_parts_wanted.disconnect(dispatch_uid="test-worker-claims")


def test_a_part_whose_runner_died_is_run_again_under_a_newer_token(
        eight: Season, settings: Any, monkeypatch: pytest.MonkeyPatch,
        worker_claims: Callable[..., list[PartSpec]]) -> None:
    """A worker claimed part 0 and died: its claim lapses within one lease (nobody renews
    it). The coordinator gives its token up, takes the season under a newer one and
    hands the part out again (run here once no worker claims it): published, no index
    built, and a write of the dead runner's, were it only paused, is refused."""
    settings.EPOCH_PART_CLAIM_SECONDS = 1.0
    r, keys = redis_get(), keys_of(eight)
    builds = builds_counted(monkeypatch)
    claimed = worker_claims(0.6)
    moved(eight, "dies")
    assert epoch(eight).status == "published"
    assert claimed and builds["n"] == 0
    assert_matches_ledger(eight)
    assert_idle_copy_caught_up(eight)
    # Had it been paused, not dead, its writes (here: of changes since, so that there is
    # something to write) would be refused by every group.
    meta = rankview.copy_meta_load(r, keys, claimed[0].copy)
    assert meta is not None
    moved(eight, "after-death", shift=222_000)
    with pytest.raises(rankview.FenceLost):
        views_parts._part_apply(eight, r, keys, PartSpec.from_json({
            **claimed[0].as_json(), "gen": meta.gen, "upto": stream_committed_watermark(season_id=eight.pk).dump()}))


def test_a_stuck_part_is_given_up_and_the_side_resumed_under_a_newer_token(
        eight: Season, settings: Any, monkeypatch: pytest.MonkeyPatch,
        worker_claims: Callable[..., list[PartSpec]]) -> None:
    """Part 0's runner holds its claim (alive) and never reports: the epoch gives up after
    EPOCH_PART_TIMEOUT_SECONDS and takes the season again under a newer token, which
    resumes the copy with no new index and publishes; the stuck runner's writes are
    fenced out. Stuck again, the second loss stops the call and the lease goes back."""
    settings.EPOCH_PART_CLAIM_SECONDS = 0.5
    settings.EPOCH_PART_TIMEOUT_SECONDS = 1.0
    r, keys = redis_get(), keys_of(eight)
    builds = builds_counted(monkeypatch)
    claimed = worker_claims(0.5)
    stop = threading.Event()

    def renew() -> None:  # the stuck runner's claim keeper, alive
        while not stop.wait(0.1):
            for spec in claimed:
                r.pexpire(keys.part_claim(spec.epoch, 0), 500)

    keeper = threading.Thread(target=renew, daemon=True)
    keeper.start()
    moved(eight, "stuck")
    assert epoch(eight).status == "published"
    assert len(claimed) == 1 and builds["n"] == 0
    assert_matches_ledger(eight)
    # The stuck runner wakes up and writes with its token (as if the copy were still at its
    # generation): what it would change is refused by every group, and nothing moves.
    meta = rankview.copy_meta_load(r, keys, claimed[0].copy)
    assert meta is not None
    before = {key: r.dump(key) for key in r.scan_iter(f"{keys.prefix}:{{{eight.slug}:*")}
    moved(eight, "after-stuck", shift=333_000)
    try:
        views_parts._part_apply(eight, r, keys, PartSpec.from_json({
            **claimed[0].as_json(), "gen": meta.gen, "upto": stream_committed_watermark(season_id=eight.pk).dump()}))
    except rankview.FenceLost:
        pass
    else:
        raise AssertionError("the stuck runner's writes were not refused")
    assert {key: r.dump(key) for key in r.scan_iter(f"{keys.prefix}:{{{eight.slug}:*")} == before
    # Stuck under the newer token too: the call stops and gives the lease back; the next
    # epoch resumes the copy.
    worker_claims(0.5, times=3)
    with pytest.raises(PartsStuck, match=r"part 0 .* has made no progress in 1 s"):
        epoch(eight)
    stop.set()
    keeper.join()
    assert r.get(keys.lease) is None
    publish(eight)
    assert builds["n"] == 0
    assert_matches_ledger(eight)


@pytest.mark.slow
def test_parts_sent_to_a_celery_worker_run_there(eight: Season, settings: Any, part_reports: list[Any]) -> None:
    """A real worker process takes the parts the coordinator sends (tasks.season_epoch_part),
    one after the other; the coordinator waits for its reports and runs none itself."""
    settings.EPOCH_PART_CLAIM_SECONDS = 30.0
    with part_worker(env={"EPOCH_PARTS": "2"}, chunk_players=2000, pause=0.0) as worker:
        moved(eight, "celery")
        assert epoch(eight).status == "published"
    runners = {p.part: p.runner for report in part_reports for p in report.parts}
    assert all(f":{worker.proc.pid}:" in runner for runner in runners.values()), runners
    assert_matches_ledger(eight)
