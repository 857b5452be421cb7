"""The plumbing of every request, whatever its API: its body read within the limits of size and
time and parsed (JSON, or form data for LibreTranslate's), its API key, its texts checked, its
work done off the event loop within its deadline, its jobs run through a model's queue. Errors
a client causes are an `ApiError`, answered as JSON with their status."""

from __future__ import annotations

import asyncio
import email
import email.policy
import hmac
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl

from nmt.fields import coerce
from nmt.options import ServeOptions
from nmt.serve.batching import Job, gathered
from nmt.serve.model import Model

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def typed(payload: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    value = payload.get(key, default)
    return default if value is None else coerce(value, tp, f'"{key}"', "the request", strings=False)


def check_fields(payload: dict[str, Any], known: set[str]) -> None:
    """400 naming the first field of `payload` that is not one of `known`."""
    if unknown := sorted(set(payload) - known):
        raise ApiError(400, f"unknown field {unknown[0]!r}: fields are {', '.join(sorted(known))}")


class Limits:
    """A request's plumbing within this server's limits (`ServeOptions`) and API keys."""

    def __init__(self, opts: ServeOptions, keys: list[bytes]):
        self.opts = opts
        self.keys = keys

    async def payload(self, request: Any, form: bool = False) -> dict[str, Any]:
        """The request's fields: a JSON object, or with `form` form data where the content type says
        so (urlencoded or multipart), read within the limits of size and time; 403 without a valid
        API key where the server has keys."""
        limit = self.opts.max_body_bytes
        too_big = ApiError(
            413, f"the request body is larger than this server's limit of {limit} bytes"
        )
        if int(request.headers.get("content-length", "0") or 0) > limit:
            raise too_big

        async def read() -> bytes:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_big
            return bytes(body)

        try:
            body = await asyncio.wait_for(read(), self.opts.read_timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {self.opts.read_timeout:g} s"
            ) from None
        content_type = request.headers.get("content-type", "")
        kind = content_type.split(";")[0].strip().lower() if form else "application/json"
        data = await asyncio.to_thread(_parsed, body, kind, content_type, form)
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if form and kind != "application/json":
            # LibreTranslate reads the query string too (request.values)
            data = {**_fields(parse_qsl(request.url.query, keep_blank_values=True)), **data}
        self._authorize(request, data)
        return data

    def _authorize(self, request: Any, payload: dict[str, Any]) -> None:
        if not self.keys:
            return
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        # an auth scheme is case-insensitive (RFC 9110, section 11.1): "bearer KEY" is "Bearer KEY"
        header = token.strip() if scheme.lower() == "bearer" else scheme
        given = payload.get("api_key") or header
        # "\ud800": no key, 403
        given = given.encode("utf-8", "surrogatepass") if isinstance(given, str) else b""
        # a list, not a generator: every key compared, whichever matches
        if not any([hmac.compare_digest(given, key) for key in self.keys]):
            raise ApiError(403, "Invalid API key")

    def texts(self, value: Any, key: str, objects: bool = False) -> list[Any]:
        """A non-empty list of at most max_texts texts (or a str for one), each at most max_chars
        characters, without NUL or lone surrogates; 400 naming the text otherwise. With `objects`,
        a text may also be an object whose "text" is checked (/v1/translate's)."""
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts:
            raise ApiError(400, f'"{key}" must be a string or a non-empty list of strings')
        if len(texts) > self.opts.max_texts:
            raise ApiError(
                400,
                f'"{key}" has {len(texts)} texts, more than this server\'s limit of '
                f"{self.opts.max_texts}",
            )
        for i, t in enumerate(texts):
            text = t.get("text") if isinstance(t, dict) and objects else t
            if not isinstance(text, str):
                raise ApiError(400, f"{key}[{i}] must be a string, got {type(text).__name__}")
            self.within(f"{key}[{i}]", [text])
        return texts

    def within(self, what: str, strings: Sequence[str]) -> None:
        """400 naming `what` unless `strings` (a text, a text's phrases, a terminology's terms)
        hold at most max_chars characters together, none a NUL or a lone surrogate: --max-chars
        bounds everything a request carries, not its texts alone (a 900,000-character avoided
        phrase took 16 MB to index)."""
        size = sum(map(len, strings))
        if size > self.opts.max_chars:
            raise ApiError(
                400,
                f"{what} has {size} characters, more than this server's limit of "
                f"{self.opts.max_chars}",
            )
        if any(re.search("[\0\ud800-\udfff]", s) for s in strings):
            raise ApiError(400, f"{what} holds a NUL or a lone surrogate")

    def deadline(self) -> float:
        """When a request read now must be answered (--timeout), in the event loop's time."""
        return asyncio.get_running_loop().time() + self.opts.timeout

    def late(self) -> ApiError:
        return ApiError(
            504, f"the translation took longer than this server's limit of {self.opts.timeout:g} s"
        )

    async def off_loop(self, deadline: float, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on a thread of its own, 504 past `deadline`: what a request asks (its
        terminology compiled and matched, its HTML parsed, its texts encoded, its answer built)
        never holds up the event loop, which answers every other client (25,000 terms froze
        them all, /health included, for 13.5 s)."""
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            return await asyncio.wait_for(asyncio.to_thread(work, *args), remaining)
        except asyncio.TimeoutError:
            raise self.late() from None

    async def run(
        self, request: Any, model: Model, jobs: list[Job], deadline: float, full: int = 503
    ) -> list[Any]:
        """The jobs' results once decoded: 503 (`full`) when the queue is full, 504 past the
        deadline; a client that goes away has its jobs dropped."""
        assert model.batcher is not None
        if len(jobs) > self.opts.max_queue:  # never accepted: not a "retry later"
            raise ApiError(
                400,
                f"{len(jobs)} sentences, more than this server's queue holds "
                f"({self.opts.max_queue})",
            )
        if not model.batcher.submit(jobs):
            raise ApiError(
                full, "Slowdown: the translation queue is full; retry later", {"Retry-After": "1"}
            )
        results = gathered(jobs)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            waiting: list[asyncio.Future[Any]] = [results, gone]
            timeout = max(0.0, deadline - asyncio.get_running_loop().time())
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            gone.cancel()
            # queued: dropped; in a running search: ended at its next step (nmt.serve.stream)
            for j in jobs:
                j.abandoned = not j.future.cancel()
        if results in done:
            return results.result()
        results.cancel()
        if gone in done:
            raise ApiError(499, "the client went away")
        raise self.late()


def _parsed(body: bytes, kind: str, content_type: str, form: bool) -> Any:
    """A request body of content type `kind` (`content_type` in full) as Python values: on a
    thread (`Limits.payload`), as a megabyte of JSON takes the event loop's time otherwise."""
    try:
        if kind == "application/x-www-form-urlencoded" or (form and not body):
            # raw UTF-8, as Werkzeug takes it
            return _fields(parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict"))
        if kind == "multipart/form-data":
            head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
            parts = email.message_from_bytes(head + body, policy=email.policy.HTTP).iter_parts()
            return _fields(
                [
                    (
                        p.get_param("name", header="content-disposition"),
                        cast(bytes, p.get_payload(decode=True) or b"").decode("utf-8"),
                    )
                    for p in parts
                ]
            )
        return json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _fields(pairs: list[tuple[Any, str]]) -> dict[str, Any]:
    """Form fields as a dict; a name given more than once (q=a&q=b) is a list."""
    out: dict[str, list[str]] = {}
    for name, value in pairs:
        out.setdefault(name, []).append(value)
    return {name: values[0] if len(values) == 1 else values for name, values in out.items()}


async def _disconnected(request: Any) -> None:
    """Returns when the client has gone away (the body has been read: what comes next is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
