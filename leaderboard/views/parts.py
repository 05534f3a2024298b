"""An epoch's apply split into parts (docs/architecture.md, Parts): each part owns a disjoint
set of the season's ledger partitions (so of its players), reads their changes in the
epoch's range from its own stream cursors, and writes them into the side being updated
under the season's fencing token; the coordinator only hands the parts out, waits for
their reports and adds up their counts and checksums: its own time does not grow with
the changes.

- A part's range is fixed by the coordinator before any part runs: (after, upto], the
  side's watermark and the stream heads it read. Running a part twice reads the same
  rows and writes nothing new (rankview.apply): its report is the same.
- Parts run on Celery workers (tasks.season_epoch_part, sent through the
  `epoch_parts_wanted` signal). The coordinator runs a part itself only when the range
  is one part (EPOCH_PARTS=1: the coordinator applies it) or when no worker claimed it
  within EPOCH_PART_CLAIM_SECONDS (none free, or none at all). A runner claims its part
  with SET NX and a TTL of one lease, renewed while it runs, so two runners never write
  one part at once.
- A part is lost when its runner died or failed (its claim lapsed or was let go
  without a report: PartDied) or holds its claim without reporting within
  EPOCH_PART_TIMEOUT_SECONDS (PartsStuck). Its runner may be a process paused, not dead,
  whose writes would still arrive under this apply's token, planned from what the side
  held before: nothing more is written under that token. The coordinator takes the
  season again under a newer one, stamped into every slot group first (so the lost
  runner's writes are refused wherever they land), and the epoch resumes the side, the
  lost part handed out again (views.epoch.season_epoch_run).
- A part run again reads the same rows and plans from what the side holds now: a
  runner that finds the part started by another applies it as resumed (no reply checks:
  some writes may have landed).
- A runner checks that the season's lease still holds its epoch's token before it
  writes: a part of an abandoned epoch (a redelivered message) writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson
import redis
from django.conf import settings

from leaderboard.core.epoch import BoardDeltas, parts_of, range_deltas, range_values
from leaderboard.core.partitions import Watermark
from leaderboard.ingest.selectors import stream_partition_changed, stream_range_rows
from leaderboard.views import rankview
from leaderboard.views.season_index import EpochError, season_keys, season_ties
from leaderboard.views.signals import epoch_parts_applied, epoch_parts_wanted
from seasons.models import Season

log = logging.getLogger(__name__)

# How long a part's report is kept (a redelivered message finds it and does nothing).
REPORT_TTL_SECONDS = 3600


class PartsLost(EpochError):
    """A part's runner is gone or stuck: nothing more may be written under the apply's
    token, and the side is resumed under a newer one (its late writes are fenced out)."""


class PartsStuck(PartsLost):
    """A part's runner holds its claim but has not reported in time."""


class PartDied(PartsLost):
    """A part's runner started it and let its claim go, or lost it, without a report."""


@dataclass(frozen=True, slots=True)
class PartSpec:
    """One part of one apply, as sent to a worker (JSON): everything it needs to read its
    rows and write them, and nothing it must look up but the season and the copy meta."""

    season_id: int
    token: int | None
    epoch: str  # the apply's id: the claims and reports are under it
    copy: str  # the copy whose side is written
    gen: int  # the copy's generation for this apply (a newer one: the apply is gone)
    part: int
    partitions: list[int]
    after: str  # watermark dumps
    upto: str
    current: str | None  # the serving version's watermark: what is new since it (None: all)
    resume: bool
    not_before: float = 0.0  # time.time() before which the side must not be written (grace)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartSpec:
        return cls(**data)


@dataclass(slots=True)
class PartReport:
    part: int
    boards: dict[str, BoardDeltas]
    rows: int = 0
    players: int = 0
    applied: int = 0
    fresh: int = 0  # players with a change the serving version does not have
    # (committed_at ms, changes) of the rows new since the serving version: their lag.
    batches: list[tuple[int, int]] = field(default_factory=list)
    cpu_seconds: float = 0.0
    seconds: float = 0.0
    waited: float = 0.0  # of `seconds`, asleep until the side's grace period was over
    runner: str = ""

    def as_json(self) -> bytes:
        return orjson.dumps({**{k: v for k, v in asdict(self).items() if k != "boards"},
                             "boards": {b: d.as_json() for b, d in self.boards.items()}})

    @classmethod
    def from_json(cls, raw: bytes) -> PartReport:
        data = orjson.loads(raw)
        data["boards"] = {b: BoardDeltas.from_json(d) for b, d in data["boards"].items()}
        data["batches"] = [tuple(b) for b in data["batches"]]
        return cls(**data)


