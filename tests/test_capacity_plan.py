"""Sizing from measured figures: leaderboard.core.capacity's arithmetic against hand-computed
cases (the design write-up's ledger figures among them), and `manage.py capacity_plan` on a
fixture figures file: every printed number names its source, a missing figure names the
benchmark to run."""

from __future__ import annotations

import json
import math
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.capacity import (
    CapacityError,
    Figure,
    FigureMissing,
    Target,
    capacity_plan,
    distribution_sampled,
    distribution_shaped,
    figures_parse,
    quantity_parse,
    read_mix_parse,
)

LAYOUT = BucketLayout.uniform()

# Round numbers, so every line of the plan below can be computed by hand.
FIGURES: dict[str, float] = {
    "redis_bytes_per_player": 100.0,
    "epoch_redis_cpu_ms_per_1k_changes": 10.0,
    "epoch_part_ms_per_1k_changes": 40.0,
    "epoch_parts_cpu_ms_per_1k_changes": 60.0,
    "epoch_serial_ms": 100.0,
    "read_rank_rps_per_redis_core": 50_000.0,
    "read_top_rps_per_redis_core": 100_000.0,
    "read_neighbors_rps_per_redis_core": 10_000.0,
    "read_rank_rps_per_process": 5_000.0,
    "read_top_rps_per_process": 10_000.0,
    "read_neighbors_rps_per_process": 1_000.0,
    "ingest_events_per_s_per_web_worker": 2_500.0,
    "ingest_postgres_cpu_ms_per_1k_events": 30.0,
    "rebuild_players_per_s": 50_000.0,
}


def figures(**changes: float | None) -> dict[str, Figure]:
    values = {**FIGURES, **changes}
    return {name: Figure(name=name, value=value, unit="u", note=f"note of {name}", command=f"bench/x.py {name}")
            for name, value in values.items() if value is not None}


def small_target(**overrides: Any) -> Target:
    fields: dict[str, Any] = {
        "players": 1_000_000, "writes_per_second": 10_000, "reads_per_second": 100_000, "freshness_seconds": 5.0,
        "read_mix": {"rank": 1.0}, "redis_node_bytes": 1_000_000_000, "redis_memory_fill": 0.5, "utilization": 0.5,
        "redis_replicas": 1, "ledger_replicas": 3,
    }
    fields.update(overrides)
    return Target(**fields)


def plan_of(target: Target, figs: dict[str, Figure] | None = None, shape: str = "uniform") -> Any:
    return capacity_plan(target=target, figures=figures() if figs is None else figs,
                         distribution=distribution_shaped(shape, LAYOUT), layout=LAYOUT)


def line(plan: Any, label: str) -> Any:
    return next(line for section in plan.sections for line in section.lines if line.label == label)


# ------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("text", "value"), [
    ("50M", 50_000_000), ("200k", 200_000), ("1M", 1_000_000), ("1.5k", 1_500), ("1_000", 1_000), ("7", 7),
    ("2G", 2_000_000_000), (" 10K ", 10_000),
])
def test_quantities_take_k_m_g_suffixes(text: str, value: int) -> None:
    assert quantity_parse(text) == value


@pytest.mark.parametrize("text", ["", "M", "abc", "-1", "1e999", "nan", "5X"])
def test_a_quantity_that_is_not_a_count_is_refused(text: str) -> None:
    with pytest.raises(CapacityError):
        quantity_parse(text)


def test_the_read_mix_is_normalised_and_takes_the_british_spelling() -> None:
    assert read_mix_parse("rank:3,top:1") == {"rank": 0.75, "top": 0.25}
    assert read_mix_parse("neighbours:1") == {"neighbors": 1.0}
    with pytest.raises(CapacityError):
        read_mix_parse("friends:1")


def test_a_figure_without_a_positive_value_is_refused() -> None:
    assert figures_parse({"figures": {"a": {"value": 2, "unit": "ms"}}})["a"].value == 2.0
    for bad in ({"value": 0}, {"value": "3"}, {"value": None}, {}, {"value": True}):
        with pytest.raises(CapacityError):
            figures_parse({"figures": {"a": bad}})
    with pytest.raises(CapacityError):
        figures_parse({"a": 1})


# ---------------------------------------------------------------------------- arithmetic


