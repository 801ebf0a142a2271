"""``scheduler.kube.client.Poster``'s HTTP/1.1 handling, against a scripted server (no
cluster): each connection answers its requests with the next canned responses."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.kube.client import Poster, is_transient

OK = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED = (
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4\r\n{"a"\r\n3;ext=1\r\n: 1\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n'
)
CONFLICT = b'HTTP/1.1 409 Conflict\r\nContent-Length: 27\r\n\r\n{"message":"already bound"}'
CLOSE = b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """Accepts connections; connection ``i`` answers with ``scripts[i]`` (one response per
    request, then closes); records every request's head and body."""

    def __init__(self, scripts: list[list[bytes]], reset: frozenset[int] = frozenset()) -> None:
        self.scripts = scripts
        self.reset = reset
        """Connections dropped with a reset (RST) rather than a close (FIN)."""
        self.closed = [threading.Event() for _ in scripts]
        self.requests: list[tuple[int, bytes]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        for i, script in enumerate(self.scripts):
            conn, _ = self.sock.accept()
            threading.Thread(target=self._answer, args=(i, conn, script), daemon=True).start()

    def _answer(self, i: int, conn: socket.socket, script: list[bytes]) -> None:
        with conn:
            buf = b""
            for response in script:
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append((i, head + b"\r\n\r\n" + buf[:length]))
                buf = buf[length:]
                # Head and body in separate writes, as some servers send them.
                cut = response.index(b"\r\n\r\n") + 4
                conn.sendall(response[:cut])
                conn.sendall(response[cut:])
            if i in self.reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.closed[i].set()


@pytest.fixture
def make() -> Iterator[object]:
    posters: list[Poster] = []

    def poster(server: Server) -> Poster:
        cfg = client.Configuration(host=f"http://127.0.0.1:{server.port}/prefix")
        cfg.api_key = {"authorization": "Bearer token-1"}
        p = Poster(client.ApiClient(cfg), timeout_s=5)
        posters.append(p)
        return p

    yield poster
    for p in posters:
        p.close()


def test_requests_reuse_one_connection_and_carry_path_auth_and_body(make) -> None:  # type: ignore[no-untyped-def]
    server = Server([[OK, CHUNKED, OK]])
    post = make(server)
    for i in range(3):
        post(f"/api/v1/namespaces/ns/pods/p{i}/binding", {"n": i})
    assert [i for i, _ in server.requests] == [0, 0, 0]
    first = server.requests[0][1]
    assert first.startswith(b"POST /prefix/api/v1/namespaces/ns/pods/p0/binding HTTP/1.1\r\n")
    assert b"\r\nauthorization: Bearer token-1\r\n" in first
    assert b"\r\nContent-Type: application/json\r\n" in first
    assert first.endswith(b'\r\n\r\n{"n":0}')


def test_a_status_outside_2xx_is_an_api_exception_and_the_connection_stays(make) -> None:  # type: ignore[no-untyped-def]
    server = Server([[CONFLICT, OK]])
    post = make(server)
    with pytest.raises(ApiException) as exc:
        post("/x", {})
    assert exc.value.status == 409 and "already bound" in exc.value.body
    post("/x", {})
    assert [i for i, _ in server.requests] == [0, 0]


def test_connection_close_and_a_dropped_idle_connection_take_a_new_one(make) -> None:  # type: ignore[no-untyped-def]
    # Connection 0 says close; connection 1 answers once and is then dropped by the server
    # while idle: the next call finds it dead and goes on a fresh connection 2.
    server = Server([[CLOSE], [OK], [OK]])
    post = make(server)
    post("/a", {})
    post("/b", {})
    post("/c", {})
    assert [i for i, _ in server.requests] == [0, 1, 2]


def test_an_idle_connection_the_server_reset_takes_a_new_one(make) -> None:  # type: ignore[no-untyped-def]
    # Connection 0 answers once and is reset by the server while idle: the next request on
    # it fails with ECONNRESET (not an end of file), and goes on a fresh connection 1.
    server = Server([[OK], [OK]], reset=frozenset({0}))
    post = make(server)
    post("/a", {})
    assert server.closed[0].wait(5)
    post("/b", {})
    assert [i for i, _ in server.requests] == [0, 1]


def test_no_server_is_a_transient_error() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    post = Poster(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))
    with pytest.raises((urllib3.exceptions.HTTPError, ConnectionError)) as exc:
        post("/x", {})
    assert is_transient(exc.value), repr(exc.value)