@dataclass(slots=True)
class RangeReport:
    """What every part of one apply reported, added up."""

    boards: dict[str, BoardDeltas]
    parts: list[PartReport]
    seconds: float = 0.0  # from handing the parts out to the last report

    @property
    def applied(self) -> int:
        return sum(p.applied for p in self.parts)

    @property
    def fresh(self) -> int:
        return sum(p.fresh for p in self.parts)

    @property
    def batches(self) -> list[tuple[int, int]]:
        return [b for p in self.parts for b in p.batches]

    def then(self, later: RangeReport) -> RangeReport:
        """This range's report followed by the next one's (a resumed range, then the rest)."""
        boards = {board: BoardDeltas.zero(len(deltas.counts)) for board, deltas in self.boards.items()}
        for report in (self, later):
            for board, deltas in report.boards.items():
                boards[board].add(deltas)
        return RangeReport(boards=boards, parts=self.parts + later.parts, seconds=self.seconds + later.seconds)

    def touched(self) -> dict[str, set[int]]:
        return {board: deltas.touched for board, deltas in self.boards.items()}


def _runner_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------- a part


def part_run(spec: PartSpec, *, r: redis.Redis | None = None, runner: str | None = None,
             progress: Callable[[], None] | None = None) -> PartReport | None:
    """Run one part if nobody runs or ran it: claim it, read its rows, write them, report.
    Returns its report (the earlier one when it already ran), or None when another runner
    holds it or its apply is gone (a newer generation of the copy, another lease holder).
    `progress`: told as the apply gets on, besides the claim (the coordinator's lease
    keeper, when it runs the part itself)."""
    r = r or rankview_redis()
    season = Season.objects.filter(pk=spec.season_id).first()
    if season is None:
        return None
    keys = season_keys(season)
    done: Any = r.get(keys.part_report(spec.epoch, spec.part))
    if done is not None:
        return PartReport.from_json(done)
    if not _apply_live(r, keys, spec):
        # A part of an abandoned apply (a worker that slept through its epoch, a task
        # queued behind it): not even a claim of it is written.
        return None
    runner = runner or _runner_id()
    ttl_ms = int(settings.EPOCH_LEASE_SECONDS * 1000)
    claim = keys.part_claim(spec.epoch, spec.part)
    if not r.set(claim, runner, nx=True, px=ttl_ms):
        return None
    if r.set(keys.part_started(spec.epoch, spec.part), runner, ex=REPORT_TTL_SECONDS, get=True) is not None:
        # A runner before this one started the part and died: some of its writes may have
        # landed, which a first application's reply checks would take for a broken index.
        spec = replace(spec, resume=True)
    try:
        with _claim_kept(r, claim, runner, ttl_ms, also=progress) as kept:
            if not _apply_live(r, keys, spec):
                return None
            report = _part_apply(season, r, keys, spec, progress=kept.tick)
            report.runner = runner
            _report_store(r, keys, spec, report)
            return report
    finally:
        with contextlib.suppress(redis.RedisError):
            r.eval(_RELEASE, 1, claim, runner)


# A claim's value is its runner's id, then a space and how far the runner got (a count
# that moves while the part makes progress): the coordinator tells a slow part from a
# stuck one by it.
_OURS = ("local v = redis.call('GET', KEYS[1]) "
         "if v ~= ARGV[1] and string.sub(v or '', 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then return 0 end ")
_RELEASE = _OURS + "return redis.call('DEL', KEYS[1])"
_RENEW = _OURS + "redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2]) return 1"


class _Progress:
    """How far a part got: ticked by its apply (rows read, planned, each round trip of
    writes landed), carried into its claim by the keeper."""

    def __init__(self, also: Callable[[], None] | None = None) -> None:
        self.count = 0
        self.also = also

    def tick(self) -> None:
        self.count += 1
        if self.also is not None:
            self.also()


@contextlib.contextmanager
def _claim_kept(r: redis.Redis, claim: str, runner: str, ttl_ms: int, *,
                also: Callable[[], None] | None = None) -> Iterator[_Progress]:
    """Renew the part's claim every third of its TTL while the part runs, with its progress:
    a dead runner's claim lapses within one TTL, a stuck one's stops moving."""
    stop = threading.Event()
    progress = _Progress(also)

    def keep() -> None:
        while not stop.wait(ttl_ms / 3000):
            with contextlib.suppress(redis.RedisError):
                if not r.eval(_RENEW, 1, claim, runner, str(ttl_ms), str(progress.count)):
                    return

    keeper = threading.Thread(target=keep, name=f"part-claim-{claim}", daemon=True)
    keeper.start()
    try:
        yield progress
    finally:
        stop.set()
        keeper.join()


