"""Migration 0017 (ledger partitions) on PostgreSQL, run by `manage.py migrate` on a scratch
database while a writer of the release before it holds an uncommitted stream-head increment:
no commit number is handed out twice, and the migration cannot be reversed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.test_first_run import fresh_env

pytestmark = [pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
VAR_DIR = Path(tempfile.gettempdir())


@pytest.fixture
def scratch_url() -> Iterator[str]:
    params = connection.get_connection_params()
    name = f"{connection.settings_dict['NAME']}_0017"[:63]
    server = f"postgres://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(url: str, *target: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "migrate", *target], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=fresh_env(VAR_DIR, DATABASE_URL=url, SECRET_KEY="x", REDIS_URL=os.environ.get("REDIS_URL", "")),
    )


def finished(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = process.communicate(timeout=180)
    return process.returncode, out


@pytest.mark.django_db
def test_heads_survive_a_writer_of_the_old_release_and_the_migration_is_forward_only(scratch_url: str) -> None:
    code, out = finished(migrate(scratch_url, "leaderboard", "0016"))
    assert code == 0, out
    with psycopg.connect(scratch_url, autocommit=True) as db:
        # Season 1's head is 5 with its changes; season 2's head row lags its changes (a
        # head must never be below a number in the stream).
        db.execute("INSERT INTO leaderboard_streamhead (season_id, head) VALUES (1, 5), (2, 3)")
        db.execute("SET session_replication_role = replica")  # no season rows needed
        db.execute(
            "INSERT INTO leaderboard_scorechange (player_id, new_score, score_version, event_id, committed_at, txid,"
            " season_id) SELECT 'p', 1, 1, 'e' || n, now(), n, s FROM (VALUES (1, 5), (2, 3), (2, 9)) AS v(s, n)")
    with psycopg.connect(scratch_url) as writer:
        # The old release's write: increment and use the head, commit later.
        row = writer.execute(
            "UPDATE leaderboard_streamhead SET head = head + 1 WHERE season_id = 1 RETURNING head").fetchone()
        assert row is not None
        (head,) = row
        writer.execute("SET session_replication_role = replica")
        writer.execute(
            "INSERT INTO leaderboard_scorechange (player_id, new_score, score_version, event_id, committed_at, txid,"
            " season_id) VALUES ('p', 2, 2, 'late', now(), %s, 1)", [head])
        running = migrate(scratch_url, "leaderboard", "0017")
        time.sleep(3)  # the migration starts and meets the writer's transaction
        writer.commit()
        code, out = finished(running)
    assert code == 0, out
    with psycopg.connect(scratch_url) as db:
        heads: dict[int, int] = dict(db.execute(
            "SELECT season_id, head FROM leaderboard_streamhead WHERE partition = 0").fetchall())
    assert heads == {1: 6, 2: 9}
    code, out = finished(migrate(scratch_url, "leaderboard", "0016"))
    assert code != 0 and "IrreversibleError" in out, out
