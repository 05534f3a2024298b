"""A newcomer's first commands, run as the README prints them on a fresh checkout: no
SECRET_KEY, no DATABASE_URL, no REDIS_URL (SQLite and the embedded Redis in a VAR_DIR of
their own), and nothing left running afterwards."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.demo import ROOT, demo_running, free_port, fresh_env


def manage(var_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=fresh_env(var_dir, **extra),
        capture_output=True, text=True, timeout=120,
    )


def embedded_redis_ports(var_dir: Path) -> list[int]:
    """Every port an embedded redis-server of this VAR_DIR was started on (its log says)."""
    log = var_dir / "redis" / "redis.log"
    return [int(p) for p in re.findall(r"port=(\d+)", log.read_text())] if log.exists() else []


def embedded_redis_alive(var_dir: Path) -> bool:
    for port in embedded_redis_ports(var_dir):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            pass
    return False


def test_operator_commands_work_as_printed_on_a_fresh_checkout(tmp_path: Path) -> None:
    migrate = manage(tmp_path, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    staff = manage(tmp_path, "create_staff", "alice", "--role", "viewer", STAFF_PASSWORD="a-long-password-1")
    assert staff.returncode == 0, staff.stderr
    assert "staff account alice created with role viewer" in staff.stdout
    client = manage(tmp_path, "create_api_client", "match-service", "--scope", "scores:write")
    assert client.returncode == 0, client.stderr
    # The development key was generated once, privately, and reused by the second command.
    key = tmp_path / "secret_key"
    assert key.stat().st_mode & 0o077 == 0
    assert len(key.read_text().strip()) >= 50


def test_one_off_command_leaves_no_embedded_redis_running(tmp_path: Path) -> None:
    result = manage(tmp_path, "check")
    assert result.returncode == 0, result.stderr
    assert embedded_redis_ports(tmp_path), "the command did not start the embedded Redis"
    assert not embedded_redis_alive(tmp_path)


def test_embedded_redis_is_shared_while_in_use_and_stopped_by_its_last_user(tmp_path: Path) -> None:
    env = fresh_env(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import django, time; from config.embedded_redis import environ_ensure; "
         "environ_ensure(); django.setup(); print('up', flush=True); time.sleep(60)"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        # Another command comes and goes: the server its neighbour uses stays up.
        assert manage(tmp_path, "check").returncode == 0
        assert embedded_redis_alive(tmp_path)
    finally:
        holder.terminate()  # SIGTERM: no atexit, so the next user must notice it is gone
        holder.wait(timeout=10)
    assert manage(tmp_path, "check").returncode == 0
    assert not embedded_redis_alive(tmp_path)


@pytest.mark.postgres
def test_a_deployment_without_secret_key_refuses_to_start(tmp_path: Path) -> None:
    result = manage(tmp_path, "check", DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
                    REDIS_URL="redis://127.0.0.1:6379/0")
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def _staff_login(base: str, username: str, password: str) -> str:
    """Sign in through the login form (CSRF and all); returns the page it lands on."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/staff/login/", timeout=10).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert csrf, page[:500]
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf.group(1), "username": username, "password": password}
    ).encode()
    request = urllib.request.Request(f"{base}/staff/login/", data=form, headers={"Referer": f"{base}/staff/login/"})
    with opener.open(request, timeout=10) as response:
        return str(response.geturl())


@pytest.mark.slow
def test_make_run_prints_every_url_and_demo_logins_then_stops_in_order(tmp_path: Path) -> None:
    with demo_running(tmp_path / "var", "--players", "200", "--rate", "100", DEBUG="true") as demo:
        base, banner, log, port = demo.base, demo.banner, demo.log, demo.port
        for url in ("/seasons/demo/live", "/staff/", "/v1/seasons/demo/leaderboard/top", "/api/docs/",
                    "/internal/v1/seasons/demo/scores:apply", "/healthz", "/readyz", "/staff/seasons/demo-cup/",
                    "/staff/series/demo-daily/", "/v1/series/demo-daily"):
            assert f"{base}{url}" in banner, url
        # The daily series: today's window is open, and its read names it.
        with urllib.request.urlopen(f"{base}/v1/series/demo-daily", timeout=10) as answer:
            series = json.load(answer)
        assert series["current"]["season_id"] in banner and series["approval"] == "auto"
        assert "/admin/" not in banner, "the banner advertises a page no demo user can sign in to"
        users = demo.passwords
        assert set(users) == {"viewer", "reviewer", "approver", "approver2"}
        assert _staff_login(base, "approver2", users["approver2"]).endswith("/staff/")
        # The token is in a private file, and in no process's command line.
        token = (tmp_path / "var" / "demo-token").read_text().strip()
        assert (tmp_path / "var" / "demo-token").stat().st_mode & 0o077 == 0
        command_lines = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert token not in command_lines
        with urllib.request.urlopen(f"{base}/seasons/demo/live", timeout=10) as page:
            assert page.status == 200
        before_stop = log.read_text()
        started = time.monotonic()
    took = time.monotonic() - started
    output = log.read_text()
    shutdown = output[len(before_stop):]
    assert took < 10, f"stopping took {took:.1f} s:\n{shutdown}"
    assert "Traceback" not in output and "WorkerLostError" not in output, output
    assert not embedded_redis_alive(tmp_path / "var")
    leftovers = subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True).stdout
    assert not leftovers.strip(), leftovers


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_make_run_quietly(tmp_path: Path) -> None:
    """`make run` in a terminal, as a newcomer types it, then Ctrl-C: the demo stops, and
    neither make ("*** [run] Interrupt", exit 130) nor Python ("Invalid -W option") adds
    noise to what it printed."""
    import pty

    port = free_port()
    env = fresh_env(tmp_path / "var", PORT=str(port))
    pid, master = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.chdir(ROOT)
        os.execvpe("make", ["make", "run"], env)
    output = b""

    def read_until(marker: bytes, seconds: float) -> None:
        nonlocal output
        deadline = time.monotonic() + seconds
        while marker not in output:
            assert time.monotonic() < deadline, output.decode(errors="replace")
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child side closed: EOF
                    break
                output += chunk

    try:
        read_until(b"Ctrl-C stops everything", 120)
        time.sleep(1)
        os.write(master, b"\x03")  # what the terminal sends on Ctrl-C
        read_until(b"stopped in", 30)
        read_until(b"\x00never", 15)  # to EOF
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.close(master)
    text = output.decode(errors="replace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text[-2000:]
    assert "Interrupt" not in text and "Invalid -W option" not in text and "Traceback" not in text, text[-3000:]
    assert not embedded_redis_alive(tmp_path / "var")


def docs_block(document: str, heading: str) -> str:
    """The first ```sh block under `heading` in docs/<document>."""
    text = (ROOT / "docs" / document).read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.slow
def test_the_season_lifecycle_example_runs_in_the_order_printed(tmp_path: Path) -> None:
    """docs/operations.md, season_lifecycle: the block as printed, line by line in a shell,
    with the demo service running (its worker and beat), takes a new season to FINAL."""
    block = docs_block("operations.md", "### season_lifecycle")
    assert "create_season cup-1" in block and block.rstrip().endswith("season_lifecycle cup-1 approve --as bob")
    var = tmp_path / "var"
    with demo_running(var, "--no-simulator"):
        done = subprocess.run(["bash", "-e", "-x", "-c", block], cwd=ROOT, env=fresh_env(var), capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.rstrip().endswith("cup-1: FINAL"), done.stdout
