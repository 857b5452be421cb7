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
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import resources
from typing import Any

import torch

from nmt.api import DECODE_OPTIONS, Translation, Translator
from nmt.config import DecodeConfig
from nmt.decoding.predict import decode_workers
from nmt.decoding.search import max_output_lengths
from nmt.errors import NmtError, one_line
from nmt.fields import coerce_option
from nmt.options import ServeOptions
from nmt.segment import Segmented
from nmt.serve import libretranslate
from nmt.serve.answers import Asked, answer, number
from nmt.serve.batching import Batcher, Job
from nmt.serve.model import JobKey, Model
from nmt.serve.requests import ApiError, Limits, check_fields, typed
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


def _rendered(asked: Asked, results: list[list[Translation]]) -> Any:
    """The answer of /v1/translate as a response, rendered: on a thread, within the request's
    deadline (`Limits.off_loop`), as its attention weights may be megabytes."""
    from starlette.responses import JSONResponse

    return JSONResponse(answer(asked, results))


class Service:
    """The served models, the limits and the metrics; `app()` is the ASGI application."""

    def __init__(self, models: dict[str, Model], opts: ServeOptions, keys: list[bytes]):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.models = models
        self.opts = opts
        self.limits = Limits(opts, keys)
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
        # a running search (continuous batching), or a CTranslate2 batch, per decode worker
        # (--workers); torch's batches take the one torch thread in turn
        for name, m in models.items():
            at_once = m.continuous or m.translator.engine is not None
            lanes = decode_workers(opts.workers, m.translator.device) if at_once else 1
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

    def _model(self, name: Any) -> Model:
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not isinstance(name, str) or name not in self.models:
            raise ApiError(
                400,
                f'unknown "model" {name!r}: this server has {", ".join(map(repr, self.models))}',
            )
        return self.models[name]

    # ------------------------------------------------------------------ nmt's API

    async def translate(self, request: Any) -> Any:
        p = await self.limits.payload(request)
        deadline = self.limits.deadline()
        asked = await self.limits.off_loop(deadline, self._asked, p)
        results = await self.limits.run(request, asked.model, asked.jobs, deadline)
        return await self.limits.off_loop(deadline, _rendered, asked, results)

    def _asked(self, p: dict[str, Any]) -> Asked:
        """The request `p` of /v1/translate checked and cut into jobs (400 naming what is wrong)."""
        model = self._model(p.get("model"))
        check_fields(p, V1_KEYS | set(DECODE_OPTIONS))
        texts = self.limits.texts(p.get("texts"), "texts", objects=True)
        nbest = typed(p, "nbest", int, 1)
        align = typed(p, "alignment", bool, False)
        attend = typed(p, "attention", bool, False)
        lang = model.translator.loaded.tokenizer.language_token(
            p.get("target_lang"), '"target_lang"'
        )
        terminology = self._terminology(p.get("terminology"))
        overrides = {
            k: coerce_option(DecodeConfig, k, p[k], "the request", f'"{k}"')
            for k in DECODE_OPTIONS
            if k in p
        }
        # a beam's memory
        if overrides.get("beam", 0) > max(self.opts.max_beam, model.translator.decode.beam):
            raise ApiError(
                400,
                f'"beam" {overrides["beam"]} is more than this server\'s limit of '
                f"{self.opts.max_beam}",
            )
        key = JobKey.translation(overrides, nbest, align or attend, lang)
        tr = model.variant(key)
        parts = []
        items: list[Request] = []
        owners = []
        for i, text in enumerate(texts):
            where = f"texts[{i}]"
            # a str is a request of its text alone
            fields = {"text": text} if isinstance(text, str) else text
            r = with_terms(self._request(fields, where), terminology)
            # one matrix of a text's source and target pieces: attention keeps it whole
            whole = r.asks() or attend
            if whole:  # as one sentence: 400 if too long, never the translation of part of it
                _within_model(
                    model,
                    where,
                    model.translator.encode([r.text], None, lang=key.lang)[0],
                    ": a text with constraints, a prefix or attention is translated whole, not "
                    "split",
                )
                part = Segmented(r.text, [(0, len(r.text))], False)
            else:
                part = model.translator.segmented(r.text, key.lang)
            parts.append(part)
            items += [r] if whole else [Request(r.text[a:b]) for a, b in part.spans]
            owners += [i] * len(part.spans)
        jobs = model.jobs(key, items, [item.text for item in items], owners)
        if align or attend:
            self._attention_within(jobs, tr, nbest, "attention" if attend else "alignment")
        return Asked(model, parts, jobs, align, attend)

    def _request(self, fields: dict[str, Any], where: str) -> Request:
        """A text's request (nmt.terminology.Request checks its types), its phrases and its prefix
        each within --max-chars."""
        unknown = sorted(set(fields) - set(JSON_KEYS))
        if unknown:
            raise ApiError(
                400, f"{where}: unknown key {unknown[0]!r}: keys are {', '.join(JSON_KEYS)}"
            )
        request = Request(**fields, where=where, json_keys=True)
        for key, phrases in (
            ("constraints", request.constraints),
            ("avoid", request.avoid),
            ("prefix", [request.prefix]),
        ):
            self.limits.within(f'{where}: "{key}"', phrases)
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
        self.limits.within('"terminology"', [x for kv in terms.items() for x in kv])
        return terminology_from_pairs(list(terms.items()), '"terminology"') if terms else None

    def _attention_within(self, jobs: list[Job], tr: Translator, nbest: int, what: str) -> None:
        """400 where the attention weights of the answer (target x source tokens of each
        hypothesis, its target at its length limit) could be more than --max-attention: 4.9 KB of
        request asked for a 133 MB answer and 2.3 GB of memory, past every deadline."""
        limit = self.opts.max_attention
        sources = torch.tensor([j.tokens for j in jobs])  # (B,): tokens of each source
        targets = max_output_lengths(sources, tr.decode, tr.loaded.max_positions)  # (B,)
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
        p = await self.limits.payload(request)
        deadline = self.limits.deadline()
        model, jobs = await self.limits.off_loop(deadline, self._score_jobs, p)
        scores = await self.limits.run(request, model, jobs, deadline)
        return {"model": model.name, "scores": [number(s) for s in scores]}

    def _score_jobs(self, p: dict[str, Any]) -> tuple[Model, list[Job]]:
        model = self._model(p.get("model"))
        check_fields(p, SCORE_KEYS)
        sources = self.limits.texts(p.get("sources"), "sources")
        targets = self.limits.texts(p.get("targets"), "targets")
        if len(sources) != len(targets):
            raise ApiError(400, f'{len(sources)} "sources" but {len(targets)} "targets"')
        tr = model.translator
        # a pair too long for the model is refused, never scored truncated
        for name, seqs in (
            ("sources", tr.encode(sources, None)),
            ("targets", tr.encode(targets, None, target=True)),
        ):
            for i, seq in enumerate(seqs):
                _within_model(model, f"{name}[{i}]", seq)
        key = JobKey("score", normalize=typed(p, "normalize", bool, False))
        pairs = list(zip(sources, targets, strict=True))
        return model, model.jobs(key, pairs, sources, range(len(pairs)))

    def models_info(self) -> list[dict[str, Any]]:
        return [
            {
                "name": m.name,
                "source": m.source,
                "target": m.target,
                "targets": m.targets,
                "decode": {k: getattr(m.translator.decode, k) for k in DECODE_OPTIONS},
                "api_key_required": bool(self.limits.keys),
            }
            for m in self.models.values()
        ]

    # ------------------------------------------------------------------ the application

    def app(self) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.middleware import Middleware
        from starlette.requests import ClientDisconnect
        from starlette.responses import HTMLResponse, JSONResponse, Response
        from starlette.routing import Route

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
                except ClientDisconnect:
                    status = 499
                    body = None
                except Exception:  # a bug: logged with its traceback, never sent
                    status = 500
                    body = {"error": "internal error"}
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
                endpoint(
                    "libretranslate", partial(libretranslate.translate, self.limits, self.models)
                ),
                methods=["POST"],
            ),
            Route(
                "/detect",
                endpoint("detect", partial(libretranslate.detect, self.limits, self.models)),
                methods=["POST"],
            ),
            Route(
                "/frontend/settings",
                endpoint(
                    "frontend_settings",
                    lambda _: libretranslate.frontend_settings(self.limits, self.models),
                ),
            ),
            # LibreTranslate's description of its API; here nmt's, which holds LibreTranslate's
            Route("/spec", lambda _: Response(spec, media_type="application/json")),
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


def _within_model(model: Model, where: str, tokens: list[int], why: str = "") -> None:
    """400 where `tokens`, the encoded text `where`, are more than the model's maximum."""
    limit = model.translator.loaded.max_positions - 1
    if len(tokens) > limit:
        raise ApiError(
            400,
            f"{where} has {len(tokens)} tokens, more than the model's maximum of {limit}{why}",
        )


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
