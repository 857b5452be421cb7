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
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Any, cast
from urllib.parse import parse_qsl

import torch

from nmt.api import DECODE_OPTIONS, Translation, Translator
from nmt.config import DecodeConfig
from nmt.decoding.alignment import layer_count, resolve_layer
from nmt.decoding.predict import decode_config, decode_workers
from nmt.errors import NmtError, one_line
from nmt.fields import coerce, coerce_option
from nmt.options import ServeOptions
from nmt.serve.batching import Batcher, Job
from nmt.serve.stream import Stream, can_stream
from nmt.terminology import JSON_KEYS, Request, terminology_from_pairs, with_terms

log = logging.getLogger(__name__)
V1_KEYS = {"model", "texts", "nbest", "alignment", "attention", "target_lang", "terminology", "api_key"}
SCORE_KEYS = {"model", "sources", "targets", "normalize", "api_key"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


@dataclass(eq=False)
class Model:
    """A served checkpoint: its translator, languages, queue, and its translators of other decode settings."""

    name: str
    translator: Translator
    source: str
    target: str
    batcher: Batcher | None = None
    continuous: bool = True  # sentences join a running search where they can (--no-continuous: batches)
    threads: tuple[int, int] = (1, 1)  # torch threads of a running search, with others and alone (nmt.serve.stream)
    variants: dict[Hashable, Translator] = field(default_factory=dict)

    @property
    def targets(self) -> list[str]:
        tokens = [t[2:-2] for t in self.translator.loaded.tokenizer.language_tokens()]
        return sorted({self.target, *tokens} - {""})

    def variant(self, overrides: dict[str, Any], nbest: int) -> tuple[tuple[Any, ...], Translator]:
        """The translator of these decode settings over the served ones (checked; 400 if wrong)."""
        key = (tuple(sorted(overrides.items())), nbest)
        if key not in self.variants:
            base = self.translator
            cfg = decode_config(base.decode, overrides, nbest, vocab_size=base.loaded.tokenizer.vocab_size,
                                option=lambda k: f'"{k}"')
            if len(self.variants) >= 64:  # each request its own settings: keep the 64 latest
                self.variants.pop(next(iter(self.variants)))
            self.variants[key] = tr = copy.copy(base)  # the served one (model, options, terminology)
            tr.decode = cfg
        return key, self.variants[key]

    def translator_of(self, settings: tuple[Any, ...], nbest: int) -> Translator:
        """The translator of a job key's settings (made again if `variant` dropped it from its 64)."""
        return self.variants.get((settings, nbest)) or self.variant(dict(settings), nbest)[1]

    def stream(self, key: Any) -> Stream | None:
        """The batcher's `stream` (continuous batching, nmt.serve.stream) for a key whose sentences can join one."""
        kind, settings, nbest, attend, lang, plain = key
        if kind != "translate" or not plain or not self.continuous:
            return None
        tr = self.translator_of(settings, nbest)
        return Stream(tr, nbest, attend, lang, self.threads) if can_stream(tr) else None

    def decode(self, key: Any, jobs: list[Job]) -> list[Any]:
        """The worker's decode function (nmt.serve.batching): the results of a batch of one key."""
        kind, settings, nbest, attend, lang, _ = key
        if kind == "score":
            return self.translator.score([j.item[0] for j in jobs], [j.item[1] for j in jobs], normalize=settings)
        tr = self.translator_of(settings, nbest)
        if tr.decode.sampling:  # a sentence's generator is its index in its request: one at a time
            return [tr.translate_nbest([j.item], nbest, where=[j.where].__getitem__, first_index=j.index,
                                       alignment=attend, attention=attend, target_lang=lang)[0] for j in jobs]
        # cut into the command's batches (decode.batch_size), one per CPU worker: a batch of at
        # most batch_size runs whole on every thread, faster than cut in halves (docs/benchmarks.md)
        return tr.translate_nbest([j.item for j in jobs], nbest, where=lambda i: jobs[i].where,
                                  alignment=attend, attention=attend, target_lang=lang)


def _spans(pieces: list[str], text: str) -> list[list[int] | None]:
    """Where each sentencepiece piece is in `text`: [start, end) character offsets, None for a
    piece not found in order (a language token, EOS, a character normalization changed)."""
    out, pos = [], 0
    for piece in pieces:
        surface = piece.replace("\u2581", " ").strip()
        start = text.find(surface, pos) if surface else -1
        out.append([start, start + len(surface)] if start >= 0 else None)
        pos = start + len(surface) if start >= 0 else pos
    return out


def _number(x: float) -> float | None:
    return round(x, 6) if x == x and abs(x) != float("inf") else None  # JSON has no infinity


def _hypothesis(t: Translation, source: str, alignment: bool, attention: bool, layer: int) -> dict[str, Any]:
    out: dict[str, Any] = {"text": t.text, "score": _number(t.score), "logprob": _number(t.logprob)}
    if t.attention is not None and (alignment or attention):
        src, tgt = _spans(t.attention.source, source), _spans(t.attention.target, t.text)
        if alignment:
            out["alignment"] = [{"source": src[i], "target": tgt[j]} for i, j in t.alignment or []
                                if src[i] and tgt[j]]
        if attention:
            weights = t.attention.weights[layer].mean(0)
            out["attention"] = {"source": t.attention.source, "target": t.attention.target,
                                "weights": [[round(float(w), 4) for w in row] for row in weights]}
    return out


def _typed(payload: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    value = payload.get(key, default)
    return default if value is None else coerce(value, tp, f'"{key}"', "the request", strings=False)


class Service:
    """The served models, the limits and the metrics; `app()` is the ASGI application."""

    def __init__(self, models: dict[str, Model], opts: ServeOptions, keys: list[bytes]):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.models, self.opts, self.keys = models, opts, keys
        self.stopping: Callable[[], bool] = lambda: False
        prometheus_client.disable_created_metrics()  # the _created series: noise for a scraper
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("nmt_requests", "HTTP requests answered", ["endpoint", "status"], registry=reg)
        self.latency = Histogram("nmt_request_seconds", "Time to answer a request", ["endpoint"], registry=reg)
        self.sentences = Counter("nmt_sentences", "Sentences decoded", ["model"], registry=reg)
        self.batches = Histogram("nmt_batch_sentences", "Sentences in a decoded batch (or step of a running search)",
                                 ["model"], registry=reg,
                                 buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        depth = Gauge("nmt_queue_sentences", "Sentences waiting to be decoded", ["model"], registry=reg)
        for name, m in models.items():  # continuous batching: a running search per decode worker (--workers)
            lanes = decode_workers(opts.workers, m.translator.device) if m.continuous else 1
            threads = opts.threads or torch.get_num_threads()
            m.threads = (max(1, threads // lanes), threads)
            m.batcher = Batcher(m.decode, batch_tokens=opts.batch_tokens, max_queue=opts.max_queue,
                                max_wait=opts.max_wait_ms / 1000, on_batch=partial(self._counted, name), name=name,
                                stream=m.stream, lanes=lanes)
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
        limit, chunks = self.opts.max_body_bytes, []
        too_big = ApiError(413, f"the request body is larger than this server's limit of {limit} bytes")
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
            raise ApiError(408, f"the request body did not arrive within {self.opts.read_timeout:g} s") from None
        body, kind = b"".join(chunks), request.headers.get("content-type", "").split(";")[0].strip().lower()
        kind = kind if form else "application/json"
        try:
            if kind == "application/x-www-form-urlencoded" or (form and not body):  # raw UTF-8 as Werkzeug takes it
                data = _fields(parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict"))
            elif kind == "multipart/form-data":
                head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode("latin-1")
                parts = email.message_from_bytes(head + body, policy=email.policy.HTTP).iter_parts()
                data = _fields([(p.get_param("name", header="content-disposition"),
                                 cast(bytes, p.get_payload(decode=True) or b"").decode("utf-8")) for p in parts])
            else:
                data = json.loads(body)
        except UnicodeDecodeError:
            raise ApiError(400, "the request body is not valid UTF-8") from None
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if form and kind != "application/json":  # LibreTranslate reads the query string too (request.values)
            data = {**_fields(parse_qsl(request.url.query, keep_blank_values=True)), **data}
        self._authorize(request, data)
        return data

    def _authorize(self, request: Any, payload: dict[str, Any]) -> None:
        if not self.keys:
            return
        given = payload.get("api_key") or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        given = given.encode("utf-8", "surrogatepass") if isinstance(given, str) else b""  # "\ud800": no key, 403
        if not any([hmac.compare_digest(given, key) for key in self.keys]):  # a list: every key compared
            raise ApiError(403, "Invalid API key")

    def _model(self, name: Any) -> Model:
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not isinstance(name, str) or name not in self.models:
            raise ApiError(400, f'unknown "model" {name!r}: this server has {", ".join(map(repr, self.models))}')
        return self.models[name]

    def _texts(self, value: Any, key: str, kinds: tuple[type, ...] = (str,)) -> list[Any]:
        """A non-empty list of at most max_texts texts (or a str for one), each at most max_chars
        characters, without NUL or lone surrogates; 400 naming the text otherwise."""
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts:
            raise ApiError(400, f'"{key}" must be a string or a non-empty list of strings')
        if len(texts) > self.opts.max_texts:
            raise ApiError(400, f'"{key}" has {len(texts)} texts, more than this server\'s limit of {self.opts.max_texts}')
        for i, t in enumerate(texts):
            text = t.get("text") if isinstance(t, dict) and dict in kinds else t
            if not isinstance(text, str):
                raise ApiError(400, f"{key}[{i}] must be a string, got {type(text).__name__}")
            if len(text) > self.opts.max_chars:
                raise ApiError(400, f"{key}[{i}] has {len(text)} characters, more than this server's limit of "
                               f"{self.opts.max_chars}")
            if re.search("[\0\ud800-\udfff]", text):
                raise ApiError(400, f"{key}[{i}] holds a NUL or a lone surrogate")
        return texts

    async def _run(self, request: Any, model: Model, jobs: list[Job], full: int = 503) -> list[Any]:
        """The jobs' results once decoded: 503 (`full`) when the queue is full, 504 past the
        deadline; a client that goes away has its jobs dropped."""
        assert model.batcher is not None
        if len(jobs) > self.opts.max_queue:  # never accepted: not a "retry later"
            raise ApiError(400, f"{len(jobs)} sentences, more than this server's queue holds ({self.opts.max_queue})")
        if not model.batcher.submit(jobs):
            raise ApiError(full, "Slowdown: the translation queue is full; retry later", {"Retry-After": "1"})
        results = asyncio.gather(*[asyncio.wrap_future(j.future) for j in jobs])
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            waiting: list[asyncio.Future[Any]] = [results, gone]
            done, _ = await asyncio.wait(waiting, timeout=self.opts.timeout, return_when="FIRST_COMPLETED")
        finally:
            gone.cancel()
            for j in jobs:  # queued: dropped; in a running search: ended at its next step (nmt.serve.stream)
                j.abandoned = not j.future.cancel()
        if results in done:
            return results.result()
        results.cancel()
        if gone in done:
            raise ApiError(499, "the client went away")
        raise ApiError(504, f"the translation took longer than this server's limit of {self.opts.timeout:g} s")

    def _jobs(self, model: Model, key: tuple[Any, ...], items: list[Any], texts: list[str]) -> list[Job]:
        encode = model.translator.loaded.tokenizer.encode
        # a sentence with lexical constraints never joins a running search (nmt.serve.stream)
        return [Job((*key, not (isinstance(item, Request) and item.asks())), item, tokens=len(encode(text)) + 1,
                    index=i, where=f"texts[{i}]") for i, (item, text) in enumerate(zip(items, texts, strict=True))]

    # ------------------------------------------------------------------ nmt's API

    async def translate(self, request: Any) -> Any:
        p = await self._payload(request)
        model = self._model(p.get("model"))
        if unknown := sorted(set(p) - V1_KEYS - set(DECODE_OPTIONS)):
            raise ApiError(400, f"unknown field {unknown[0]!r}: fields are {', '.join(sorted(V1_KEYS | set(DECODE_OPTIONS)))}")
        texts = self._texts(p.get("texts"), "texts", (str, dict))
        nbest, align, attend = _typed(p, "nbest", int, 1), _typed(p, "alignment", bool, False), _typed(p, "attention", bool, False)
        lang = model.translator.loaded.tokenizer.language_token(p.get("target_lang"), '"target_lang"')
        terms = p.get("terminology")
        if terms is not None and (not isinstance(terms, dict) or not all(isinstance(x, str) for kv in terms.items() for x in kv)):
            raise ApiError(400, '"terminology" must be an object of source term: target term strings')
        terminology = terminology_from_pairs(list(terms.items())) if terms else None
        overrides = {k: coerce_option(DecodeConfig, k, p[k], "the request", f'"{k}"') for k in DECODE_OPTIONS if k in p}
        if overrides.get("beam", 0) > max(self.opts.max_beam, model.translator.decode.beam):  # its memory
            raise ApiError(400, f'"beam" {overrides["beam"]} is more than this server\'s limit of {self.opts.max_beam}')
        settings, _ = model.variant(overrides, nbest)
        texts = [{"text": t} if isinstance(t, str) else t for t in texts]  # a str is a request of its text alone
        for i, t in enumerate(texts):
            if set(t) - set(JSON_KEYS):
                raise ApiError(400, f"texts[{i}]: unknown key {sorted(set(t) - set(JSON_KEYS))[0]!r}: keys are {', '.join(JSON_KEYS)}")
        requests = [with_terms(Request(**t, where=f"texts[{i}]", json_keys=True), terminology) for i, t in enumerate(texts)]
        key = ("translate", *settings, align or attend, lang)
        results = await self._run(request, model, self._jobs(model, key, requests, [r.text for r in requests]))
        layer = resolve_layer(model.translator.alignment_layer, layer_count(model.translator.loaded.model) or 1)
        return {"model": model.name, "translations": [
            {"text": hyps[0].text if hyps else "",
             "nbest": [_hypothesis(h, r.text, align, attend, layer) for h in hyps]}
            for r, hyps in zip(requests, results, strict=True)]}

    async def score(self, request: Any) -> Any:
        p = await self._payload(request)
        model = self._model(p.get("model"))
        if unknown := sorted(set(p) - SCORE_KEYS):
            raise ApiError(400, f"unknown field {unknown[0]!r}: fields are {', '.join(sorted(SCORE_KEYS))}")
        sources, targets = self._texts(p.get("sources"), "sources"), self._texts(p.get("targets"), "targets")
        if len(sources) != len(targets):
            raise ApiError(400, f'{len(sources)} "sources" but {len(targets)} "targets"')
        key = ("score", _typed(p, "normalize", bool, False), 0, False, None)
        jobs = self._jobs(model, key, list(zip(sources, targets, strict=True)), sources)
        return {"model": model.name, "scores": [_number(s) for s in await self._run(request, model, jobs)]}

    def models_info(self) -> list[dict[str, Any]]:
        return [{"name": m.name, "source": m.source, "target": m.target, "targets": m.targets,
                 "decode": {k: getattr(m.translator.decode, k) for k in DECODE_OPTIONS},
                 "api_key_required": bool(self.keys)} for m in self.models.values()]

    # ------------------------------------------------------------------ the application

    def app(self) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.middleware import Middleware
        from starlette.middleware.cors import CORSMiddleware
        from starlette.responses import HTMLResponse, JSONResponse, Response
        from starlette.routing import Route

        from nmt.serve import libretranslate  # which uses this module
        files = resources.files("nmt.serve")
        page, spec = files.joinpath("page.html").read_text("utf-8"), files.joinpath("openapi.json").read_bytes()

        def endpoint(name: str, answer: Callable[[Any], Awaitable[Any] | Any]) -> Callable[[Any], Awaitable[Any]]:
            async def handle(request: Any) -> Any:
                start, status, headers = time.perf_counter(), 200, {}
                try:
                    body = answer(request)
                    body = await body if asyncio.iscoroutine(body) else body
                except ApiError as e:
                    status, body, headers = e.status, {"error": str(e)}, e.headers
                except NmtError as e:
                    status, body = 400, {"error": one_line(e, 500)}
                except Exception as e:  # a bug: logged with its traceback, never sent
                    from starlette.requests import ClientDisconnect

                    status, body = (499, None) if isinstance(e, ClientDisconnect) else (500, {"error": "internal error"})
                    if status == 500:
                        log.exception("%s %s", request.method, request.url.path)
                if status >= 400 and isinstance(body, dict):  # a lone surrogate the error echoes: escaped, never a 500
                    body["error"] = body["error"].encode("utf-8", "backslashreplace").decode("utf-8")
                self.requests.labels(name, str(status)).inc()
                self.latency.labels(name).observe(time.perf_counter() - start)
                return JSONResponse(body, status_code=status, headers=headers)
            return handle

        def ready(_: Any) -> Any:
            if self.stopping():
                raise ApiError(503, "stopping")
            return {"status": "ready"}

        routes = [Route("/", lambda _: HTMLResponse(page, headers={"Content-Security-Policy": CSP})),
                  Route("/openapi.json", lambda _: Response(spec, media_type="application/json")),
                  Route("/health", endpoint("health", lambda _: {"status": "ok"})),
                  Route("/ready", endpoint("ready", ready)),
                  Route("/metrics", lambda _: Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)),
                  Route("/v1/models", endpoint("models", lambda _: {"models": self.models_info()})),
                  Route("/v1/translate", endpoint("translate", self.translate), methods=["POST"]),
                  Route("/v1/score", endpoint("score", self.score), methods=["POST"]),
                  Route("/languages", endpoint("languages", lambda _: libretranslate.languages(self.models))),
                  Route("/translate", endpoint("libretranslate", partial(libretranslate.translate, self)),
                        methods=["POST"])]
        middleware = [Middleware(CORSMiddleware, allow_origins=self.opts.cors_origins, allow_methods=["GET", "POST"],
                                 allow_headers=["*"])] if self.opts.cors_origins else []

        async def http_error(request: Any, exc: Any) -> Any:
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

        return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error})


CSP = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


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