def _apply_live(r: redis.Redis, keys: rankview.Keys, spec: PartSpec) -> bool:
    """Whether the part's apply is still the one to run: its token holds the season's lease
    (none for a rebuild's shadow, claimed in the database) and its copy is at its generation."""
    if spec.token is not None:
        held = r.get(keys.lease)
        if held is None or int(held) != spec.token:
            return False
    meta = rankview.copy_meta_load(r, keys, spec.copy)
    return meta is not None and meta.gen == spec.gen


def _part_apply(season: Season, r: redis.Redis, keys: rankview.Keys, spec: PartSpec, *,
                progress: Callable[[], None] | None = None) -> PartReport:
    started, cpu = time.monotonic(), time.process_time()
    tick = progress or (lambda: None)
    meta = rankview.copy_meta_load(r, keys, spec.copy)
    if meta is None or meta.gen != spec.gen:
        raise EpochError(f"copy {spec.copy} moved on from generation {spec.gen}")
    ties = season_ties(season)
    regional = bool(meta.boards)
    rows = stream_range_rows(season_id=season.pk, partitions=spec.partitions, after=Watermark.parse(spec.after),
                             upto=Watermark.parse(spec.upto), reached=ties is not None, regions=regional)
    tick()
    values = range_values(rows, reached_origin=ties.origin_ms if ties is not None else None, regional=regional,
                          flip=season.board_kind.flip, hidden=True)
    boards = range_deltas(values, layout=meta.layout, regions=meta.boards)
    tick()
    wait = max(0.0, spec.not_before - time.time())
    if wait > 0:
        time.sleep(wait)
    applied = rankview.copy_range_apply(r, keys, spec.token, meta, values, resume=spec.resume, progress=tick)
    fresh, batches = _fresh(rows, spec.current, Watermark.parse(spec.upto))
    return PartReport(part=spec.part, boards=boards, rows=len(rows), players=len(values.new), applied=applied,
                      fresh=fresh, batches=batches, cpu_seconds=time.process_time() - cpu,
                      seconds=time.monotonic() - started, waited=wait)


def _fresh(rows: list[tuple[Any, ...]], current: str | None, upto: Watermark) -> tuple[int, list[tuple[int, int]]]:
    """The players with a change the serving version lacks, and those changes' commit
    times (a write batch shares one: a (time, changes) pair each)."""
    newer = Watermark.parse(current) if current is not None else None
    if newer is not None and newer >= upto:
        return 0, []  # a catch-up to the serving version: nothing in it is new
    players: set[str] = set()
    batches: dict[int, int] = {}
    for row in rows:
        if newer is not None and newer.covers(row[0], row[1]):
            continue
        players.add(row[2])
        batches[row[-1]] = batches.get(row[-1], 0) + 1
    return len(players), sorted(batches.items())


def _report_store(r: redis.Redis, keys: rankview.Keys, spec: PartSpec, report: PartReport) -> None:
    done = keys.parts_done(spec.epoch)
    with r.pipeline(transaction=False) as pipe:
        pipe.set(keys.part_report(spec.epoch, spec.part), report.as_json(), ex=REPORT_TTL_SECONDS)
        pipe.rpush(done, spec.part)
        pipe.expire(done, REPORT_TTL_SECONDS)
        pipe.execute()


def rankview_redis() -> redis.Redis:
    from leaderboard.redis_client import redis_get

    return redis_get()


# ------------------------------------------------------------- the coordinator's side


def range_partitions(*, season: Season, after: Watermark, upto: Watermark) -> list[int]:
    """The ledger partitions to read for (after, upto]: the season's layout's, and any of an
    older layout (a repartition) with a change in the range."""
    named = set(range(season.partition_base, season.partition_base + season.partitions))
    named |= {p for p in range(min(season.partition_base, max(after.partitions, upto.partitions)))
              if upto.cursor(p) > after.cursor(p)
              and stream_partition_changed(season_id=season.pk, partition=p, after=after, upto=upto)}
    return sorted(named)


def parts_plan(*, season: Season, after: Watermark, upto: Watermark, parts: int) -> list[list[int]]:
    """The partitions of each part. A range that reaches a partition of an older layout (a
    repartition since the side's watermark) is one part: a player's changes may then be in
    two partitions, and one part must see both."""
    partitions = range_partitions(season=season, after=after, upto=upto)
    if any(p < season.partition_base for p in partitions):
        return [partitions]
    return parts_of(partitions, parts)


