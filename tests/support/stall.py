"""A TCP proxy in front of Redis or PostgreSQL whose connections forward until one of them
sends a chosen pattern: that connection then stalls, nothing forwarded either way, until
`thaw()`. It is a call that does not return (a stalled socket, a server that stops
answering one client) on one connection of a process whose other connections, its lease
keeper's among them, go on: the fault a whole-process stop (SIGSTOP) does not make."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class StallProxy:
    def __init__(self, *, target_port: int, pattern: bytes = b"", target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.pattern = pattern
        self.stalled = threading.Event()  # set once a connection sent the pattern
        self._all = threading.Event()  # every connection stalled: a server that hangs
        self._thawed = threading.Event()
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="stall-proxy", daemon=True).start()

    def stall_all(self) -> None:
        """Every connection, open or opened from now on, forwards nothing until `thaw()`: a
        server that accepts connections and answers nothing (hung, or its host unreachable)."""
        self._all.set()

    def thaw(self) -> None:
        """The stalled connection forwards again what it held, and everything after."""
        self._thawed.set()

    def close(self) -> None:
        self._closed = True
        self._thawed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
                self.accepted += 1
            frozen = threading.Event()
            threading.Thread(target=self._pump, args=(client, server, frozen, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, frozen, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, frozen: threading.Event, watch: bool) -> None:
        tail = b""
        keep = len(self.pattern) - 1
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if watch and self.pattern and not self.stalled.is_set() and self.pattern in tail + data:
                    with self._lock:
                        if not self.stalled.is_set():  # only the first connection to send it
                            self.stalled.set()
                            frozen.set()
                tail = (tail + data)[-keep:] if keep else b""
                if frozen.is_set() or self._all.is_set():
                    self._thawed.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def stall_proxy(*, target_port: int, pattern: bytes = b"") -> Iterator[StallProxy]:
    proxy = StallProxy(target_port=target_port, pattern=pattern)
    try:
        yield proxy
    finally:
        proxy.close()
