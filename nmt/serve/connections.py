"""What `nmt serve` bounds below the application: connections and request heads (uvicorn's
HTTP/1.1 protocol on h11, with the limits a server open to any client needs), and what a
request still running is answered when the server stops waiting for it.

uvicorn's httptools protocol has no bound on a request head and no timeout for one: a client
sending header lines grew the server by 3 GB, and silent or slow connections stayed open for
ever until, at the open-file limit, no new client could connect. h11 buffers at most
`--max-head-bytes` of a head it has not parsed whole; this protocol adds the clock of each
head and the count of open connections. Every refusal is nmt's JSON error, and the
connection is then closed.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

import h11
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt.errors import NmtError
from nmt.options import ServeOptions

# ASGI's
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Message, Receive, Send], Awaitable[None]]
LINGER = 1.0  # s a refused connection stays open, reading and dropping what the client still sends
FILES_BESIDE_CONNECTIONS = (
    256  # open files the server needs besides its connections (models, logs, pipes)
)
STOPPED = "the server stopped before this request was answered; retry"


def head_too_large(limit: int) -> str:
    return (
        "the request head (request line and headers) is larger than this server's limit of "
        f"{limit} bytes"
    )


class Connection(H11Protocol):
    """One client connection: uvicorn's h11 protocol, where
    - a head h11 has not parsed whole within `max_head_bytes` is 431 (h11 raises at its bound);
    - a head must arrive within `head_timeout` s of the connection or of the previous answer,
      else 408 (a slowloris client, a silent socket);
    - a connection past `max_connections` open is answered 503 at once."""

    opts: ServeOptions  # the server's (`connection_class`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = False
        self.head_clock: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.opts.max_connections:
            self.refuse(
                503,
                f"this server has {self.opts.max_connections} connections open, its limit; retry "
                "later",
                "retry-after: 1\r\n",
            )
        else:
            self.await_head()

    def data_received(self, data: bytes) -> None:
        if not self.refused:  # a refused connection's data is dropped until it closes
            super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_clock is not None:
            self.head_clock.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.refused:
            self.transport.close()
        else:
            super().shutdown()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer where h11 finds no valid request, or a head past its bound."""
        if len(self.conn.trailing_data[0]) > self.opts.max_head_bytes:
            self.refuse(431, head_too_large(self.opts.max_head_bytes))
        else:
            self.refuse(400, "invalid HTTP request")

    def await_head(self) -> None:
        """Start the clock of the next request's head."""
        if self.head_clock is not None:
            self.head_clock.cancel()
        self.head_clock = self.loop.call_later(self.opts.head_timeout, self.head_late)

    def head_late(self) -> None:
        if (
            self.conn.their_state is h11.IDLE
            and not self.refused
            and not self.transport.is_closing()
        ):
            self.refuse(408, f"the request head did not arrive within {self.opts.head_timeout:g} s")

    def refuse(self, status: int, message: str, headers: str = "") -> None:
        """Answer `status` with `message`, then close: after LINGER s of dropping what the client
        still sends, or when it closes first (closing on unread data would reset the connection,
        and the client could lose the answer)."""
        body = json.dumps({"error": message}).encode()  # nmt's JSON error
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: "
            f"application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n{headers}\r\n"
        )
        self.refused = True
        self.transport.write(head.encode("ascii") + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)


def connection_class(opts: ServeOptions) -> type[Connection]:
    """The protocol uvicorn runs (its `http`), with the limits of `opts`."""
    return type("Connection", (Connection,), {"opts": opts})


def open_files_for(opts: ServeOptions) -> None:
    """Raise the process's soft limit of open files (up to the hard one) so that
    --max-connections can all be open; an NmtError where the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = opts.max_connections + FILES_BESIDE_CONNECTIONS
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise NmtError(
            f"--max-connections {opts.max_connections} needs {needed} open files, and this process "
            f"may open at most {hard} (ulimit -Hn): lower --max-connections"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def guarded(app: App, opts: ServeOptions) -> App:
    """The application as uvicorn runs it, with what the application cannot see itself:
    - a head over --max-head-bytes that h11 parsed whole (it came in one read) is 431, as one
      that came in pieces is;
    - a request still running when the server stops waiting for it (--drain-timeout past, a
      second Ctrl-C) is answered 503, where uvicorn would log a traceback and send a plain-text
      500."""

    async def run(scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if _head_size(scope) > opts.max_head_bytes:
            return await _error(431, head_too_large(opts.max_head_bytes))(scope, receive, send)
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, sending)
        except asyncio.CancelledError:  # the task is ending: answered, not re-raised
            if not started:
                await _error(503, STOPPED)(scope, receive, send)

    return run


def _head_size(scope: Message) -> int:
    """About the bytes of the request line and headers of `scope` (as parsed: names lower-cased)."""
    line = len(scope["method"]) + len(scope["raw_path"]) + len(scope["query_string"]) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


def _error(status: int, message: str) -> JSONResponse:
    """nmt's JSON error as an ASGI application that answers it; the connection is then closed."""
    return JSONResponse({"error": message}, status, {"connection": "close"})