def parts_apply(*, season: Season, r: redis.Redis, token: int | None, meta: rankview.CopyMeta, after: Watermark,
                upto: Watermark, current: Watermark | None, resume: bool, parts: int | None = None,
                not_before: float = 0.0, keeper: rankview.LeaseKeeper | None = None) -> RangeReport:
    """Apply the stream's range (after, upto] to `meta`'s side in parts and wait for all of
    them: their counts and checksums added up, and what each did. `meta` is being mutated
    (copy_begin_mutation: its generation is this apply's). `parts`: default EPOCH_PARTS."""
    started = time.monotonic()
    keys = season_keys(season)
    planned = parts_plan(season=season, after=after, upto=upto, parts=parts or settings.EPOCH_PARTS)
    epoch = f"{token or 'shadow'}.{meta.copy}.{meta.gen}"
    specs = [PartSpec(season_id=season.pk, token=token, epoch=epoch, copy=meta.copy, gen=meta.gen, part=i,
                      partitions=partitions, after=after.dump(), upto=upto.dump(),
                      current=current.dump() if current is not None else None, resume=resume,
                      not_before=not_before)
             for i, partitions in enumerate(planned)]
    r.delete(keys.parts_done(epoch))
    if len(specs) > 1:
        epoch_parts_wanted.send(sender=None, specs=[spec.as_json() for spec in specs])
    reports = _parts_wait(r, keys, specs, keeper=keeper)
    boards = {board: BoardDeltas.zero(meta.layout.size) for board in ("", *meta.boards)}
    for report in reports:
        for board, deltas in report.boards.items():
            boards[board].add(deltas)
    applied = RangeReport(boards=boards, parts=reports, seconds=time.monotonic() - started)
    epoch_parts_applied.send(sender=None, season_id=season.pk, copy=meta.copy, report=applied)
    return applied


def _claim_state(r: redis.Redis, keys: rankview.Keys, spec: PartSpec) -> tuple[bytes | None, bool]:
    """(the claim's value now: its runner and progress, None unclaimed; started by some runner)."""
    with r.pipeline(transaction=False) as pipe:
        pipe.get(keys.part_claim(spec.epoch, spec.part))
        pipe.exists(keys.part_started(spec.epoch, spec.part))
        claimed, started = pipe.execute()
    return claimed, bool(started)


def _parts_wait(r: redis.Redis, keys: rankview.Keys, specs: list[PartSpec],
                keeper: rankview.LeaseKeeper | None) -> list[PartReport]:
    """Every part's report: by workers, or run here when the range is one part or nobody
    claims one in time. PartDied when a runner started a part and its claim
    is gone without a report, PartsStuck when one holds it and its progress has not moved
    for EPOCH_PART_TIMEOUT_SECONDS (a big part may take longer, making progress)."""
    reports: dict[int, PartReport] = {}
    dispatched = time.monotonic()
    claim_wait = settings.EPOCH_PART_CLAIM_SECONDS
    timeout = settings.EPOCH_PART_TIMEOUT_SECONDS
    seen_claimed: dict[int, tuple[bytes, float]] = {}  # a part's claim value, since when
    me = _runner_id()
    pending = list(reversed(specs))  # the last sent is the last a worker takes: stolen first
    while len(reports) < len(specs):
        if keeper is not None:
            if keeper.lost:
                raise rankview.FenceLost(f"season {keys.season}: the lease was lost while its parts ran")
            keeper.progress()  # a stuck part is this loop's to find (EPOCH_PART_TIMEOUT_SECONDS)
        for spec in pending:
            if spec.part in reports:
                continue
            done: Any = r.get(keys.part_report(spec.epoch, spec.part))
            if done is not None:
                reports[spec.part] = PartReport.from_json(done)
                continue
            claimed, started = _claim_state(r, keys, spec)
            now = time.monotonic()
            if claimed is not None:
                value, since = seen_claimed.get(spec.part, (None, now))
                if value != claimed:
                    seen_claimed[spec.part] = (claimed, now)
                elif now - since > timeout:
                    raise PartsStuck(f"part {spec.part} of {spec.epoch} ({spec.partitions}) has made no progress "
                                     f"in {timeout:g} s")
                continue
            if started:
                # A runner stores its report before it lets its claim go: read once more.
                done = r.get(keys.part_report(spec.epoch, spec.part))
                if done is not None:
                    reports[spec.part] = PartReport.from_json(done)
                    continue
                raise PartDied(f"part {spec.part} of {spec.epoch} ({spec.partitions}): its runner stopped without "
                               "a report")
            if len(specs) == 1 or now - dispatched >= claim_wait:
                # One part (the coordinator applies the range itself), or unclaimed for too
                # long (no free worker): run it here.
                seen_claimed.pop(spec.part, None)
                report = part_run(spec, r=r, runner=me, progress=keeper.progress if keeper is not None else None)
                if report is not None:
                    reports[spec.part] = report
                elif not _apply_live(r, keys, spec):
                    raise rankview.FenceLost(f"season {keys.season}: apply {spec.epoch} is no longer the season's "
                                             "(another lease holder, or its copy moved on)")
        if len(reports) < len(specs):
            r.blpop([keys.parts_done(specs[0].epoch)], timeout=0.05)
    return [reports[spec.part] for spec in specs]
