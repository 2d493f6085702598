"""The asyncio client's requests run on asyncio's own streams
(``lockkeeper_client._transports``), over plain HTTP and TLS, and a server that
cannot be reached is still a transport error the client retries and reports."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
from lockkeeper_client import AsyncLockClient, LockClient, ServiceUnavailable
from lockkeeper_client._transports import AsyncioBackend
from werkzeug.serving import make_server

from bench.ports import free_port

pytest_plugins = ["tests.live_server"]


@pytest.fixture
def connects(monkeypatch) -> list[tuple[str, int]]:
    """The connections ``AsyncioBackend`` opens, as (host, port)."""
    opened: list[tuple[str, int]] = []
    connect = AsyncioBackend.connect_tcp

    async def counted(self, host, port, *args, **kwargs):
        opened.append((host, port))
        return await connect(self, host, port, *args, **kwargs)

    monkeypatch.setattr(AsyncioBackend, "connect_tcp", counted)
    return opened


@pytest.mark.anyio
async def test_the_asyncio_face_runs_on_asyncio_streams(live_server, connects):
    async with AsyncLockClient(live_server.url, live_server.token) as client:
        assert (await client.acquire("streams:1", "w", ttl=30)).acquired
        await client.release("streams:1", "w")
    assert connects, "the requests did not go through AsyncioBackend"


def test_the_blocking_face_keeps_httpx_s_transport(live_server, connects):
    with LockClient(live_server.url, live_server.token) as client:
        assert client.acquire("streams:2", "w", ttl=30).acquired
    assert connects == []


@pytest.mark.anyio
async def test_an_unreachable_server_is_a_transport_error_retried_then_reported():
    port = free_port()  # nothing listens on it
    async with AsyncLockClient(
        f"http://127.0.0.1:{port}", "lk_token", retries=1, backoff=0.01
    ) as client:
        with pytest.raises(ServiceUnavailable):
            await client.acquire("streams:3", "w", ttl=30)


@contextmanager
def serving_tls(app, tmp_path) -> Iterator[tuple[str, str]]:
    """``app`` over TLS on 127.0.0.1 with a self-signed certificate: (url,
    certificate file)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = make_server(
        "127.0.0.1", 0, app, threaded=True, ssl_context=(str(cert), str(key))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}", str(cert)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.anyio
async def test_the_asyncio_face_speaks_tls_on_its_streams(
    live_server, connects, tmp_path, monkeypatch
):
    with serving_tls(live_server.app, tmp_path) as (url, cert):
        # The environment's CA file, as httpx reads it (trust_env).
        monkeypatch.setenv("SSL_CERT_FILE", cert)
        async with AsyncLockClient(url, live_server.token) as client:
            assert (await client.acquire("streams:4", "w", ttl=30)).acquired
            held = await client.get("streams:4")
            assert held.owner == "w"
            await client.release("streams:4", "w")
        monkeypatch.delenv("SSL_CERT_FILE")
        async with AsyncLockClient(url, live_server.token, retries=0) as untrusted:
            with pytest.raises(ServiceUnavailable):
                await untrusted.get("streams:4")
    assert connects


@pytest.mark.anyio
async def test_a_kept_alive_connection_the_server_closed_is_not_reused():
    """The reader says whether an idle connection can be reused (no syscall):
    closed by the peer, or holding bytes nobody asked for, it is not."""
    import asyncio

    closed = asyncio.Event()

    async def serve(reader, writer):
        await reader.read(1)
        writer.write(b"unasked")
        await writer.drain()
        await closed.wait()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        assert stream.get_extra_info("is_readable") is False
        await stream.write(b"x")
        for _ in range(200):
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.01)
        assert stream.get_extra_info("is_readable") is True  # bytes unasked
        assert await stream.read(64) == b"unasked"
        closed.set()
        for _ in range(200):
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.01)
        assert stream.get_extra_info("is_readable") is True  # closed by the peer
        await stream.aclose()


@asynccontextmanager
async def keep_alive_server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """An HTTP/1.1 server on 127.0.0.1 that answers every request on a
    connection kept alive: (url, counts of connections opened and open at
    once at most)."""
    import asyncio

    counts = {"opened": 0, "open": 0, "most": 0}

    async def serve(reader, writer):
        counts["opened"] += 1
        counts["open"] += 1
        counts["most"] = max(counts["most"], counts["open"])
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await asyncio.sleep(0.001)  # a server's work: others ask meanwhile
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            counts["open"] -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/", counts


@pytest.mark.anyio
async def test_tasks_of_one_client_are_each_handed_a_connection_once(monkeypatch):
    """16 tasks sending requests one after another on one client of the
    asyncio face: each request is handed an idle connection nobody else was
    handed, so none fails on it and asks again (httpcore's own pool handed
    one idle connection to every task that asked in the same turn of the
    loop: 2.7 retries a request, each a pass over every connection)."""
    import asyncio

    import httpx
    from httpcore._async.connection_pool import AsyncPoolRequest
    from lockkeeper_client._transports import async_fast_streams

    retried = 0
    clear = AsyncPoolRequest.clear_connection

    def counted(self):
        nonlocal retried
        retried += 1
        clear(self)

    monkeypatch.setattr(AsyncPoolRequest, "clear_connection", counted)
    tasks = 16
    async with keep_alive_server() as (url, counts), httpx.AsyncClient() as http:
        async_fast_streams(http)

        async def requests() -> None:
            for _ in range(10):
                assert (await http.get(url)).status_code == 200

        await asyncio.gather(*(requests() for _ in range(tasks)))
    assert retried == 0
    assert counts["opened"] == tasks


@pytest.mark.anyio
async def test_the_asyncio_pool_keeps_its_limits():
    """More requests at once than the pool may open connections: they wait
    for one to come free, and no more than ``max_keepalive_connections`` stay
    open once they are done."""
    import asyncio

    from lockkeeper_client._transports import AsyncioPool

    async with (
        keep_alive_server() as (url, counts),
        AsyncioPool(
            max_connections=2,
            max_keepalive_connections=1,
            network_backend=AsyncioBackend(),
        ) as pool,
    ):
        answers = await asyncio.gather(*(pool.request("GET", url) for _ in range(8)))
        assert [answer.status for answer in answers] == [200] * 8
        assert counts["most"] == 2
        assert len(pool.connections) == 1
