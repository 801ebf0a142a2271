"""``scheduler.kube.client.Poster``, with no cluster: against a scripted server (each
connection answers its requests with the next canned responses: dropped and reset
connections, byte for byte), and against ``http.server`` over TLS with a certificate made by
``openssl`` (answers, errors, chunked bodies, reuse, threads, authentication, TLS settings)."""

from __future__ import annotations

import contextlib
import http.server
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.kube.client import Poster, is_transient
from tests.prereq import require

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


def test_a_server_that_does_not_answer_times_out() -> None:
    sock = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    with sock:
        post = Poster(
            client.ApiClient(
                client.Configuration(host=f"http://127.0.0.1:{sock.getsockname()[1]}")
            ),
            timeout_s=0.3,
        )
        with pytest.raises(TimeoutError) as exc:
            post("/x", {})
        assert is_transient(exc.value)


# ----------------------------------------------------------------- over TLS, http.server

BODY = b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}'
CONFLICT_BODY = b'{"kind":"Status","message":"already bound","code":409}'


class Handler(http.server.BaseHTTPRequestHandler):
    """One instance per connection (HTTP/1.1 keep-alive); the path chooses the answer:
    ``.../conflict`` a 409, ``.../chunked`` a chunked body, else a 201."""

    protocol_version = "HTTP/1.1"
    server: TLSServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.connection_id = self.server.connections

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests.append((self.connection_id, self.path, self.headers, body))
        conflict = self.path.endswith("/conflict")
        status, answer = (409, CONFLICT_BODY) if conflict else (201, BODY)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if "/chunked" in self.path:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(answer), 7):  # in pieces, each written on its own
                piece = answer[i : i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class TLSServer(http.server.ThreadingHTTPServer):
    """``Handler`` over TLS (the handshake in the connection's thread); records every
    request as (connection number, path, headers, body) and the names clients sent (SNI)."""

    daemon_threads = True

    def __init__(self, ctx: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.ctx = ctx
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[tuple[int, str, Any, bytes]] = []
        self.names: list[str | None] = []
        ctx.sni_callback = lambda _sock, name, _ctx: self.names.append(name)  # type: ignore[assignment,func-returns-value]
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def finish_request(self, request: Any, client_address: Any) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            tls = self.ctx.wrap_socket(request, server_side=True)
            self.RequestHandlerClass(tls, client_address, self)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed server certificate for ``localhost`` and 127.0.0.1 (``server.pem``,
    ``server.key``) and a self-signed client certificate (``client.pem``, ``client.key``)."""
    require(shutil.which("openssl"), "no openssl command: `apt-get install openssl`")
    d = tmp_path_factory.mktemp("pki")
    for name, subject, san in (
        ("server", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ("client", "/CN=binder", "subjectAltName=DNS:binder"),
    ):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", subject,
             "-addext", san, "-keyout", d / f"{name}.key", "-out", d / f"{name}.pem"],
            check=True, capture_output=True,
        )  # fmt: skip
    return d


@pytest.fixture
def tls_server(pki: Path) -> Iterator[TLSServer]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    server = TLSServer(ctx)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_poster(pki: Path, tls_server: TLSServer) -> Iterator[Poster]:
    cfg = client.Configuration(host=f"https://127.0.0.1:{tls_server.port}/prefix")
    cfg.ssl_ca_cert = str(pki / "server.pem")
    cfg.api_key = {"authorization": "Bearer token-1"}
    post = Poster(client.ApiClient(cfg), timeout_s=5)
    yield post
    post.close()


def test_tls_answers_carry_path_headers_and_body_on_one_connection(
    tls_server: TLSServer, tls_poster: Poster
) -> None:
    tls_poster.api.set_default_header("X-Default", "d")
    for i in range(3):
        tls_poster(f"/api/v1/namespaces/ns/pods/p{i}/binding", {"n": i})
    assert [(c, path, body) for c, path, _, body in tls_server.requests] == [
        (1, f"/prefix/api/v1/namespaces/ns/pods/p{i}/binding", b'{"n":%d}' % i) for i in range(3)
    ]
    headers = tls_server.requests[0][2]
    assert headers["Authorization"] == "Bearer token-1"
    assert headers["Content-Type"] == headers["Accept"] == "application/json"
    assert headers["X-Default"] == "d"
    assert headers["User-Agent"].startswith("OpenAPI-Generator/")
    assert tls_server.names == [None]  # no server name (SNI) for an IP address


@pytest.mark.parametrize("path", ["/conflict", "/chunked/conflict"])
def test_tls_a_status_outside_2xx_is_an_api_exception_and_the_connection_stays(
    tls_server: TLSServer, tls_poster: Poster, path: str
) -> None:
    with pytest.raises(ApiException) as exc:
        tls_poster(path, {})
    assert (exc.value.status, exc.value.reason) == (409, "Conflict")
    assert exc.value.body == CONFLICT_BODY.decode()
    assert not is_transient(exc.value)
    tls_poster("/ok", {})
    assert [c for c, *_ in tls_server.requests] == [1, 1]


def test_tls_chunked_answers_are_read_whole(tls_server: TLSServer, tls_poster: Poster) -> None:
    for _ in range(3):
        tls_poster("/chunked", {})
    assert [c for c, *_ in tls_server.requests] == [1, 1, 1]


def test_tls_calls_from_many_threads_share_kept_alive_connections(
    tls_server: TLSServer, tls_poster: Poster
) -> None:
    # As many idle connections kept as there are threads: a connection is made only when
    # none is idle, so never more than one per thread. (With fewer kept, as the client's
    # default of 5 per core, one handed back while that many are idle is closed, and how
    # many are made then depends on how the threads interleave.)
    tls_poster.max_idle = 32
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda i: tls_poster(f"/p{i}", {"i": i}), range(640)))
    assert sorted(path for _, path, _, _ in tls_server.requests) == sorted(
        f"/prefix/p{i}" for i in range(640)
    )
    assert all(body == b'{"i":%s}' % path[9:].encode() for _, path, _, body in tls_server.requests)
    assert tls_server.connections <= 32  # one per thread at most: each is used again
    assert len(tls_poster.idle) <= tls_poster.max_idle


def test_tls_a_refreshed_token_is_used_on_the_next_call(
    tls_server: TLSServer, tls_poster: Poster
) -> None:
    cfg = tls_poster.api.configuration
    tokens = iter(["token-2", "token-3"])
    cfg.refresh_api_key_hook = lambda c: c.api_key.update(authorization=f"Bearer {next(tokens)}")
    tls_poster("/a", {})
    tls_poster("/b", {})
    seen = [headers["Authorization"] for _, _, headers, _ in tls_server.requests]
    assert seen == ["Bearer token-2", "Bearer token-3"]


def test_tls_client_certificate_and_server_name(pki: Path) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    ctx.verify_mode = ssl.CERT_REQUIRED  # the client must show the client certificate
    ctx.load_verify_locations(pki / "client.pem")
    server = TLSServer(ctx)
    try:
        cfg = client.Configuration(host=f"https://127.0.0.1:{server.port}")
        cfg.ssl_ca_cert = str(pki / "server.pem")
        cfg.tls_server_name = "localhost"
        without = Poster(client.ApiClient(cfg), timeout_s=5)
        with pytest.raises((ssl.SSLError, ConnectionError)) as exc:  # refused at the handshake
            without("/x", {})
        assert is_transient(exc.value)
        cfg.cert_file, cfg.key_file = str(pki / "client.pem"), str(pki / "client.key")
        post = Poster(client.ApiClient(cfg), timeout_s=5)
        post("/x", {})
        post.close()
        assert server.names[-1] == "localhost"
        assert [path for _, path, _, _ in server.requests] == ["/x"]
    finally:
        server.shutdown()
        server.server_close()


def test_tls_an_untrusted_server_fails_unless_verification_is_off(
    pki: Path, tls_server: TLSServer
) -> None:
    cfg = client.Configuration(host=f"https://127.0.0.1:{tls_server.port}")  # no CA given
    with pytest.raises(ssl.SSLCertVerificationError) as exc:
        Poster(client.ApiClient(cfg), timeout_s=5)("/x", {})
    assert is_transient(exc.value)
    cfg.ssl_ca_cert = str(pki / "server.pem")
    cfg.tls_server_name = "elsewhere"  # not a name of the certificate
    with pytest.raises(ssl.SSLCertVerificationError):
        Poster(client.ApiClient(cfg), timeout_s=5)("/x", {})
    cfg.assert_hostname = False
    Poster(client.ApiClient(cfg), timeout_s=5)("/x", {})
    insecure = client.Configuration(host=f"https://127.0.0.1:{tls_server.port}")
    insecure.verify_ssl = False
    Poster(client.ApiClient(insecure), timeout_s=5)("/x", {})
    assert len(tls_server.requests) == 2


def test_behind_a_proxy_calls_go_through_the_clients_pool_manager() -> None:
    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        seen: ClassVar[list[str]] = []

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            Proxy.seen.append(self.path)
            self.send_response(201)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        cfg = client.Configuration(host="http://kube.invalid:8080/prefix")
        cfg.proxy = f"http://127.0.0.1:{proxy.server_address[1]}"
        post = Poster(client.ApiClient(cfg), timeout_s=5)
        post("/api/v1/namespaces/ns/events", {})
        assert Proxy.seen == ["http://kube.invalid:8080/prefix/api/v1/namespaces/ns/events"]
    finally:
        proxy.shutdown()
        proxy.server_close()
