"""Capacity plan: the servers a target load needs, derived from measured per-operation costs.

Pure arithmetic. The costs come from the benchmarks' figures file (bench/figures.json,
`make figures`), never from constants typed here: a figure the plan needs and the file
lacks is a refusal naming the benchmark that measures it. Every number of the plan says
which figure (or which input) it came from (docs/operations.md: Sizing).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.errors import DomainError
from leaderboard.core.events import MAX_SCORE
from leaderboard.core.splits import split_recommendations


class CapacityError(DomainError):
    code = "capacity_plan"


class FigureMissing(CapacityError):
    code = "figure_missing"


# Each figure the plan reads, and the benchmark that measures it.
FIGURE_SOURCES: dict[str, str] = {
    "redis_bytes_per_player": "bench/memory.py",
    "epoch_part_ms_per_1k_changes": "bench/epoch.py",
    "epoch_parts_cpu_ms_per_1k_changes": "bench/epoch.py",
    "epoch_serial_ms": "bench/epoch.py",
    "epoch_redis_cpu_ms_per_1k_changes": "bench/epoch.py",
    "read_rank_rps_per_process": "bench/reads.py",
    "read_top_rps_per_process": "bench/reads.py",
    "read_neighbors_rps_per_process": "bench/reads.py",
    "read_rank_rps_per_redis_core": "bench/reads.py",
    "read_top_rps_per_redis_core": "bench/reads.py",
    "read_neighbors_rps_per_redis_core": "bench/reads.py",
    "ingest_events_per_s_per_web_worker": "bench/ingest.py",
    "ingest_postgres_cpu_ms_per_1k_events": "bench/ingest.py",
    "rebuild_players_per_s": "bench/rebuild.py",
}
# Optional: without it the ledger is sized at the design's 128-byte event, a lower bound.
LEDGER_BYTES_FIGURE = "ledger_bytes_per_event"
DESIGN_EVENT_BYTES = 128
READ_KINDS = ("rank", "top", "neighbors")
DISTRIBUTIONS = ("uniform", "normal", "top-heavy")
SECONDS_PER_DAY = 86_400
# EPOCH_PARTS' largest value.
MAX_EPOCH_PARTS = 64
_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000, "b": 1_000_000_000}
_BYTE_SUFFIXES = {"k": 1_000, "m": 1_000**2, "g": 1_000**3, "t": 1_000**4}


def quantity_parse(text: str, *, name: str = "value") -> int:
    """'50M' -> 50_000_000, '200k' -> 200_000, '1.5M', '1_000'; a count, not negative."""
    cleaned = str(text).strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if cleaned and cleaned[-1] in _SUFFIXES:
        scale, cleaned = _SUFFIXES[cleaned[-1]], cleaned[:-1]
    try:
        value = float(cleaned)
    except ValueError:
        raise CapacityError(f"{name} must be a number with an optional k/M/G suffix (e.g. 50M), got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise CapacityError(f"{name} must be a finite number >= 0, got {text!r}")
    return round(value * scale)


def bytes_parse(text: str, *, name: str = "size") -> int:
    """'32G' / '32GB' -> 32e9 bytes (decimal units, as the plan prints them)."""
    cleaned = str(text).strip().lower().removesuffix("b")
    scale = 1
    if cleaned and cleaned[-1] in _BYTE_SUFFIXES:
        scale, cleaned = _BYTE_SUFFIXES[cleaned[-1]], cleaned[:-1]
    try:
        value = float(cleaned)
    except ValueError:
        raise CapacityError(f"{name} must be a size like 32G, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise CapacityError(f"{name} must be > 0, got {text!r}")
    return round(value * scale)


def read_mix_parse(text: str) -> dict[str, float]:
    """'rank:60,top:30,neighbors:10' -> shares summing to 1."""
    weights: dict[str, float] = {}
    for item in str(text).split(","):
        if not item.strip():
            continue
        kind, _, weight = item.partition(":")
        kind = kind.strip().replace("neighbours", "neighbors")
        if kind not in READ_KINDS:
            raise CapacityError(f"read mix names {kind!r}; it takes {', '.join(READ_KINDS)}")
        try:
            weights[kind] = float(weight)
        except ValueError:
            raise CapacityError(f"read mix weight of {kind} must be a number, got {weight!r}") from None
        if not math.isfinite(weights[kind]) or weights[kind] < 0:
            raise CapacityError(f"read mix weight of {kind} must be >= 0")
    total = sum(weights.values())
    if total <= 0:
        raise CapacityError("the read mix needs a positive weight (e.g. rank:60,top:30,neighbors:10)")
    return {kind: weight / total for kind, weight in weights.items() if weight > 0}


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: float
    unit: str
    note: str = ""
    command: str = ""
    measured_at: str = ""

    def cite(self) -> str:
        return f"{self.name} = {_n(self.value)} {self.unit} ({self.note or 'no note'}; {self.command or '?'})"


def figures_parse(data: Mapping[str, Any]) -> dict[str, Figure]:
    """The figures of a figures file's JSON ({"figures": {name: {"value", "unit", ...}}})."""
    raw = data.get("figures") if isinstance(data, Mapping) else None
    if not isinstance(raw, Mapping):
        raise CapacityError('a figures file is a JSON object with a "figures" object')
    out: dict[str, Figure] = {}
    for name, entry in raw.items():
        value = entry.get("value") if isinstance(entry, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise CapacityError(f"figure {name!r} has no positive value")
        out[str(name)] = Figure(name=str(name), value=float(value), unit=str(entry.get("unit", "")),
                                note=str(entry.get("note", "")), command=str(entry.get("command", "")),
                                measured_at=str(entry.get("measured_at", "")))
    return out


@dataclass(frozen=True, slots=True)
class Target:
    players: int
    writes_per_second: int
    reads_per_second: int
    freshness_seconds: float = 5.0
    # Share of score events that change a player's best score (1.0: every one, the upper bound).
    change_fraction: float = 1.0
    read_mix: Mapping[str, float] = field(default_factory=lambda: {"rank": 0.6, "top": 0.3, "neighbors": 0.1})
    redis_replicas: int = 1
    redis_node_bytes: int = 32_000_000_000
    # Share of a node's memory the views may fill: the rest is for the fork of a snapshot or
    # a replica's full sync (copy-on-write), fragmentation and the other keys.
    redis_memory_fill: float = 0.5
    # Share of a core a Redis master, a web process or the PostgreSQL writers may be kept busy.
    utilization: float = 0.5
    bucket_member_budget: int = 1_000_000
    ledger_replicas: int = 3
    seasons: int = 1
    # COPY_GRACE_SECONDS: the catch-up of the side that stopped serving waits it out.
    copy_grace_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.players < 1 or self.writes_per_second < 0 or self.reads_per_second < 0:
            raise CapacityError("players must be >= 1, writes and reads per second >= 0")
        if not 0 < self.freshness_seconds <= 3600:
            raise CapacityError("freshness must be in (0, 3600] seconds")
        if not 0 < self.change_fraction <= 1 or not 0 < self.utilization <= 1 or not 0 < self.redis_memory_fill <= 1:
            raise CapacityError("change fraction, utilization and memory fill must be in (0, 1]")
        if self.redis_replicas < 0 or self.ledger_replicas < 1 or self.seasons < 1:
            raise CapacityError("ledger replicas and seasons must be >= 1, redis replicas >= 0")
        if self.bucket_member_budget < 1:
            raise CapacityError("the bucket member budget must be >= 1")
        if not 0 <= self.copy_grace_seconds < self.freshness_seconds:
            raise CapacityError("the copy grace period must be >= 0 and shorter than the freshness")


@dataclass(frozen=True, slots=True)
class Line:
    """One figure of the plan: what, how much, and from what (the arithmetic and its sources)."""

    label: str
    value: str
    derivation: str
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    lines: tuple[Line, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    target: Target
    sections: tuple[Section, ...]
    figures_used: tuple[Figure, ...]
    redis_masters: int
    web_processes: int
    celery_workers: int
    ledger_bytes_per_day: float
    meets_freshness: bool
    epoch_parts: int = 1


# ------------------------------------------------------------------------ distributions


def _normal_cdf(x: float) -> float:
    # Mean at mid-range, three standard deviations to either end, cut at the range.
    sd = 1 / 6
    edge = 0.5 * (1 + math.erf(-3 / math.sqrt(2)))
    raw = 0.5 * (1 + math.erf((x - 0.5) / (sd * math.sqrt(2))))
    return (raw - edge) / (1 - 2 * edge)


# CDF over the score range scaled to [0, 1]: top-heavy has density 4x^3, most players near the top.
_CDFS: dict[str, Callable[[float], float]] = {
    "uniform": lambda x: x,
    "normal": _normal_cdf,
    "top-heavy": lambda x: x**4,
}


def _cdf_inverse(cdf: Callable[[float], float], u: float) -> float:
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if cdf(mid) < u:
            low = mid
        else:
            high = mid
    return high


@dataclass(frozen=True, slots=True)
class Distribution:
    """Expected players per bucket and score quantiles inside a bucket."""

    label: str
    shares: tuple[float, ...]
    quantiles: Callable[[int, int], list[int]]  # (bucket, parts) -> scores
    share_between: Callable[[int, int], float]  # (low, high) scores, both included -> share of players


def distribution_shaped(name: str, layout: BucketLayout) -> Distribution:
    if name not in _CDFS:
        raise CapacityError(f"distribution must be one of {', '.join(DISTRIBUTIONS)} or a file of scores")
    cdf = _CDFS[name]
    span = MAX_SCORE + 1

    def between(low: int, high: int) -> float:
        return max(0.0, cdf((high + 1) / span) - cdf(low / span))

    def share(bucket: int) -> float:
        return between(*layout.range_of(bucket))

    def quantiles(bucket: int, parts: int) -> list[int]:
        low, high = layout.range_of(bucket)
        a, b = cdf(low / span), cdf((high + 1) / span)
        return [_ceil(_cdf_inverse(cdf, a + (b - a) * k / parts) * span) for k in range(1, parts)]

    return Distribution(label=name, shares=tuple(share(b) for b in range(layout.size)), quantiles=quantiles,
                        share_between=between)


def distribution_sampled(scores: Sequence[int], layout: BucketLayout, *, label: str) -> Distribution:
    if not scores:
        raise CapacityError("the file of sample scores holds no score")
    if any(not 0 <= s <= MAX_SCORE for s in scores):
        raise CapacityError(f"sample scores must be in 0..{MAX_SCORE}")
    ordered = sorted(scores)
    by_bucket: list[list[int]] = [[] for _ in range(layout.size)]
    for s in ordered:
        by_bucket[layout.bucket_of(s)].append(s)

    def between(low: int, high: int) -> float:
        return (bisect_right(ordered, high) - bisect_left(ordered, low)) / len(ordered)

    def quantiles(bucket: int, parts: int) -> list[int]:
        inside = by_bucket[bucket]
        return [inside[len(inside) * k // parts] for k in range(1, parts)] if inside else []

    return Distribution(label=f"{label} ({len(scores):,} sample scores)",
                        shares=tuple(len(b) / len(scores) for b in by_bucket), quantiles=quantiles,
                        share_between=between)


# ---------------------------------------------------------------------------------- plan


def _need(figures: Mapping[str, Figure], name: str, used: dict[str, Figure]) -> Figure:
    figure = figures.get(name)
    if figure is None:
        raise FigureMissing(f"the figures file has no {name}: run {FIGURE_SOURCES.get(name, 'the benchmarks')} "
                            "(or `make figures`) to measure it")
    used[name] = figure
    return figure


def _ceil(value: float) -> int:
    # 100,000 x (0.5 / 5,000 + 0.5 / 1,000) is 60.000000000000004 in floats: not 61 processes.
    return math.ceil(round(value, 9))


def _n(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e12:,.2f} TB" if nbytes >= 1e12 else f"{nbytes / 1e9:,.2f} GB"


def capacity_plan(*, target: Target, figures: Mapping[str, Figure], distribution: Distribution,
                  layout: BucketLayout) -> Plan:
    used: dict[str, Figure] = {}
    t = target
    sections: list[Section] = []
    util = t.utilization

    # --- Redis: memory, then CPU (epochs and reads share a master's one core).
    # Both copies: the two sides of one index, with one epoch's changes held twice.
    bpp = _need(figures, "redis_bytes_per_player", used).value
    view_bytes = t.players * bpp
    usable = t.redis_node_bytes * t.redis_memory_fill
    masters_memory = max(1, _ceil(view_bytes / usable))
    changes_per_s = t.writes_per_second * t.change_fraction
    epoch_redis_ms = _need(figures, "epoch_redis_cpu_ms_per_1k_changes", used).value
    epoch_cores = changes_per_s / 1000 * epoch_redis_ms / 1000
    read_cores = 0.0
    read_terms = []
    for kind, share in t.read_mix.items():
        per_core = _need(figures, f"read_{kind}_rps_per_redis_core", used).value
        read_cores += t.reads_per_second * share / per_core
        read_terms.append(f"{share:.0%} / {_n(per_core)}")
    masters_cpu = max(1, _ceil((epoch_cores + read_cores) / util))
    masters = max(masters_memory, masters_cpu) + 1
    per_master = view_bytes / masters
    sections.append(Section("Redis (rank views; REDIS_CLUSTER)", (
        Line("view memory", _gb(view_bytes),
             f"{t.players:,} players x {bpp:,.1f} bytes (both copies)",
             ("redis_bytes_per_player",)),
        Line("masters for memory", str(masters_memory),
             f"{_gb(view_bytes)} / ({_gb(t.redis_node_bytes)} per node x {t.redis_memory_fill:.0%} fill) rounded up",
             ("redis_bytes_per_player", "input --redis-node-memory", "input --redis-memory-fill")),
        Line("Redis cores for epochs", _n(epoch_cores),
             f"{_n(changes_per_s)} changes/s / 1,000 x {epoch_redis_ms:,.1f} ms",
             ("epoch_redis_cpu_ms_per_1k_changes",)),
        Line("Redis cores for reads", _n(read_cores),
             f"{t.reads_per_second:,} reads/s x ({' + '.join(read_terms)} reads/s per core)",
             tuple(f"read_{k}_rps_per_redis_core" for k in t.read_mix)),
        Line("masters for CPU", str(masters_cpu),
             f"({_n(epoch_cores)} + {_n(read_cores)}) cores / {util:.0%} utilization rounded up",
             ("epoch_redis_cpu_ms_per_1k_changes", "read_*_rps_per_redis_core", "input --utilization")),
        Line("masters", str(masters), f"max({masters_memory}, {masters_cpu}) + 1 to lose one node",
             ("the two lines above",)),
        Line("memory per master", _gb(per_master),
             f"{_gb(view_bytes)} / {masters} masters; {_gb(view_bytes / max(1, masters - 1))} after losing one "
             f"and resharding; node {_gb(t.redis_node_bytes)}", ("redis_bytes_per_player",)),
        Line("nodes with replicas", str(masters * (1 + t.redis_replicas)),
             f"{masters} masters x (1 + {t.redis_replicas} replica)", ("input --redis-replicas",)),
    ), notes=("A bucket's sorted set lives whole on one master: no master holds less than its biggest bucket "
              "(see Buckets).",
              "Read cores are counted on the masters; replicas are kept for failover, not counted for reads.")))

    # --- Buckets: expected members per bucket against the budget.
    budget = t.bucket_member_budget
    counts = [round(t.players * s) for s in distribution.shares]
    quantile_scores = {b: distribution.quantiles(b, _ceil(c / budget))
                       for b, c in enumerate(counts) if c > budget}
    proposals = split_recommendations(layout=layout, counts=counts, changes=counts, quantile_scores=quantile_scores,
                                      max_share=budget / t.players, max_change_share=1.0)
    over = [b for b, c in enumerate(counts) if c > budget]
    split = {p.bucket for p in proposals}
    bucket_lines = [Line("layout", f"{layout.size} buckets",
                         f"uniform width {layout.range_of(0)[1] - layout.range_of(0)[0] + 1:,} over 0..{MAX_SCORE:,}",
                         ("the default layout",)),
                    Line("largest bucket", f"{max(counts):,} players",
                         f"{t.players:,} players x {max(distribution.shares):.2%} ({distribution.label})",
                         ("input --distribution",)),
                    Line("buckets over budget", str(len(over)), f"more than {budget:,} members each",
                         ("input --bucket-budget",))]
    for p in proposals:
        points = ", ".join(f"{x:,}" for x in p.split_points[:4]) + (
            f", ... ({len(p.split_points)} points)" if len(p.split_points) > 4 else "")
        bucket_lines.append(Line(f"split bucket {p.bucket}", f"into {len(p.split_points) + 1}",
                                 f"[{p.low:,}..{p.high:,}] holds {p.players:,} ({p.share:.1%}); at {points}",
                                 ("input --distribution", "input --bucket-budget")))
    notes = [f"bucket {b} holds {counts[b]:,} players tied on too few score values to split: more copies or "
             "masters cannot help it" for b in over if b not in split]
    for p in proposals:
        # A split never divides one score value: a part can still hold more than the budget.
        bounds = [p.low, *p.split_points, p.high + 1]
        biggest = max(round(t.players * distribution.share_between(a, b - 1))
                      for a, b in zip(bounds, bounds[1:], strict=False))
        if biggest > budget:
            notes.append(f"bucket {p.bucket} split still leaves {biggest:,} players in one part: they are tied on "
                         "too few score values to split")
    sections.append(Section("Buckets", tuple(bucket_lines), tuple(notes)))

    # --- Web processes: reads and writes, each rate at one process per core.
    read_seconds = 0.0
    read_rate_terms = []
    for kind, share in t.read_mix.items():
        per_process = _need(figures, f"read_{kind}_rps_per_process", used).value
        read_seconds += share / per_process
        read_rate_terms.append(f"{share:.0%} / {_n(per_process)}")
    read_processes = _ceil(t.reads_per_second * read_seconds) + 1
    ingest = _need(figures, "ingest_events_per_s_per_web_worker", used).value
    write_processes = _ceil(t.writes_per_second / ingest) + 1
    sections.append(Section("Web processes (one per core)", (
        Line("read processes", str(read_processes),
             f"{t.reads_per_second:,} reads/s x ({' + '.join(read_rate_terms)} reads/s per process) rounded up, + 1",
             tuple(f"read_{k}_rps_per_process" for k in t.read_mix)),
        Line("write processes", str(write_processes),
             f"{t.writes_per_second:,} events/s / {_n(ingest)} events/s per worker rounded up, + 1",
             ("ingest_events_per_s_per_web_worker",)),
    )))

    # --- Epochs: one coordinator per season (it holds the season's lease) hands each
    # epoch's changes to parts that apply them at once on the Celery workers.
    interval = t.freshness_seconds / 2
    per_epoch = changes_per_s * interval
    part_ms = _need(figures, "epoch_part_ms_per_1k_changes", used).value
    serial_s = _need(figures, "epoch_serial_ms", used).value / 1000
    cpu_ms = _need(figures, "epoch_parts_cpu_ms_per_1k_changes", used).value
    timing = _epoch_timing(per_epoch=per_epoch, interval=interval, part_ms=part_ms, serial_s=serial_s,
                           grace_s=t.copy_grace_seconds, freshness_s=t.freshness_seconds)
    parts, apply_s, publish_s, cycle_s = timing
    meets = publish_s + interval <= t.freshness_seconds and cycle_s <= interval
    part_busy = 2 * apply_s / interval
    coordinator_busy = serial_s / interval
    parts_cores = changes_per_s / 1000 * cpu_ms / 1000
    # Per season: the coordinator and a worker per part (the coordinator runs none of a
    # multi-part apply, only waits); a standby coordinator; one worker for reconciliation,
    # rebuilds and the lifecycle.
    workers = t.seasons * (parts + 1) + t.seasons + 1
    rebuild = _need(figures, "rebuild_players_per_s", used).value
    sections.append(Section("Celery workers and epoch coordinators", (
        Line("epoch interval", f"{interval:g} s", f"freshness {t.freshness_seconds:g} s / 2: an epoch's changes wait "
             "at most one interval, its publication must fit in the other half", ("input --freshness-seconds",)),
        Line("changes per epoch", f"{per_epoch:,.0f}",
             f"{t.writes_per_second:,} events/s x {t.change_fraction:.0%} changing x {interval:g} s",
             ("input --change-fraction",)),
        Line("parts per epoch (EPOCH_PARTS)", str(parts),
             "the fewest with publish + interval <= freshness and publish + grace + catch-up <= interval"
             + ("" if meets else f" (none up to {MAX_EPOCH_PARTS} does)"),
             ("epoch_part_ms_per_1k_changes", "epoch_serial_ms", "input --freshness-seconds")),
        Line("ledger partitions per season", f">= {parts}",
             "SEASON_PARTITIONS: a part owns whole partitions", ("the line above",)),
        Line("a part's apply", f"{apply_s:,.2f} s",
             f"{per_epoch:,.0f} / {parts} parts / 1,000 x {part_ms:,.1f} ms", ("epoch_part_ms_per_1k_changes",)),
        Line("publish time per epoch", f"{publish_s:,.2f} s",
             f"coordinator {serial_s * 1000:,.0f} ms + one part's apply {apply_s:,.2f} s",
             ("epoch_serial_ms", "epoch_part_ms_per_1k_changes")),
        Line("epoch cycle", f"{cycle_s:,.2f} s",
             f"publish {publish_s:,.2f} s + grace {t.copy_grace_seconds:g} s + catch-up of the other side "
             f"{apply_s:,.2f} s, at most the interval {interval:g} s", ("epoch_part_ms_per_1k_changes",
                                                                         "input --copy-grace-seconds")),
        Line("each part busy", f"{part_busy:.0%}",
             f"2 sides x {apply_s:,.2f} s / {interval:g} s", ("epoch_part_ms_per_1k_changes",)),
        Line("coordinator busy", f"{coordinator_busy:.0%}",
             f"{serial_s * 1000:,.0f} ms an epoch / {interval:g} s (the parts run on workers)",
             ("epoch_serial_ms",)),
        Line("freshness", "met" if meets else "NOT met",
             f"interval {interval:g} s + publish {publish_s:,.2f} s vs {t.freshness_seconds:g} s; cycle "
             f"{cycle_s:,.2f} s vs interval {interval:g} s",
             ("epoch_part_ms_per_1k_changes", "epoch_serial_ms")),
        Line("parts' CPU", f"{parts_cores:,.1f} cores",
             f"{_n(changes_per_s)} changes/s / 1,000 x {cpu_ms:,.1f} ms (both sides)",
             ("epoch_parts_cpu_ms_per_1k_changes",)),
        Line("epoch coordinators", f"{t.seasons} + {t.seasons} standby",
             "one per live season (its lease), a standby takes over within EPOCH_LEASE_SECONDS", ("input --seasons",)),
        Line("Celery worker processes", str(workers),
             f"{t.seasons} season(s) x ({parts} part workers + the coordinator) + {t.seasons} "
             f"standby + 1 for reconciliation, rebuilds and the lifecycle, on at least "
             f"{_ceil(parts_cores / util) + t.seasons} cores", ("the lines above", "input --utilization")),
        Line("rebuild of the season", f"{t.players / rebuild / 60:,.1f} min",
             f"{t.players:,} players / {_n(rebuild)} players/s", ("rebuild_players_per_s",)),
    ), notes=("A part's figure is measured on one Redis; on a cluster each part's writes spread over the masters, "
              "whose CPU is counted under Redis.",) + (() if meets else (
        f"Even {MAX_EPOCH_PARTS} parts cannot publish this change rate within the freshness: lower the change rate "
        "per season (fewer changing events), or a longer freshness.",))))

    # --- PostgreSQL: the ledger's growth and the writers' CPU.
    ledger = figures.get(LEDGER_BYTES_FIGURE)
    if ledger is not None:
        used[LEDGER_BYTES_FIGURE] = ledger
        event_bytes, event_source = ledger.value, LEDGER_BYTES_FIGURE
    else:
        event_bytes, event_source = float(DESIGN_EVENT_BYTES), "the design's 128-byte event (not measured)"
    per_second = t.writes_per_second * event_bytes
    per_day = per_second * SECONDS_PER_DAY
    pg_ms = _need(figures, "ingest_postgres_cpu_ms_per_1k_events", used).value
    pg_cores = t.writes_per_second / 1000 * pg_ms / 1000
    sections.append(Section("PostgreSQL (ledger, current scores, change stream)", (
        Line("ledger write rate", f"{per_second / 1e6:,.1f} MB/s", f"{t.writes_per_second:,} events/s x "
             f"{event_bytes:,.0f} bytes", (event_source,)),
        Line("ledger growth per day", _gb(per_day), f"{per_second / 1e6:,.1f} MB/s x {SECONDS_PER_DAY:,} s",
             (event_source,)),
        Line(f"with {t.ledger_replicas} replicas", _gb(per_day * t.ledger_replicas),
             f"{_gb(per_day)} x {t.ledger_replicas} (a lower bound: no WAL, no current scores or change stream, "
             "uncompressed)", (event_source, "input --ledger-replicas")),
        Line("writer CPU", f"{pg_cores:,.1f} cores",
             f"{t.writes_per_second:,} events/s / 1,000 x {pg_ms:,.1f} ms", ("ingest_postgres_cpu_ms_per_1k_events",)),
        Line("writer cores to provision", str(_ceil(pg_cores / util)),
             f"{pg_cores:,.1f} cores / {util:.0%} utilization rounded up",
             ("ingest_postgres_cpu_ms_per_1k_events", "input --utilization")),
    )))
    return Plan(target=t, sections=tuple(sections), figures_used=tuple(used[k] for k in sorted(used)),
                redis_masters=masters, web_processes=read_processes + write_processes, celery_workers=workers,
                ledger_bytes_per_day=per_day, meets_freshness=meets, epoch_parts=parts)


def _epoch_timing(*, per_epoch: float, interval: float, part_ms: float, serial_s: float, grace_s: float,
                  freshness_s: float) -> tuple[int, float, float, float]:
    """(parts, a part's apply, publish, cycle) for the fewest parts that publish an epoch's
    changes within the freshness and bring the other side up before the next epoch (the
    most parts when none does). A part applies its share alone on its core."""
    for parts in range(1, MAX_EPOCH_PARTS + 1):
        apply_s = per_epoch / parts / 1000 * part_ms / 1000
        publish_s = serial_s + apply_s
        cycle_s = publish_s + grace_s + apply_s
        if publish_s + interval <= freshness_s and cycle_s <= interval:
            break
    return parts, apply_s, publish_s, cycle_s


def plan_text(plan: Plan, *, figures_path: str, distribution_label: str) -> str:
    t = plan.target
    out = [f"Capacity plan: {t.players:,} players, {t.writes_per_second:,} writes/s, {t.reads_per_second:,} reads/s, "
           f"freshness {t.freshness_seconds:g} s; score distribution {distribution_label}",
           f"Figures from {figures_path}; each line ends with [the figures or inputs it comes from].", ""]
    for section in plan.sections:
        out.append(section.title)
        width = max(len(line.label) for line in section.lines)
        for line in section.lines:
            out.append(f"  {line.label:<{width}}  {line.value:>14}  = {line.derivation}  [{', '.join(line.sources)}]")
        out.extend(f"  note: {note}" for note in section.notes)
        out.append("")
    out.append("Measured figures used")
    out.extend(f"  {figure.cite()}" for figure in plan.figures_used)
    return "\n".join(out)
