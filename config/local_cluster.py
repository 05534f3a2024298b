"""A real local Redis Cluster, for development, the benchmarks (bench/reads.py, bench/epoch.py)
and the tests: `redis-server --cluster-enabled yes` processes on free ports of 127.0.0.1,
joined by `redis-cli --cluster create`, in a temporary directory, persisting nothing.
Started with `cluster_start()`, stopped with `cluster_stop()` (also at interpreter exit, and
by the kernel if this process dies: each server gets SIGKILL when its parent does, so no
run leaves nodes behind). `slot_master()`/`key_master()` name the master serving a slot
or key. The tests' failover helpers (killing a master, waiting for its replica to take
over) are in tests/support/cluster.py.

Not the demo's Redis (config/embedded_redis.py, one plain server): REDIS_CLUSTER=true with
REDIS_URL naming one of these nodes puts the rank views on a cluster, as in production."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

HOST = "127.0.0.1"
# Ports are looked for from here up; each node also listens on port + 10000 (the cluster bus).
PORT_RANGE = (17000, 17999)
BUS_OFFSET = 10000
SLOTS = 16384
# How long a node may go unanswered before the others mark it failed. Short enough that a
# failover test waits seconds; long enough that a loaded 2-core machine starving a node for
# a moment does not take the cluster down in the middle of a test session or a benchmark.
NODE_TIMEOUT_MS = 5000
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Node:
    node_id: str
    port: int
    role: str  # "master" or "slave", as CLUSTER NODES says
    master_id: str | None
    slots: tuple[tuple[int, int], ...]
    failed: bool

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def _die_with_parent() -> None:
    """Runs in the forked child before exec: the kernel sends it SIGKILL when the process
    that started it exits, however it exits (even killed with SIGKILL itself)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(*, count: int, start: int = PORT_RANGE[0]) -> list[int]:
    """`count` ports from `start` up whose bus ports are free too (another engineer's
    cluster, test session or benchmark may hold some: they are skipped)."""
    ports: list[int] = []
    for port in range(start, PORT_RANGE[1] + 1):
        if _port_free(port) and _port_free(port + BUS_OFFSET):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports (and bus ports) in {start}-{PORT_RANGE[1]}")


def condition_wait(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError, LookupError):
            pass  # a node not up yet, or a slot between two masters: asked again
        if time.monotonic() > deadline:
            raise TimeoutError(f"Redis Cluster: {what} not reached within {timeout:.0f}s")
        time.sleep(0.1)


