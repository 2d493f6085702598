"""The sockets under the two faces' HTTP, written side by side as
``_concurrency``'s primitives are (``async_fast_streams`` in ``_async/``,
``fast_streams`` in the generated ``_sync/``).

The asyncio face's requests run on asyncio's own streams, not through anyio.
httpx's default asyncio transport reaches the socket through httpcore's anyio
backend, which opens an anyio cancel scope around every read and write (each
asking sniffio which event loop runs, and the current task, several times).
Counted by callgrind with 16 tasks against 16 threads on one server (acquire +
release cycles), the asyncio face ran 9.1 M instructions per cycle against the
threads' 4.9 M; on asyncio's streams, 7.0 to 7.9 M (two runs). The pool is
httpcore's with one change (``AsyncioPool``); HTTP/1.1 and TLS through ``ssl``
are httpcore's as before.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

# httpcore's own exceptions, which httpx turns into its TransportErrors
# (TimeoutError first: it is an OSError).
_READ_ERRORS: dict[type[Exception], type[Exception]] = {
    TimeoutError: httpcore.ReadTimeout,
    OSError: httpcore.ReadError,
}
_WRITE_ERRORS: dict[type[Exception], type[Exception]] = {
    TimeoutError: httpcore.WriteTimeout,
    OSError: httpcore.WriteError,
}
_CONNECT_ERRORS: dict[type[Exception], type[Exception]] = {
    TimeoutError: httpcore.ConnectTimeout,
    OSError: httpcore.ConnectError,
}


class _Mapped:
    """Re-raise an exception of ``errors``' kinds as its httpcore twin."""

    def __init__(self, errors: dict[type[Exception], type[Exception]]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        for caught, raised in self.errors.items():
            if isinstance(exc, caught):
                raise raised(exc) from exc


_READ = _Mapped(_READ_ERRORS)
_WRITE = _Mapped(_WRITE_ERRORS)
_CONNECT = _Mapped(_CONNECT_ERRORS)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection on asyncio's streams."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _READ:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        with _WRITE:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass  # the peer went first: closed either way

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with _CONNECT:
                async with asyncio.timeout(timeout):
                    await self._writer.start_tls(
                        ssl_context, server_hostname=server_hostname
                    )
        except BaseException:
            await self.aclose()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":
            return self._is_readable()
        return None

    def _is_readable(self) -> bool:
        """A kept-alive connection with something to read (or closed by the
        peer) is not reused. asyncio's transport reads whatever arrives into
        the reader as the loop runs, so the reader knows without asking the
        socket: httpcore asks for every idle connection of the pool at every
        request and answer (a poll() each, 38 per cycle with 16 tasks)."""
        reader = self._reader
        return reader.at_eof() or bool(getattr(reader, "_buffer", b""))


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        with _CONNECT:
            async with asyncio.timeout(timeout):
                # asyncio sets TCP_NODELAY on its TCP transports.
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        with _CONNECT:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class AsyncioPool(httpcore.AsyncConnectionPool):
    """httpcore's pool, each idle connection handed to one request at a time.

    httpcore hands an idle connection to every request queued in a pass, and
    the connection stays idle until its request starts on it, after a turn of
    the event loop (its lock's checkpoint): meanwhile the pass of every other
    task that sends a request hands it out again. All but one then fail with
    ``ConnectionNotAvailable`` and ask again, each asking being another pass
    over every connection (16 tasks: 2.7 retries a request). Here a connection
    handed to a request that has not started on it is taken, and a pass that
    closes nothing opens no cancel scope."""

    def _assign_requests_to_connections(self) -> list[Any]:
        closing: list[Any] = []
        taken = {request.connection for request in self._requests}
        for connection in list(self._connections):
            if connection.is_closed():
                self._connections.remove(connection)
            elif connection.has_expired():
                self._connections.remove(connection)
                closing.append(connection)
            elif (
                connection.is_idle()
                and connection not in taken
                and len(self._connections) > self._max_keepalive_connections
            ):
                self._connections.remove(connection)
                closing.append(connection)
        free = [
            connection
            for connection in self._connections
            if connection not in taken and connection.is_available()
        ]
        for request in self._requests:
            if not request.is_queued():
                continue
            origin = request.request.url.origin
            found = next((c for c in free if c.can_handle_request(origin)), None)
            if found is not None:
                free.remove(found)
            else:
                if len(self._connections) >= self._max_connections:
                    idle = next((c for c in free if c.is_idle()), None)
                    if idle is None:
                        continue  # waits for a connection to come free
                    free.remove(idle)
                    self._connections.remove(idle)
                    closing.append(idle)
                found = self.create_connection(origin)
                self._connections.append(found)
            taken.add(found)
            request.assign_to_connection(found)
        return closing

    async def _close_connections(self, closing: list[Any]) -> None:
        if closing:
            await super()._close_connections(closing)


def async_fast_streams(http: httpx.AsyncClient) -> None:
    """Put ``http``'s own transport (not one the caller gave, nor a proxy's) on
    ``AsyncioBackend``.

    httpx has no parameter for the network backend, and a transport passed in
    would turn off the proxies of the environment: the pool's backend is set
    where httpx and httpcore keep it (httpx 0.24 to 0.28+, httpcore 1.x). A
    version that keeps it elsewhere keeps httpx's own backend, slower but the
    same.
    """
    transport = getattr(http, "_transport", None)
    if type(transport) is not httpx.AsyncHTTPTransport:
        return
    pool = getattr(transport, "_pool", None)
    if type(pool) is httpcore.AsyncConnectionPool and hasattr(pool, "_network_backend"):
        pool._network_backend = AsyncioBackend()
        if not pool._http2:
            pool.__class__ = AsyncioPool


def fast_streams(http: httpx.Client) -> None:
    """The blocking face's transport runs on plain sockets already."""
