"""A TCP relay between one server and its database, which a test can cut and restore: a network
partition between one replica and PostgreSQL, without touching the database or the other
replicas."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.server import free_port


class TcpProxy:
    """Listens on 127.0.0.1:`port` and relays every connection to `upstream_port`; `cut` drops them
    all and refuses new ones until `restore`."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._frozen: set[socket.socket] = set()  # connections that relay nothing any more
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if (
                    source not in self._frozen
                ):  # frozen: bytes are taken (TCP acknowledges them) and dropped
                    target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones."""
        with self._lock:
            self._cut = True
            connections, self._open = self._open, []
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass

    def freeze(self) -> None:
        """Keep every connection open but relay nothing, and refuse new ones: a peer that has gone
        silent (a hung server, a path that swallows data), which no reset or FIN reveals."""
        with self._lock:
            self._cut = True
            self._frozen.update(self._open)

    def restore(self) -> None:
        """Relay new connections again (frozen ones stay dead: their lost bytes cannot be
        replayed)."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Stop listening and drop everything."""
        self._closed = True
        self.cut()
        self._server.close()
