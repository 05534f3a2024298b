"""A match-results service stand-in: posts settled results over real HTTP (the demo of `make run`).

The events come from `leaderboard.simulation` (skills, improvers, retries, corrections);
this command only paces them, sends them, retries failures with backoff and reports.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard.core.events import MAX_BATCH
from leaderboard.core.ledger import HELD_REVOKED as REVOKED
from leaderboard.simulation import MatchSimulator, SimConfig, player_ids

# The token comes from the environment or a file, never the command line, where any
# user of the machine could read it in the process list.
TOKEN_ENV = "LEADERBOARD_TOKEN"

# Statuses that mean "fix the configuration", not "try again later".
FATAL_STATUSES = {401: "bad token", 403: "token lacks the scores:write scope", 404: "unknown season"}


class Command(BaseCommand):
    help = (
        "Simulate the match-results service: POST realistic settled results for many players "
        "to /internal/v1/seasons/SEASON/scores:apply, about once a second, until stopped."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("season", help="season slug (the {season_id} of the URL)")
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="base URL of the service")
        parser.add_argument(
            "--token-file", default=None,
            help=f"file holding an API token with scope scores:write; default: ${TOKEN_ENV}",
        )
        parser.add_argument("--players", type=int, default=5000)
        parser.add_argument("--rate", type=float, default=500, help="events per second")
        parser.add_argument("--duration", type=float, default=None, help="seconds; default: until stopped")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between sends")
        parser.add_argument(
            "--report-every", type=float, default=60.0, help="seconds between progress lines; 0: only the last"
        )
        parser.add_argument("--duplicate-rate", type=float, default=0.03)
        parser.add_argument("--correction-rate", type=float, default=0.005)
        parser.add_argument("--seed", type=int, default=None, help="default: random")
        parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["players"] < 1 or options["rate"] <= 0 or options["interval"] <= 0:
            raise CommandError("--players, --rate and --interval must be positive")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
        token = _token(options["token_file"])
        run = SimulationRun(
            out=self._say,
            url=options["url"].rstrip("/"),
            season=options["season"],
            token=token,
            simulator=MatchSimulator(
                players=player_ids(options["players"]),
                seed=options["seed"] if options["seed"] is not None else secrets.randbits(32),
                config=SimConfig(
                    duplicate_rate=options["duplicate_rate"],
                    correction_rate=options["correction_rate"],
                ),
                # A fresh prefix per run: restarting the simulator never reuses an event id.
                event_prefix=f"sim{secrets.token_hex(3)}-",
                # Millisecond versions: after a restart, versions still move forward.
                version_source=lambda: time.time_ns() // 1_000_000,
            ),
            rate=options["rate"],
            interval=options["interval"],
            report_every=options["report_every"],
            timeout=options["timeout"],
        )
        stop_signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, run.request_stop) for sig in stop_signals}
        try:
            fatal = run.loop(duration=options["duration"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if fatal:
            raise CommandError(fatal)

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()


def _token(token_file: str | None) -> str:
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read --token-file: {exc}") from exc
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise CommandError(f"no API token: pass --token-file FILE or set ${TOKEN_ENV}")
    return token


class SimulationRun:
    def __init__(
        self, *, out: Any, url: str, season: str, token: str, simulator: MatchSimulator,
        rate: float, interval: float, report_every: float, timeout: float,
    ) -> None:
        self.out = out
        self.endpoint = f"{url}/internal/v1/seasons/{season}/scores:apply"
        self.health = f"{url}/healthz"
        self.token = token
        self.simulator = simulator
        self.rate = rate
        self.interval = interval
        self.report_every = report_every
        self.timeout = timeout
        self.stopping = False
        self.outcomes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.sent_events = 0
        self.requests = 0
        self.retried_requests = 0
        self._carry = 0.0  # fractional events owed to the rate

    def request_stop(self, signum: int, frame: object) -> None:
        if self.stopping:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.stopping = True

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def loop(self, *, duration: float | None) -> str | None:
        """Send until stopped (or `duration` elapses); return a fatal error, if any."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        with httpx.Client(headers=headers, timeout=self.timeout) as client:
            self._wait_for_server(client)
            if self.report_every > 0:
                self.out(
                    f"simulating {len(self.simulator.players)} players at {self.rate:g} events/s "
                    f"-> {self.endpoint}"
                )
            started = next_tick = time.monotonic()
            next_report = started + self.report_every if self.report_every > 0 else float("inf")
            fatal = None
            while not self.stopping and fatal is None:
                now = time.monotonic()
                if duration is not None and now - started >= duration:
                    break
                if now < next_tick:
                    self._sleep(next_tick - now)
                    continue
                # When the server is slower than the rate, skip ticks rather than queue up.
                next_tick = max(next_tick + self.interval, now)
                fatal = self._send_tick(client)
                if time.monotonic() >= next_report:
                    self._report(time.monotonic() - started)
                    next_report += self.report_every
                    if next_report <= time.monotonic():  # after an outage: no burst of lines
                        next_report = time.monotonic() + self.report_every
            self._report(time.monotonic() - started, final=True)
        return fatal

    def _wait_for_server(self, client: httpx.Client) -> None:
        delay, said = 0.25, False
        while not self.stopping:
            try:
                if client.get(self.health).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not said:
                self.out(f"waiting for the server at {self.health} …")
                said = True
            self._sleep(delay)
            delay = min(delay * 2, 5.0)

    def _send_tick(self, client: httpx.Client) -> str | None:
        owed = self.rate * self.interval + self._carry
        count = int(owed)
        self._carry = owed - count
        completed_at = datetime.now(UTC)
        while count > 0 and not self.stopping:
            size = min(count, MAX_BATCH)
            count -= size
            body = orjson.dumps({"events": self.simulator.batch(size, completed_at=completed_at)})
            fatal = self._post(client, body, size)
            if fatal:
                return fatal
        return None

    def _post(self, client: httpx.Client, body: bytes, size: int) -> str | None:
        """POST one batch; retry transport errors and 5xx with backoff (the retries are
        exact duplicates, which the ledger answers as such)."""
        delay = 0.5
        attempt = 0
        while True:
            attempt += 1
            try:
                response = client.post(self.endpoint, content=body)
            except httpx.HTTPError as exc:
                self.errors[type(exc).__name__] += 1
                response = None
            if response is not None:
                if response.status_code == 200:
                    results = orjson.loads(response.content)["results"]
                    self.outcomes.update(r["status"] for r in results)
                    for r in results:
                        if r.get("reason") == REVOKED and r["status"] in ("held", "duplicate"):
                            # Staff revoked this player's score: acknowledge it, as the
                            # ledger asks (docs/rules.md, Revocations that stick).
                            self.simulator.acknowledge_revocation(r["player_id"], r["score"])
                    self.sent_events += size
                    self.requests += 1
                    if attempt > 1:
                        self.retried_requests += 1
                    return None
                self.errors[f"HTTP {response.status_code}"] += 1
                if response.status_code in FATAL_STATUSES:
                    return (
                        f"{FATAL_STATUSES[response.status_code]} (HTTP {response.status_code}): "
                        f"{response.text[:200]}"
                    )
                if response.status_code < 500:
                    # The batch itself is refused (400/413): report it and move on.
                    self.out(f"batch refused, HTTP {response.status_code}: {response.text[:300]}")
                    return None
            if self.stopping:
                return None
            self._sleep(delay)
            delay = min(delay * 2, 8.0)

    def _report(self, elapsed: float, *, final: bool = False) -> None:
        order = ("applied", "unchanged", "stale", "duplicate", "rejected", "held", "conflict")
        statuses = " ".join(f"{s} {self.outcomes[s]}" for s in order if self.outcomes[s])
        statuses += "".join(f" {s} {n}" for s, n in self.outcomes.items() if s not in order)
        errors = ", ".join(f"{k} {v}" for k, v in self.errors.most_common()) or "0"
        rate = self.sent_events / elapsed if elapsed > 0 else 0.0
        self.out(
            f"{'done' if final else 'progress'} {elapsed:6.0f}s: {self.sent_events} events in "
            f"{self.requests} requests ({rate:.0f}/s) | {statuses or 'no outcomes yet'} | "
            f"errors {errors}{f' | retried requests {self.retried_requests}' if self.retried_requests else ''}"
        )
