#!/usr/bin/env python
"""Friends-board benchmark: GET .../players/{p}/friends at 1,000 friends on a 1M-player season,
against the plain rank read measured in the same run.

1. The loader (bench/loader.py) fills a fresh season (default 1M players) and publishes
   version 1. --boards players (p00000000, p00000001, ...) get a friend list of --friends
   distinct players drawn at random from the season (all ranked: every friend costs its
   lookup and its ZCOUNT), written as the social service's writes leave them (one
   FriendList row each).
2. Sanity: one board is compared with the brute-force answer computed here from the
   loaded scores (entries, positions, ranks among them, season ranks).
3. The real ASGI server starts as a child: `uvicorn config.asgi:application --workers 2
   --http httptools --loop uvloop`; the reads go through the fast read path
   (leaderboard/api/fastpath.py) as in production.
4. wrk (one thread, keep-alive; the Lua script of bench/reads.py, a random player per
   request) measures, --runs times interleaved, each after a short warm-up:
   - c=1 closed loop: the latency of one request with nothing queued before it;
   - c=--connections closed loop: the peak rate, and the latency at saturation;
   - paced at each of --paced-fractions of the friends board's median peak rate, with
     --connections connections: the latency at a sustainable load (the target's).
   The baseline is the plain rank read (/players/{p}/rank) under the same three loads.

Prints requests/s and p50/p99 latency (medians over runs), CPU per request (server and
Redis), the Redis commands one board costs, and the verdict against the target
(p99 < 50 ms) at each paced load.

    SECRET_KEY=x .venv/bin/python bench/friends.py                        # 1M players, 1,000 friends
    SECRET_KEY=x .venv/bin/python bench/friends.py --players 100k --runs 1  # a quick look
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from bisect import bisect_left
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402
import reads  # noqa: E402

TARGET_P99_MS = 50.0
ENDPOINTS = {
    "friends": "/v1/seasons/{season}/players/p%08d/friends",
    "rank": "/v1/seasons/{season}/players/p%08d/rank",
}


def friend_lists_write(*, boards: int, friends: int, players: int, seed: int) -> dict[str, list[str]]:
    """Friend lists for p00000000..p{boards-1}: `friends` distinct other players each."""
    from leaderboard.models import FriendList

    rng = random.Random(seed)
    lists: dict[str, list[str]] = {}
    for i in range(boards):
        picked = rng.sample(range(players), min(players - 1, friends + 1))
        lists[loader.player_id(i)] = [loader.player_id(p) for p in picked if p != i][:friends]
    now = datetime.now(UTC)
    FriendList.objects.filter(player_id__in=list(lists)).delete()
    FriendList.objects.bulk_create([FriendList(player_id=p, friends=f, graph_version=1, updated_at=now)
                                    for p, f in lists.items()], batch_size=100)
    return lists


def friend_lists_delete(lists: dict[str, list[str]]) -> None:
    from leaderboard.models import FriendList

    FriendList.objects.filter(player_id__in=list(lists)).delete()


def expected_board(scores: Any, player: int, friends: list[str]) -> list[dict[str, Any]]:
    """The board computed here by brute force: display order, competition ranks among the
    players, season rank = 1 + the season's players with a strictly higher score."""
    descending = sorted(-s for s in scores)
    ids = [loader.player_id(player), *friends]
    pairs = sorted(((p, scores[int(p[1:])]) for p in ids), key=lambda item: (-item[1], item[0].encode()))
    out: list[dict[str, Any]] = []
    for position, (p, score) in enumerate(pairs, start=1):
        rank = out[-1]["rank"] if out and out[-1]["score"] == score else position
        out.append({"position": position, "rank": rank, "player_id": p, "score": score,
                    "global_rank": 1 + bisect_left(descending, -score)})
    return out


def sanity_check(base: str, season: str, scores: Any, lists: dict[str, list[str]]) -> None:
    import httpx

    player = random.Random(3).randrange(len(lists))
    response = httpx.get(base + ENDPOINTS["friends"].format(season=season) % player, timeout=10)
    if response.status_code != 200:
        raise SystemExit(f"sanity check failed: {response.status_code} {response.text[:300]}")
    body = response.json()
    expected = expected_board(scores, player, lists[loader.player_id(player)])
    if body["entries"] != expected or body["unranked_friends"] != 0:
        raise SystemExit(f"the board of p{player:08d} differs from the brute-force one")
    print(f"# sanity: p{player:08d}'s board of {len(body['entries'])} entries equals the brute-force one "
          f"({len(response.content):,} bytes)")