def test_a_hand_computed_plan() -> None:
    plan = plan_of(small_target())
    # 1M players x 100 bytes (both copies) = 100 MB; a 1 GB node filled to 50% holds it: 1 master.
    assert line(plan, "view memory").value == "0.10 GB"
    assert line(plan, "masters for memory").value == "1"
    # Epochs: 10,000 changes/s / 1,000 x 10 ms = 0.1 core; reads: 100,000 / 50,000 = 2 cores;
    # (0.1 + 2) / 50% = 4.2 -> 5 masters, + 1 to lose one = 6.
    assert line(plan, "Redis cores for epochs").value == "0.1"
    assert line(plan, "Redis cores for reads").value == "2"
    assert line(plan, "masters for CPU").value == "5"
    assert plan.redis_masters == 6
    assert line(plan, "nodes with replicas").value == "12"
    # 100,000 / 5,000 = 20 read processes + 1; 10,000 / 2,500 = 4 write processes + 1.
    assert line(plan, "read processes").value == "21"
    assert line(plan, "write processes").value == "5"
    assert plan.web_processes == 26
    # Epoch every 2.5 s: 25,000 changes. One part applies them in 25 x 40 ms = 1 s, publishes
    # in 0.1 + 1 = 1.1 s, but with the 0.5 s grace and the other side's 1 s the cycle is 2.6 s,
    # longer than the interval; two parts: 0.5 s each, publish 0.6 s, cycle 1.6 s.
    assert line(plan, "changes per epoch").value == "25,000"
    assert plan.epoch_parts == 2
    assert line(plan, "parts per epoch (EPOCH_PARTS)").value == "2"
    assert line(plan, "ledger partitions per season").value == ">= 2"
    assert line(plan, "a part's apply").value == "0.50 s"
    assert line(plan, "publish time per epoch").value == "0.60 s"
    assert line(plan, "epoch cycle").value == "1.60 s"
    assert line(plan, "each part busy").value == "40%"  # 2 x 0.5 s / 2.5 s
    assert line(plan, "coordinator busy").value == "4%"  # 0.1 / 2.5: the parts run on workers
    assert line(plan, "parts' CPU").value == "0.6 cores"  # 10 x 60 ms
    assert plan.meets_freshness
    # 2 part workers + the coordinator, + 1 standby + 1 for reconciliation and rebuilds.
    assert plan.celery_workers == 5
    assert line(plan, "rebuild of the season").value == "0.3 min"  # 1M / 50,000 players/s = 20 s
    # No measured event size: the design's 128 bytes. 10,000 x 128 = 1.28 MB/s x 86,400 s.
    assert plan.ledger_bytes_per_day == pytest.approx(10_000 * 128 * 86_400)
    assert line(plan, "writer CPU").value == "0.3 cores"  # 10 x 30 ms
    assert line(plan, "writer cores to provision").value == "1"


def test_the_write_ups_ledger_arithmetic_without_a_measured_event_size() -> None:
    """200,000 events/s x 128 bytes = 25.6 MB/s; x 86,400 s = 2.21184 TB/day; x 3 = 6.63552 TB/day."""
    plan = plan_of(small_target(players=50_000_000, writes_per_second=200_000, reads_per_second=1_000_000))
    assert plan.ledger_bytes_per_day == pytest.approx(2.21184e12)
    assert line(plan, "ledger write rate").value == "25.6 MB/s"
    assert line(plan, "ledger growth per day").value == "2.21 TB"
    assert line(plan, "with 3 replicas").value == "6.64 TB"
    assert line(plan, "ledger write rate").sources == ("the design's 128-byte event (not measured)",)


def test_a_measured_event_size_replaces_the_design_figure() -> None:
    figs = figures(ledger_bytes_per_event=400.0)
    plan = plan_of(small_target(writes_per_second=200_000), figs)
    assert plan.ledger_bytes_per_day == pytest.approx(200_000 * 400 * 86_400)
    assert line(plan, "ledger write rate").sources == ("ledger_bytes_per_event",)
    assert "ledger_bytes_per_event" in [f.name for f in plan.figures_used]


def test_memory_bound_masters_and_the_headroom_to_lose_one() -> None:
    # 20M players x 100 bytes = 2 GB over 1 GB nodes at 50%: 4 masters for memory, 5 with headroom.
    plan = plan_of(small_target(players=20_000_000, reads_per_second=1_000))
    assert line(plan, "masters for memory").value == "4"
    assert plan.redis_masters == 5
    assert line(plan, "memory per master").value == "0.40 GB"  # 2 GB / 5
    assert "0.50 GB after losing one" in line(plan, "memory per master").derivation


def test_the_seed_change_rate_is_met_with_more_parts() -> None:
    # 200,000 changes/s: 500,000 an epoch, 20 s of one part's work; the cycle 0.1 + 0.5 + 2 x
    # 20 / P s fits in 2.5 s from P = 22 (P = 21: 2.505 s).
    plan = plan_of(small_target(writes_per_second=200_000))
    assert plan.epoch_parts == 22 and plan.meets_freshness
    assert line(plan, "a part's apply").value == "0.91 s"
    assert line(plan, "parts' CPU").value == "12.0 cores"  # 200 x 60 ms
    # Only half the events changing a best score: half the parts.
    assert plan_of(small_target(writes_per_second=200_000, change_fraction=0.5)).epoch_parts == 11


