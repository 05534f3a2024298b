"""`manage.py capacity_plan`: servers for a target load from the benchmarks' measured figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.capacity import (
    DISTRIBUTIONS,
    CapacityError,
    Target,
    bytes_parse,
    capacity_plan,
    distribution_sampled,
    distribution_shaped,
    figures_parse,
    plan_text,
    quantity_parse,
    read_mix_parse,
)


class Command(BaseCommand):
    help = ("Size Redis, web processes, Celery workers and PostgreSQL for a target load from the per-operation "
            "costs the benchmarks measured (bench/figures.json, `make figures`; docs/operations.md: Sizing).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--players", required=True, help="players in the season, e.g. 50M")
        parser.add_argument("--writes-per-second", required=True, help="score events per second, e.g. 200k")
        parser.add_argument("--reads-per-second", required=True, help="public reads per second, e.g. 1M")
        parser.add_argument("--freshness-seconds", type=float, default=5.0,
                            help="longest time from a commit to the version holding it (default 5)")
        parser.add_argument("--figures", default=str(Path(settings.BASE_DIR) / "bench" / "figures.json"),
                            help="the figures file the benchmarks write (default bench/figures.json)")
        parser.add_argument("--distribution", default="uniform",
                            help=f"score distribution: {', '.join(DISTRIBUTIONS)}, or a file of sample scores "
                                 "(integers separated by white space)")
        parser.add_argument("--bucket-budget", default="1M",
                            help="most members a bucket's sorted set should hold (default 1M)")
        parser.add_argument("--read-mix", default="rank:60,top:30,neighbors:10",
                            help="shares of the reads (default rank:60,top:30,neighbors:10)")
        parser.add_argument("--change-fraction", type=float, default=1.0,
                            help="share of events that change a best score (default 1: every one)")
        parser.add_argument("--redis-node-memory", default="32G", help="memory of one Redis node (default 32G)")
        parser.add_argument("--redis-memory-fill", type=float, default=0.5,
                            help="share of a node the views may fill (default 0.5: room for a fork and a sync)")
        parser.add_argument("--redis-replicas", type=int, default=1, help="replicas per master (default 1)")
        parser.add_argument("--utilization", type=float, default=0.5,
                            help="share of a core a Redis master or the PostgreSQL writers may be kept busy")
        parser.add_argument("--ledger-replicas", type=int, default=3, help="copies of the ledger (default 3)")
        parser.add_argument("--seasons", type=int, default=1, help="live seasons at this size (default 1)")
        parser.add_argument("--copy-grace-seconds", type=float, default=settings.COPY_GRACE_SECONDS,
                            help="COPY_GRACE_SECONDS: the side that stopped serving is written only after it "
                                 f"(default this deployment's, {settings.COPY_GRACE_SECONDS:g})")

    def handle(self, *args: Any, **options: Any) -> None:
        figures_path = Path(options["figures"])
        try:
            data = json.loads(figures_path.read_text())
        except FileNotFoundError:
            raise CommandError(f"no figures file {figures_path}: run `make figures` (docs/benchmarks.md)") from None
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read the figures file {figures_path}: {exc}") from None
        layout = BucketLayout.uniform()
        try:
            target = Target(
                players=quantity_parse(options["players"], name="--players"),
                writes_per_second=quantity_parse(options["writes_per_second"], name="--writes-per-second"),
                reads_per_second=quantity_parse(options["reads_per_second"], name="--reads-per-second"),
                freshness_seconds=options["freshness_seconds"],
                change_fraction=options["change_fraction"],
                read_mix=read_mix_parse(options["read_mix"]),
                redis_replicas=options["redis_replicas"],
                redis_node_bytes=bytes_parse(options["redis_node_memory"], name="--redis-node-memory"),
                redis_memory_fill=options["redis_memory_fill"],
                utilization=options["utilization"],
                bucket_member_budget=quantity_parse(options["bucket_budget"], name="--bucket-budget"),
                ledger_replicas=options["ledger_replicas"],
                seasons=options["seasons"],
                copy_grace_seconds=options["copy_grace_seconds"],
            )
            shape = options["distribution"]
            if shape in DISTRIBUTIONS:
                distribution = distribution_shaped(shape, layout)
            else:
                distribution = distribution_sampled(_scores_read(Path(shape)), layout, label=shape)
            plan = capacity_plan(target=target, figures=figures_parse(data), distribution=distribution,
                                 layout=layout)
        except CapacityError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(plan_text(plan, figures_path=str(options["figures"]), distribution_label=distribution.label))


def _scores_read(path: Path) -> list[int]:
    try:
        words = path.read_text().split()
    except OSError as exc:
        raise CommandError(f"--distribution is neither {', '.join(DISTRIBUTIONS)} nor a readable file: {exc}") from None
    try:
        return [int(word) for word in words]
    except ValueError as exc:
        raise CommandError(f"{path} must hold integer scores: {exc}") from None
