"""`nmt serve`: checkpoints behind HTTP, on Starlette and uvicorn (`pip install 'nmt[serve]'`).

Endpoints (described in openapi.json, served at /openapi.json): nmt's own `POST /v1/translate`
and `POST /v1/score`, `GET /v1/models`, `/health`, `/ready`, `/metrics` (Prometheus); the
LibreTranslate API (`POST /translate`, `GET /languages`), so that its clients work unchanged;
and a web page at `/` (page.html, nothing loaded from elsewhere). Every sentence of every
client goes through one queue per model (nmt.serve.batching). Errors are JSON
`{"error": "..."}` with their status, never a traceback; no request can name a file.
"""

from __future__ import annotations

import asyncio
import copy
import email
import email.policy
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl

import torch

from nmt.api import DECODE_OPTIONS, Translation, Translator
from nmt.config import DecodeConfig
from nmt.decoding.predict import decode_config, decode_workers
from nmt.decoding.search import max_output_lengths
from nmt.errors import NmtError, one_line
from nmt.fields import coerce, coerce_option
from nmt.options import ServeOptions
from nmt.serve.answers import Asked, answer, number
from nmt.serve.batching import Batcher, Job, gathered
from nmt.serve.stream import Stream, can_stream
from nmt.terminology import JSON_KEYS, Request, Terminology, terminology_from_pairs, with_terms

log = logging.getLogger(__name__)
V1_KEYS = {
    "model",
    "texts",
    "nbest",
    "alignment",
    "attention",
    "target_lang",
    "terminology",
    "api_key",
}
SCORE_KEYS = {"model", "sources", "targets", "normalize", "api_key"}
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass(eq=False)
class Model:
    """A served checkpoint: its translator, languages and queue. A request's other decode settings
    get a translator of their own (`variant`), made again wherever needed and never kept: what a
    request sends stays in memory only while it is answered."""

    name: str
    translator: Translator
    source: str
    target: str
    batcher: Batcher | None = None
    continuous: bool = (
        True  # sentences join a running search where they can (--no-continuous: batches)
    )
    threads: tuple[int, int] = (
        1,
        1,
    )  # torch threads of a running search, with others and alone (nmt.serve.stream)

    @property
    def targets(self) -> list[str]:
        tokens = [t[2:-2] for t in self.translator.loaded.tokenizer.language_tokens()]
        return sorted({self.target, *tokens} - {""})

    def variant(self, overrides: dict[str, Any], nbest: int) -> tuple[tuple[Any, ...], Translator]:
        """The settings key and the translator of these decode settings over the served ones
        (checked; 400 if wrong): a shallow copy of the served one (model, options, terminology)."""
        base = self.translator
        if not overrides and nbest == 1:
            return ((), nbest), base
        tr = copy.copy(base)
        tr.decode = decode_config(
            base.decode,
            overrides,
            nbest,
            vocab_size=base.loaded.tokenizer.vocab_size,
            option=lambda k: f'"{k}"',
        )
        return (tuple(sorted(overrides.items())), nbest), tr

    def translator_of(self, settings: tuple[Any, ...], nbest: int) -> Translator:
        """The translator of a job key's settings (`variant`'s, made again: well under a
        millisecond)."""
        return self.variant(dict(settings), nbest)[1]

    def stream(self, key: Any) -> Stream | None:
        """The batcher's `stream` (continuous batching, nmt.serve.stream) for a key whose sentences
        can join one."""
        kind, settings, nbest, attend, lang, plain = key
        if kind != "translate" or not plain or not self.continuous:
            return None
        tr = self.translator_of(settings, nbest)
        return Stream(tr, nbest, attend, lang, self.threads) if can_stream(tr) else None

    def decode(self, key: Any, jobs: list[Job]) -> list[Any]:
        """The worker's decode function (nmt.serve.batching): the results of a batch of one key."""
        kind, settings, nbest, attend, lang, _ = key
        if kind == "score":
            return self.translator.score(
                [j.item[0] for j in jobs], [j.item[1] for j in jobs], normalize=settings
            )
        tr = self.translator_of(settings, nbest)
        if tr.decode.sampling:  # a sentence's generator is its index in its request: one at a time
            return [
                tr.translate_nbest(
                    [j.item],
                    nbest,
                    where=[j.where].__getitem__,
                    first_index=j.index,
                    alignment=attend,
                    attention=attend,
                    target_lang=lang,
                    abandoned=j.gone,
                )[0]
                for j in jobs
            ]
        # cut into the command's batches (decode.batch_size), one per CPU worker: a batch of at
        # most batch_size runs whole on every thread, faster than cut in halves
        # (docs/benchmarks.md); a sentence nobody waits for any more (a 504, a client gone) ends at
        # its search's next step
        return tr.translate_nbest(
            [j.item for j in jobs],
            nbest,
            where=lambda i: jobs[i].where,
            alignment=attend,
            attention=attend,
            target_lang=lang,
            abandoned=lambda i: jobs[i].abandoned,
        )