def test_a_change_rate_no_number_of_parts_can_publish_in_time_is_reported_not_met() -> None:
    # 400 ms per 1,000 changes: the cycle 0.6 s + 400 s / P fits in 2.5 s only from P = 211.
    plan = plan_of(small_target(writes_per_second=200_000), figures(epoch_part_ms_per_1k_changes=400.0))
    assert not plan.meets_freshness
    assert plan.epoch_parts == 64
    assert line(plan, "freshness").value == "NOT met"
    assert "none up to 64 does" in line(plan, "parts per epoch (EPOCH_PARTS)").derivation


def test_a_grace_period_as_long_as_the_interval_cannot_be_met() -> None:
    plan = plan_of(small_target(freshness_seconds=1.0, copy_grace_seconds=0.5))
    assert not plan.meets_freshness


def test_the_read_mix_weighs_each_kind_by_its_own_measured_rate() -> None:
    plan = plan_of(small_target(read_mix={"rank": 0.5, "neighbors": 0.5}))
    # 100,000 x (0.5 / 5,000 + 0.5 / 1,000) = 60 processes + 1; Redis: 100,000 x (0.5/50,000 + 0.5/10,000) = 6 cores.
    assert line(plan, "read processes").value == "61"
    assert line(plan, "Redis cores for reads").value == "6"
    assert set(line(plan, "read processes").sources) == {"read_rank_rps_per_process", "read_neighbors_rps_per_process"}


# ------------------------------------------------------------------------------- buckets


def test_uniform_scores_need_no_split_but_top_heavy_ones_split_the_top_buckets() -> None:
    target = small_target(players=50_000_000)
    uniform = plan_of(target)
    assert line(uniform, "largest bucket").value == "500,000 players"  # 1% of 50M per bucket
    assert line(uniform, "buckets over budget").value == "0"
    top_heavy = plan_of(target, shape="top-heavy")
    splits = [ln for s in top_heavy.sections for ln in s.lines if ln.label.startswith("split bucket")]
    # F(x) = x^4 over 0..1,000,000 (1,000,001 values): bucket 99 [990,000..999,999] holds about
    # 1 - 0.99^4 = 3.94% = 1.97M players: 2 parts.
    assert splits[-1].label == "split bucket 99" and splits[-1].value == "into 2"
    expected = 50_000_000 * ((1_000_000 / 1_000_001) ** 4 - (990_000 / 1_000_001) ** 4)
    assert f"holds {round(expected):,}" in splits[-1].derivation
    # Its split point halves the bucket's players: F(p) = (F(low) + F(high)) / 2.
    point = int(splits[-1].derivation.rsplit("at ", 1)[1].replace(",", ""))
    low, high = 990_000 / 1_000_001, 1_000_000 / 1_000_001
    assert point / 1_000_001 == pytest.approx(((low**4 + high**4) / 2) ** 0.25, abs=2e-6)
    over = int(line(top_heavy, "buckets over budget").value)
    assert over == len(splits) == sum(1 for b in range(LAYOUT.size) if 50_000_000 * (
        (min(LAYOUT.range_of(b)[1] + 1, 1_000_001) / 1_000_001) ** 4 - (LAYOUT.range_of(b)[0] / 1_000_001) ** 4
    ) > 1_000_000)


def test_sample_scores_split_at_their_own_quantiles_and_a_tie_mass_cannot_be_split() -> None:
    scores = [5] * 50 + list(range(20_000, 20_100))  # a third tied at 5, the rest spread in bucket 2
    distribution = distribution_sampled(scores, LAYOUT, label="f")
    plan = capacity_plan(target=small_target(players=3_000_000), figures=figures(), distribution=distribution,
                         layout=LAYOUT)
    # 3M players: bucket 0 (all at score 5) 1M -> not over; bucket 2: 2M -> split in 2 at its median sample.
    split = line(plan, "split bucket 2")
    assert split.value == "into 2" and split.derivation.endswith("at 20,050")
    tied = capacity_plan(target=small_target(players=9_000_000), figures=figures(), distribution=distribution,
                         layout=LAYOUT)
    notes = [note for s in tied.sections for note in s.notes if "bucket 0" in note]
    assert notes == ["bucket 0 split still leaves 3,000,000 players in one part: they are tied on too few score "
                     "values to split"]
    with pytest.raises(CapacityError):
        distribution_sampled([], LAYOUT, label="empty")
    with pytest.raises(CapacityError):
        distribution_sampled([1_000_001], LAYOUT, label="out of range")


@pytest.mark.parametrize("shape", ["uniform", "normal", "top-heavy"])
def test_every_distribution_puts_every_player_in_a_bucket(shape: str) -> None:
    assert math.fsum(distribution_shaped(shape, LAYOUT).shares) == pytest.approx(1.0)


