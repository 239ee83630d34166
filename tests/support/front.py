"""A TCP front for tests that replace a gateway while clients keep calling: what a load
balancer or a Kubernetes Service does. Each connection goes to the next backend that
accepts it (one being replaced refuses, and the next is tried), and its bytes are relayed
both ways until either side closes."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from itertools import count


class Front:
    def __init__(self, backends: list[int]) -> None:
        self.backends = list(backends)
        self._turn = count()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        backends = list(self.backends)
        start = next(self._turn)
        for i in range(len(backends)):
            port = backends[(start + i) % len(backends)]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            upstream.settimeout(None)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join(timeout=5)
            upstream.close()
            break
        client.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