@dataclass
class LocalCluster:
    directory: Path
    masters: int
    replicas: int
    node_timeout_ms: int
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _clients: dict[int, redis.Redis] = field(default_factory=dict)

    @classmethod
    def start(cls, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = NODE_TIMEOUT_MS,
              start_port: int | None = None) -> Self:
        """A new cluster of `masters` masters with `replicas` replicas each, ready to use.
        `start_port`: where to look for free ports (default: a place in the range of this
        process's own, so that sessions starting clusters at the same moment seldom reach
        for the same ports)."""
        if start_port is None:
            start_port = PORT_RANGE[0] + (os.getpid() % 100) * 8
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError(
                "starting a Redis Cluster needs redis-server and redis-cli (apt-get install redis-server)")
        for attempt in range(3):
            cluster = cls(directory=Path(tempfile.mkdtemp(prefix="lb-redis-cluster-")), masters=masters,
                          replicas=replicas, node_timeout_ms=node_timeout_ms)
            _running.append(cluster)
            try:
                for port in free_ports(count=masters * (1 + replicas), start=start_port):
                    cluster._node_start(port)
                cluster._create()
                return cluster
            except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
                # Another process took a port between the check and the bind: other ports.
                cluster_stop(cluster)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @property
    def ports(self) -> list[int]:
        return sorted(self.processes)

    @property
    def url(self) -> str:
        """A node's URL, as REDIS_URL names a cluster: the client discovers the others."""
        return f"redis://{HOST}:{self.live_ports()[0]}/0"

    def live_ports(self) -> list[int]:
        return [port for port, process in sorted(self.processes.items()) if process.poll() is None]

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (no redirections followed)."""
        if port not in self._clients:
            self._clients[port] = redis.Redis(host=HOST, port=port, socket_timeout=5.0, socket_connect_timeout=2.0)
        return self._clients[port]

    # --- starting and stopping

    def _node_start(self, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [
            "redis-server", "--port", str(port), "--bind", HOST, "--dir", str(node_dir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(node_dir / "redis.log"),
            # The view's hashes hold thousands of fields; keep them as compact as a
            # production server configured by docs/operations.md would.
            "--hash-max-listpack-entries", "512",
        ]
        self.processes[port] = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def _node_ping(self, port: int) -> bool:
        process = self.processes[port]
        if process.poll() is not None:
            log = self.directory / str(port) / "redis.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"redis-server on port {port} exited ({process.returncode}):\n{tail}")
        # Another session may have bound the port between our check and our server's bind:
        # its node answers then, and ours is about to exit. Only our own node will do.
        if int(self.node(port).info("server")["process_id"]) != process.pid:
            raise RuntimeError(f"port {port} is another process's redis-server")
        return True

    def _ping_wait(self, port: int) -> None:
        condition_wait(lambda: self._node_ping(port), timeout=15, what=f"node {port} answering PING")

    def _create(self) -> None:
        for port in self.ports:
            self._ping_wait(port)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"{HOST}:{port}" for port in self.ports],
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
        )
        self.ready_wait()

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- the cluster's state

    def nodes(self, *, port: int | None = None) -> list[Node]:
        """CLUSTER NODES as one living node (the first, unless named) sees it."""
        table = self.node(port if port is not None else self.live_ports()[0]).cluster("NODES")
        found = []
        for address, entry in table.items():
            flags = entry["flags"].split(",")
            found.append(Node(
                node_id=entry["node_id"], port=int(address.rsplit(":", 1)[1]),
                role="master" if "master" in flags else "slave",
                master_id=None if entry["master_id"] == "-" else entry["master_id"],
                slots=tuple((int(first), int(last)) for first, last in
                            (spec if len(spec) == 2 else (spec[0], spec[0]) for spec in entry["slots"])),
                failed="fail" in flags or "fail?" in flags,
            ))
        return found

    def state_ok(self, port: int) -> bool:
        return bool(self.node(port).cluster("INFO").get("cluster_state") == "ok")

    def _ready(self) -> bool:
        live = self.live_ports()
        if not all(self.state_ok(port) for port in live):
            return False
        # Every living node agrees on who serves all the slots, and every replica has synced
        # with its master (a failover needs a replica that holds the data).
        views = [self.nodes(port=port) for port in live]
        owners = [sorted((node.port, node.slots) for node in view if node.role == "master" and node.slots)
                  for view in views]
        if any(owner != owners[0] for owner in owners):
            return False
        if sum(last - first + 1 for _, slots in owners[0] for first, last in slots) != SLOTS:
            return False
        for node in views[0]:
            if node.port not in live:
                continue
            if node.role == "master" and not node.slots:
                return False  # a replica-to-be that `--cluster create` has not attached yet
            if node.role == "slave" and self.node(node.port).info("replication").get("master_link_status") != "up":
                return False
        return True

    def ready_wait(self, *, timeout: float = 60) -> None:
        """Until every living node reports cluster_state:ok, they all agree on the slots'
        masters, and every other living node is a replica whose link to its master is up."""
        condition_wait(self._ready, timeout=timeout, what="cluster_state:ok on every node")

    def master_ports(self) -> list[int]:
        return sorted(node.port for node in self.nodes() if node.role == "master" and node.slots and not node.failed)

    def slot_master(self, slot: int) -> int:
        """The port of the master serving `slot` now."""
        for node in self.nodes():
            if node.role == "master" and not node.failed and node.serves(slot):
                return node.port
        raise LookupError(f"no living master serves slot {slot}")

    def key_slot(self, key: str | bytes) -> int:
        return int(self.node(self.live_ports()[0]).execute_command("CLUSTER KEYSLOT", key))

    def key_master(self, key: str | bytes) -> int:
        return self.slot_master(self.key_slot(key))

    def flushall(self) -> None:
        """FLUSHALL on every master (replicas follow their masters)."""
        for port in self.master_ports():
            self.node(port).flushall()


_running: list[LocalCluster] = []


def _stop_all() -> None:
    for cluster in list(_running):
        cluster_stop(cluster)


atexit.register(_stop_all)


# A new LocalCluster, ready to use: LocalCluster.start.
cluster_start = LocalCluster.start


def cluster_stop(cluster: LocalCluster) -> None:
    cluster.stop()
    if cluster in _running:
        _running.remove(cluster)