# --------------------------------------------------------------------------- a missing figure


@pytest.mark.parametrize(("name", "benchmark"), [
    ("redis_bytes_per_player", "bench/memory.py"),
    ("epoch_part_ms_per_1k_changes", "bench/epoch.py"),
    ("epoch_serial_ms", "bench/epoch.py"),
    ("read_rank_rps_per_process", "bench/reads.py"),
    ("ingest_postgres_cpu_ms_per_1k_events", "bench/ingest.py"),
    ("rebuild_players_per_s", "bench/rebuild.py"),
])
def test_a_missing_figure_names_the_benchmark_that_measures_it(name: str, benchmark: str) -> None:
    with pytest.raises(FigureMissing, match=f"no {name}: run {benchmark}"):
        plan_of(small_target(), figures(**{name: None}))


# ------------------------------------------------------------------------------- command


def figures_file(path: Path, **changes: float | None) -> Path:
    values = {**FIGURES, **changes}
    path.write_text(json.dumps({"figures": {
        name: {"value": value, "unit": "u", "note": f"measured at 100k ({name})", "command": f"bench/x.py {name}"}
        for name, value in values.items() if value is not None
    }}))
    return path


def run_plan(*args: str) -> str:
    out = StringIO()
    call_command("capacity_plan", *args, stdout=out)
    return out.getvalue()


def test_the_command_prints_the_seed_target_each_number_with_its_source(tmp_path: Path) -> None:
    path = figures_file(tmp_path / "figures.json")
    text = run_plan("--players", "50M", "--writes-per-second", "200k", "--reads-per-second", "1M",
                    "--figures", str(path))
    assert text.startswith("Capacity plan: 50,000,000 players, 200,000 writes/s, 1,000,000 reads/s, freshness 5 s")
    for title in ("Redis (rank views", "Buckets", "Web processes", "Celery workers and epoch coordinators",
                  "PostgreSQL"):
        assert title in text
    numbered = [row for row in text.splitlines() if row.startswith("  ") and "  = " in row]
    assert len(numbered) > 20
    assert all(row.rstrip().endswith("]") and "[" in row for row in numbered), "a number without its source"
    assert "  masters  " in text and "+ 1 to lose one node" in text
    assert "25.6 MB/s" in text and "2.21 TB" in text and "6.64 TB" in text
    # The figures used are cited with their notes and commands.
    assert "redis_bytes_per_player = 100 u (measured at 100k (redis_bytes_per_player); " \
           "bench/x.py redis_bytes_per_player)" in text


def test_the_command_takes_a_file_of_sample_scores(tmp_path: Path) -> None:
    path = figures_file(tmp_path / "figures.json")
    scores = tmp_path / "scores.txt"
    scores.write_text("\n".join(str(s) for s in range(20_000, 20_100)))
    text = run_plan("--players", "3M", "--writes-per-second", "1k", "--reads-per-second", "1k",
                    "--figures", str(path), "--distribution", str(scores))
    assert "(100 sample scores)" in text and "split bucket 2" in text and "into 3" in text


def test_the_command_names_the_benchmark_of_a_missing_figure(tmp_path: Path) -> None:
    path = figures_file(tmp_path / "figures.json", read_top_rps_per_process=None)
    with pytest.raises(CommandError, match="no read_top_rps_per_process: run bench/reads.py"):
        run_plan("--players", "50M", "--writes-per-second", "200k", "--reads-per-second", "1M", "--figures", str(path))


@pytest.mark.parametrize(("args", "message"), [
    (["--players", "50Q"], "--players must be a number"),
    (["--distribution", "/nonexistent/scores"], "neither uniform, normal, top-heavy nor a readable file"),
    (["--read-mix", "rank:0"], "positive weight"),
    (["--freshness-seconds", "0"], "freshness"),
])
def test_the_command_refuses_bad_input_saying_why(tmp_path: Path, args: list[str], message: str) -> None:
    path = figures_file(tmp_path / "figures.json")
    base = {"--players": "50M", "--writes-per-second": "200k", "--reads-per-second": "1M", "--figures": str(path)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    with pytest.raises(CommandError, match=message):
        run_plan(*[item for pair in base.items() for item in pair])


def test_the_command_without_a_figures_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="make figures"):
        run_plan("--players", "1M", "--writes-per-second", "1k", "--reads-per-second", "1k",
                 "--figures", str(tmp_path / "absent.json"))


def test_the_committed_figures_file_has_every_figure_the_plan_needs() -> None:
    from leaderboard.core.capacity import FIGURE_SOURCES

    data = json.loads((Path(__file__).resolve().parent.parent / "bench" / "figures.json").read_text())
    parsed = figures_parse(data)
    assert set(FIGURE_SOURCES) <= set(parsed)
    assert all(figure.note and figure.command.startswith("bench/") for figure in parsed.values())