def redis_commands_per_board(base: str, season: str, boards: int, samples: int = 20) -> str:
    """What one board costs Redis, from INFO commandstats around `samples` sequential requests."""
    import httpx

    from leaderboard.redis_client import redis_get

    def calls() -> dict[str, int]:
        stats = redis_get().info("commandstats")
        return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}

    before = calls()
    with httpx.Client(timeout=10) as client:
        for i in range(samples):
            assert client.get(base + ENDPOINTS["friends"].format(season=season) % (i % boards)).status_code == 200
    after = calls()
    per = {name: (after[name] - before.get(name, 0)) / samples for name in after
           if after[name] - before.get(name, 0) > 0}
    return ", ".join(f"{name} {count:.1f}" for name, count in sorted(per.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M", help="players in the season (e.g. 100k, 1M)")
    parser.add_argument("--friends", type=int, default=1000, help="friends per board (the write API allows 1,000)")
    parser.add_argument("--boards", type=int, default=200, help="players with a friend list (picked at random per "
                                                                "request)")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections of the loaded phases")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each measurement")
    parser.add_argument("--runs", type=int, default=3, help="interleaved repetitions (median reported)")
    parser.add_argument("--paced-fractions", default="0.5,0.8",
                        help="paced phases at these fractions of the friends board's peak rate ('' to skip)")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (players,) = benchenv.parse_counts(args.players)
    fractions = [float(f) for f in args.paced_fractions.split(",") if f.strip()]
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk: apt-get install -y wrk")
    env = benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    result = loader.load_season(players=players, seed=args.seed, kind="friends", verbose=True)
    season = result.season.slug
    started = time.perf_counter()
    lists = friend_lists_write(boards=args.boards, friends=args.friends, players=players, seed=args.seed)
    print(f"# {len(lists)} friend lists of {args.friends:,} written in {time.perf_counter() - started:.1f}s")
    server = benchenv.AppServer(workers=args.workers, port=args.port, env=env)
    # name -> how many players the Lua script picks from (p00000000..).
    population = {"friends": len(lists), "rank": players}
    samples: list[reads.Sample] = []
    commands = ""
    try:
        server.start()
        sanity_check(server.url, season, result.scores, lists)
        commands = redis_commands_per_board(server.url, season, len(lists))
        print(f"# Redis commands per board: {commands}")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            seed = args.seed

            def run_phase(phase: str, connections: int, rate: float | None) -> None:
                nonlocal seed
                for run in range(args.runs):
                    names = list(ENDPOINTS)
                    for name in names[run % 2:] + names[: run % 2]:
                        path = ENDPOINTS[name].format(season=season)
                        seed += 1
                        if args.warmup > 0:
                            reads.wrk_run(url=server.url, path=path, players=population[name],
                                          connections=connections, duration=args.warmup, rate=rate,
                                          workdir=workdir, seed=seed)
                        sample = reads.measured(server, url=server.url, path=path, players=population[name],
                                                connections=connections, duration=args.duration, rate=rate,
                                                workdir=workdir, seed=seed)
                        if sample is None:
                            continue
                        sample.endpoint = f"{phase}:{name}"
                        samples.append(sample)
                        print(f"# run {run + 1} {phase:>6} {name:>7}: {sample.rps:7,.0f} req/s, p50 {sample.p50:5.1f} "
                              f"ms, p99 {sample.p99:6.1f} ms, errors {sample.errors}; CPU/request: server "
                              f"{sample.server_cpu_us:,.0f} us, redis {sample.redis_cpu_us:,.0f} us; load "
                              f"{os.getloadavg()[0]:.1f}", flush=True)

            run_phase("c=1", 1, None)
            run_phase("peak", args.connections, None)
            peak = benchenv.median([s.rps for s in samples if s.endpoint == "peak:friends"])
            for fraction in fractions:
                run_phase(f"{fraction:.0%}", args.connections, peak * fraction)
    finally:
        server.stop()
        friend_lists_delete(lists)
        benchenv.season_cleanup(result.season, keep=args.keep)

    print()
    print(f"## friends board: {players:,} players, {args.friends:,} friends per board, uvicorn --workers "
          f"{args.workers} (httptools, uvloop), wrk -t1, {args.runs} runs x {args.duration:.0f} s, medians")
    print()
    rows = []
    for phase in ("c=1", "peak", *(f"{fraction:.0%}" for fraction in fractions)):
        for name in ENDPOINTS:
            cell = [s for s in samples if s.endpoint == f"{phase}:{name}"]
            if not cell:
                continue
            conns = 1 if phase == "c=1" else args.connections
            rows.append((phase, name, conns, benchenv.median([s.rps for s in cell]),
                         benchenv.median([s.p50 for s in cell]), benchenv.median([s.p99 for s in cell]),
                         benchenv.median([s.server_cpu_us for s in cell]),
                         benchenv.median([s.redis_cpu_us for s in cell]), sum(s.errors for s in cell)))
    print(benchenv.table(["phase", "endpoint", "connections", "req/s", "p50 ms", "p99 ms", "server CPU us/req",
                          "redis CPU us/req", "errors"], rows))
    print()
    print(f"Redis commands per board: {commands}")
    for phase in ("c=1", *(f"{fraction:.0%}" for fraction in fractions)):
        cell = [s for s in samples if s.endpoint == f"{phase}:friends"]
        if cell:
            p99 = benchenv.median([s.p99 for s in cell])
            rate = benchenv.median([s.rps for s in cell])
            where = "one connection" if phase == "c=1" else f"{phase} of its peak ({rate:,.0f} req/s)"
            print(f"friends p99 at {where}: {p99:.1f} ms (worst run {max(s.p99 for s in cell):.1f} ms; "
                  f"target < {TARGET_P99_MS:.0f} ms: {'met' if p99 < TARGET_P99_MS else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