def _rendered(asked: Asked, results: list[list[Translation]]) -> Any:
    """The answer of /v1/translate as a response, rendered: on a thread, within the request's
    deadline (`Service.off_loop`), as its attention weights may be megabytes."""
    from starlette.responses import JSONResponse

    return JSONResponse(answer(asked, results))


def _typed(payload: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    value = payload.get(key, default)
    return default if value is None else coerce(value, tp, f'"{key}"', "the request", strings=False)


class Service:
    """The served models, the limits and the metrics; `app()` is the ASGI application."""

    def __init__(self, models: dict[str, Model], opts: ServeOptions, keys: list[bytes]):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.models = models
        self.opts = opts
        self.keys = keys
        self.stopping: Callable[[], bool] = lambda: False
        prometheus_client.disable_created_metrics()  # the _created series: noise for a scraper
        self.registry = reg = CollectorRegistry()
        self.requests = Counter(
            "nmt_requests", "HTTP requests answered", ["endpoint", "status"], registry=reg
        )
        self.latency = Histogram(
            "nmt_request_seconds", "Time to answer a request", ["endpoint"], registry=reg
        )
        self.sentences = Counter("nmt_sentences", "Sentences decoded", ["model"], registry=reg)
        self.batches = Histogram(
            "nmt_batch_sentences",
            "Sentences in a decoded batch (or step of a running search)",
            ["model"],
            registry=reg,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )
        depth = Gauge(
            "nmt_queue_sentences", "Sentences waiting to be decoded", ["model"], registry=reg
        )
        for (
            name,
            m,
        ) in models.items():  # continuous batching: a running search per decode worker (--workers)
            lanes = decode_workers(opts.workers, m.translator.device) if m.continuous else 1
            threads = opts.threads or torch.get_num_threads()
            m.threads = (max(1, threads // lanes), threads)
            m.batcher = Batcher(
                m.decode,
                batch_tokens=opts.batch_tokens,
                max_queue=opts.max_queue,
                max_wait=opts.max_wait_ms / 1000,
                on_batch=partial(self._counted, name),
                name=name,
                stream=m.stream,
                lanes=lanes,
            )
            depth.labels(name).set_function(m.batcher.depth)

    def _counted(self, name: str, decoded: int, size: int) -> None:
        """The batcher's `on_batch` of model `name` (with partial): a batch (or a step) of `size`
        sentences, of which `decoded` were finished."""
        self.sentences.labels(name).inc(decoded)
        self.batches.labels(name).observe(size)

    def close(self) -> None:
        for m in self.models.values():
            if m.batcher is not None:
                m.batcher.close()

    # ------------------------------------------------------------------ requests

    async def _payload(self, request: Any, form: bool = False) -> dict[str, Any]:
        """The request's fields: a JSON object, or with `form` form data where the content type says
        so (urlencoded or multipart), read within the limits of size and time; 403 without a valid
        API key where the server has keys."""
        limit = self.opts.max_body_bytes
        chunks = []
        too_big = ApiError(
            413, f"the request body is larger than this server's limit of {limit} bytes"
        )
        if int(request.headers.get("content-length", "0") or 0) > limit:
            raise too_big

        async def read() -> None:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.opts.read_timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {self.opts.read_timeout:g} s"
            ) from None
        body = b"".join(chunks)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        kind = kind if form else "application/json"
        data = await asyncio.to_thread(
            _parsed, body, kind, request.headers.get("content-type", ""), form
        )
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if (
            form and kind != "application/json"
        ):  # LibreTranslate reads the query string too (request.values)
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
        given = (
            given.encode("utf-8", "surrogatepass") if isinstance(given, str) else b""
        )  # "\ud800": no key, 403
        if not any(
            [hmac.compare_digest(given, key) for key in self.keys]
        ):  # a list: every key compared
            raise ApiError(403, "Invalid API key")

    def _model(self, name: Any) -> Model:
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not isinstance(name, str) or name not in self.models:
            raise ApiError(
                400,
                f'unknown "model" {name!r}: this server has {", ".join(map(repr, self.models))}',
            )
        return self.models[name]

    def _texts(self, value: Any, key: str, kinds: tuple[type, ...] = (str,)) -> list[Any]:
        """A non-empty list of at most max_texts texts (or a str for one), each at most max_chars
        characters, without NUL or lone surrogates; 400 naming the text otherwise."""
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
            text = t.get("text") if isinstance(t, dict) and dict in kinds else t
            if not isinstance(text, str):
                raise ApiError(400, f"{key}[{i}] must be a string, got {type(text).__name__}")
            self._within(f"{key}[{i}]", [text])
        return texts

    def _within(self, what: str, strings: Sequence[str]) -> None:
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
        limit = self.opts.timeout
        return ApiError(504, f"the translation took longer than this server's limit of {limit:g} s")

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

    async def _run(
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
            for j in (
                jobs
            ):  # queued: dropped; in a running search: ended at its next step (nmt.serve.stream)
                j.abandoned = not j.future.cancel()
        if results in done:
            return results.result()
        results.cancel()
        if gone in done:
            raise ApiError(499, "the client went away")
        raise self.late()

    def _jobs(
        self, model: Model, key: tuple[Any, ...], items: list[Any], texts: list[str]
    ) -> list[Job]:
        encode = model.translator.loaded.tokenizer.encode
        # a sentence with lexical constraints never joins a running search (nmt.serve.stream)
        return [
            Job(
                (*key, not (isinstance(item, Request) and item.asks())),
                item,
                tokens=len(encode(text)) + 1,
                index=i,
                where=f"texts[{i}]",
            )
            for i, (item, text) in enumerate(zip(items, texts, strict=True))
        ]

    # ------------------------------------------------------------------ nmt's API

    async def translate(self, request: Any) -> Any:
        p = await self._payload(request)
        deadline = self.deadline()
        asked = await self.off_loop(deadline, self._asked, p)
        results = await self._run(request, asked.model, asked.jobs, deadline)
        return await self.off_loop(deadline, _rendered, asked, results)

    def _asked(self, p: dict[str, Any]) -> Asked:
        """The request `p` of /v1/translate checked and cut into jobs (400 naming what is wrong)."""
        model = self._model(p.get("model"))
        if unknown := sorted(set(p) - V1_KEYS - set(DECODE_OPTIONS)):
            raise ApiError(
                400,
                f"unknown field {unknown[0]!r}: fields are "
                f"{', '.join(sorted(V1_KEYS | set(DECODE_OPTIONS)))}",
            )
        texts = self._texts(p.get("texts"), "texts", (str, dict))
        nbest = _typed(p, "nbest", int, 1)
        align = _typed(p, "alignment", bool, False)
        attend = _typed(p, "attention", bool, False)
        lang = model.translator.loaded.tokenizer.language_token(
            p.get("target_lang"), '"target_lang"'
        )
        terminology = self._terminology(p.get("terminology"))
        overrides = {
            k: coerce_option(DecodeConfig, k, p[k], "the request", f'"{k}"')
            for k in DECODE_OPTIONS
            if k in p
        }
        if overrides.get("beam", 0) > max(
            self.opts.max_beam, model.translator.decode.beam
        ):  # its memory
            raise ApiError(
                400,
                f'"beam" {overrides["beam"]} is more than this server\'s limit of '
                f"{self.opts.max_beam}",
            )
        settings, tr = model.variant(overrides, nbest)
        texts = [
            {"text": t} if isinstance(t, str) else t for t in texts
        ]  # a str is a request of its text alone
        for i, t in enumerate(texts):
            if set(t) - set(JSON_KEYS):
                raise ApiError(
                    400,
                    f"texts[{i}]: unknown key {sorted(set(t) - set(JSON_KEYS))[0]!r}: keys are "
                    f"{', '.join(JSON_KEYS)}",
                )
        requests = [self._request(t, f"texts[{i}]") for i, t in enumerate(texts)]
        requests = [with_terms(r, terminology) for r in requests]
        key = ("translate", *settings, align or attend, lang)
        jobs = self._jobs(model, key, requests, [r.text for r in requests])
        if align or attend:
            self._attention_within(jobs, tr, nbest, "attention" if attend else "alignment")
        return Asked(model, requests, jobs, align, attend)

    def _request(self, fields: dict[str, Any], where: str) -> Request:
        """A text's request (nmt.terminology.Request checks its types), its phrases and its prefix
        each within --max-chars."""
        request = Request(**fields, where=where, json_keys=True)
        for key, phrases in (
            ("constraints", request.constraints),
            ("avoid", request.avoid),
            ("prefix", [request.prefix]),
        ):
            self._within(f'{where}: "{key}"', phrases)
        return request

    def _terminology(self, terms: Any) -> Terminology | None:
        """A request's "terminology" (source term: target term), its terms within --max-chars
        together, each checked as a file's are (nmt.terminology.check_pair: an empty source
        term would match every text); 400 naming the term."""
        if terms is None:
            return None
        if not isinstance(terms, dict) or not all(
            isinstance(x, str) for kv in terms.items() for x in kv
        ):
            raise ApiError(
                400, '"terminology" must be an object of source term: target term strings'
            )
        self._within('"terminology"', [x for kv in terms.items() for x in kv])
        return terminology_from_pairs(list(terms.items()), '"terminology"') if terms else None

    def _attention_within(self, jobs: list[Job], tr: Translator, nbest: int, what: str) -> None:
        """400 where the attention weights of the answer (target x source tokens of each
        hypothesis, its target at its length limit) could be more than --max-attention: 4.9 KB of
        request asked for a 133 MB answer and 2.3 GB of memory, past every deadline."""
        limit = self.opts.max_attention  # (B,)
        sources = torch.tensor([j.tokens for j in jobs])
        src = (
            torch.arange(int(sources.max()))[None, :] < sources[:, None]
        ).long()  # (B, S): 1 a token, 0 padding
        targets = max_output_lengths(src, tr.decode, 0, tr.loaded.max_positions)  # (B,)
        weights = nbest * int(
            ((targets + 1) * sources).sum()
        )  # rows and columns: the target's EOS, the source's
        if weights > limit:
            raise ApiError(
                400,
                f'"{what}" of these texts may need {weights:,} attention weights '
                "(target x source tokens of each hypothesis at its length limit), more "
                f"than this server's limit of {limit:,} (--max-attention)",
            )

    async def score(self, request: Any) -> Any:
        p = await self._payload(request)
        deadline = self.deadline()
        model, jobs = await self.off_loop(deadline, self._score_jobs, p)
        scores = await self._run(request, model, jobs, deadline)
        return {"model": model.name, "scores": [number(s) for s in scores]}

    def _score_jobs(self, p: dict[str, Any]) -> tuple[Model, list[Job]]:
        model = self._model(p.get("model"))
        if unknown := sorted(set(p) - SCORE_KEYS):
            raise ApiError(
                400, f"unknown field {unknown[0]!r}: fields are {', '.join(sorted(SCORE_KEYS))}"
            )
        sources = self._texts(p.get("sources"), "sources")
        targets = self._texts(p.get("targets"), "targets")
        if len(sources) != len(targets):
            raise ApiError(400, f'{len(sources)} "sources" but {len(targets)} "targets"')
        key = ("score", _typed(p, "normalize", bool, False), 0, False, None)
        return model, self._jobs(model, key, list(zip(sources, targets, strict=True)), sources)

    def models_info(self) -> list[dict[str, Any]]:
        return [
            {
                "name": m.name,
                "source": m.source,
                "target": m.target,
                "targets": m.targets,
                "decode": {k: getattr(m.translator.decode, k) for k in DECODE_OPTIONS},
                "api_key_required": bool(self.keys),
            }
            for m in self.models.values()
        ]

    # ------------------------------------------------------------------ the application

    def app(self) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.middleware import Middleware
        from starlette.responses import HTMLResponse, JSONResponse, Response
        from starlette.routing import Route

        from nmt.serve import libretranslate  # which uses this module

        files = resources.files("nmt.serve")
        page = files.joinpath("page.html").read_text("utf-8")
        spec = files.joinpath("openapi.json").read_bytes()

        def endpoint(
            name: str, answer: Callable[[Any], Awaitable[Any] | Any]
        ) -> Callable[[Any], Awaitable[Any]]:
            async def handle(request: Any) -> Any:
                start = time.perf_counter()
                status = 200
                headers = {}
                try:
                    body = answer(request)
                    body = await body if asyncio.iscoroutine(body) else body
                except ApiError as e:
                    status = e.status
                    body = {"error": str(e)}
                    headers = e.headers
                except NmtError as e:
                    status = 400
                    body = {"error": one_line(e, 500)}
                except Exception as e:  # a bug: logged with its traceback, never sent
                    from starlette.requests import ClientDisconnect

                    status, body = (
                        (499, None)
                        if isinstance(e, ClientDisconnect)
                        else (500, {"error": "internal error"})
                    )
                    if status == 500:
                        log.exception("%s %s", request.method, request.url.path)
                if status >= 400 and isinstance(
                    body, dict
                ):  # a lone surrogate the error echoes: escaped, never a 500
                    body["error"] = (
                        body["error"].encode("utf-8", "backslashreplace").decode("utf-8")
                    )
                self.requests.labels(name, str(status)).inc()
                self.latency.labels(name).observe(time.perf_counter() - start)
                if isinstance(body, Response):  # rendered off the event loop (`_rendered`)
                    return body
                return JSONResponse(body, status_code=status, headers=headers)

            return handle

        def ready(_: Any) -> Any:
            if self.stopping():
                raise ApiError(503, "stopping")
            return {"status": "ready"}

        routes = [
            Route("/", lambda _: HTMLResponse(page, headers=PAGE_HEADERS)),
            Route("/openapi.json", lambda _: Response(spec, media_type="application/json")),
            Route("/health", endpoint("health", lambda _: {"status": "ok"})),
            Route("/ready", endpoint("ready", ready)),
            Route(
                "/metrics",
                lambda _: Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST),
            ),
            Route("/v1/models", endpoint("models", lambda _: {"models": self.models_info()})),
            Route("/v1/translate", endpoint("translate", self.translate), methods=["POST"]),
            Route("/v1/score", endpoint("score", self.score), methods=["POST"]),
            Route(
                "/languages", endpoint("languages", lambda _: libretranslate.languages(self.models))
            ),
            Route(
                "/translate",
                endpoint("libretranslate", partial(libretranslate.translate, self)),
                methods=["POST"],
            ),
        ]
        middleware = (
            [
                Middleware(
                    _json_cors(),
                    allow_origins=self.opts.cors_origins,
                    allow_methods=["GET", "POST"],
                    allow_headers=["*"],
                )
            ]
            if self.opts.cors_origins
            else []
        )

        async def http_error(request: Any, exc: Any) -> Any:
            return JSONResponse(
                {"error": exc.detail}, status_code=exc.status_code, headers=exc.headers
            )

        app = Starlette(
            routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error}
        )
        app.router.redirect_slashes = (
            False  # /health/ is 404, not a redirect to the Host the client named
        )
        return app


CSP = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
# the page is never shown inside another site's frame (clickjacking): frame-ancestors, and
# X-Frame-Options for browsers older than it
PAGE_HEADERS = {
    "Content-Security-Policy": f"{CSP}; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
}


def _json_cors() -> Any:
    """Starlette's CORS middleware, whose refused preflight (an origin, method or header not
    allowed) is a JSON error like every other error of the server, not plain text."""
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import JSONResponse

    class JsonCors(CORSMiddleware):
        def preflight_response(self, request_headers: Any) -> Any:
            response = super().preflight_response(request_headers)
            if response.status_code < 400:
                return response
            headers = {
                k: v
                for k, v in response.headers.items()
                if k not in ("content-length", "content-type")
            }
            error = bytes(response.body).decode()  # "Disallowed CORS origin"
            return JSONResponse({"error": error}, response.status_code, headers)

    return JsonCors


def _parsed(body: bytes, kind: str, content_type: str, form: bool) -> Any:
    """A request body of content type `kind` (`content_type` in full) as Python values: on a
    thread (`Service._payload`), as a megabyte of JSON takes the event loop's time otherwise."""
    try:
        if kind == "application/x-www-form-urlencoded" or (
            form and not body
        ):  # raw UTF-8 as Werkzeug takes it
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
