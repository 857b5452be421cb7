"""The `nmt serve` command: load and warm up the models, bind, run uvicorn until SIGTERM or
Ctrl-C (which stop accepting and answer what is in flight first, for at most --drain-timeout
seconds; a second Ctrl-C stops at once)."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
from pathlib import Path

from nmt.api import LOAD_OPTIONS, Translator
from nmt.atomic import read_regular
from nmt.errors import NmtError, one_line
from nmt.fields import check_bounds, flag
from nmt.options import ServeOptions, TranslateOptions
from nmt.serve.app import Service
from nmt.serve.batching import TORCH
from nmt.serve.model import Model

log = logging.getLogger(__name__)
INSTALL = (
    "nmt serve needs its web stack and sentence splitter: pip install 'nmt[serve]' (or pip "
    "install starlette uvicorn prometheus-client sentencex)"
)
WARM_UP = "A warm-up sentence."


def model_specs(opts: ServeOptions) -> list[tuple[str | None, list[Path]]]:
    """(name or None, checkpoints) of each model to serve: -c's one (an ensemble if several), or
    each --model's."""
    if opts.checkpoints and opts.models:
        raise NmtError("give either -c (one model) or --model NAME=CHECKPOINT, not both")
    specs: list[tuple[str | None, list[Path]]] = (
        [(None, opts.checkpoints)] if opts.checkpoints else []
    )
    for spec in opts.models:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise NmtError(f"--model must be NAME=CHECKPOINT, got {spec!r}")
        if name in [n for n, _ in specs]:
            raise NmtError(f"--model {name}: given twice")
        specs.append((name, [Path(path)]))
    if not specs:
        raise NmtError(
            "nmt serve needs a checkpoint: -c CHECKPOINT, or --model NAME=CHECKPOINT (repeatable)"
        )
    return specs


def load_models(specs: list[tuple[str | None, list[Path]]], opts: ServeOptions) -> dict[str, Model]:
    """The models, loaded weights-only as everywhere, each warmed up with one batch. A NAME like
    en-de gives a model its languages; else its config's data.source_lang / target_lang do."""
    load = {
        k: getattr(opts, k) for k in ("decode", *LOAD_OPTIONS)
    }  # ServeOptions has `nmt translate`'s
    models: dict[str, Model] = {}
    for name, paths in specs:
        tr = Translator.from_options(TranslateOptions(checkpoints=paths, **load))
        data = tr.loaded.config.data
        pair = (
            name.split("-")
            if name and name.count("-") == 1
            else [data.source_lang, data.target_lang]
        )
        name = name or ("-".join(pair) if all(pair) else "default")
        tr.translate([WARM_UP])
        models[name] = Model(name, tr, pair[0], pair[1], continuous=opts.continuous)
    return models


def _bind(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        # inherited by each connection: an answer's headers and body go out at once, not 40 ms
        # apart (Nagle's algorithm waiting on the client's delayed acknowledgement)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except OSError as e:
        raise NmtError(f"cannot listen on {host}:{port}: {one_line(e)}") from None


def serve(opts: ServeOptions) -> None:
    try:
        import prometheus_client  # noqa: F401
        import sentencex  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise NmtError(INSTALL) from None
    check_bounds(opts, flag)
    specs = model_specs(opts)
    keys = []
    if opts.api_keys is not None:
        try:
            lines = (
                read_regular(opts.api_keys, "the API keys", 1 << 20)
                .decode("utf-8-sig", "replace")
                .splitlines()
            )
        except FileNotFoundError:
            raise NmtError(f"--api-keys {opts.api_keys}: no such file") from None
        # a UTF-8 BOM is no part of the first key; an indented "# old-key" is a comment, not a key
        if not (keys := [k.encode() for k in map(str.strip, lines) if k and not k.startswith("#")]):
            raise NmtError(f"{opts.api_keys}: no API key in it (one a line)")
    if not keys and not _loopback(opts.host):
        log.warning(
            "serving on %s without --api-keys: anyone who can reach it can use it", opts.host
        )
    from nmt.serve.connections import connection_class, guarded, open_files_for

    open_files_for(opts)
    sock = _bind(opts.host, opts.port)
    service = Service(TORCH.submit(load_models, specs, opts).result(), opts, keys)
    # h11, not httptools: h11 bounds the head it buffers (nmt.serve.connections)
    config = uvicorn.Config(
        guarded(service.app(), opts),
        http=connection_class(opts),
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=opts.drain_timeout,
        access_log=False,
        h11_max_incomplete_event_size=opts.max_head_bytes,
    )
    server = uvicorn.Server(config)
    service.stopping = lambda: server.should_exit
    host, port = sock.getsockname()[:2]
    print(
        f"nmt serve: http://{f'[{host}]' if ':' in host else host}:{port}/ "
        f"({', '.join(service.models)})",
        flush=True,
    )
    previous = signal.signal(
        signal.SIGTERM, lambda *_: None
    )  # uvicorn raises it again once it has stopped
    try:
        server.run(sockets=[sock])  # SIGTERM or Ctrl-C: stop accepting, answer what is in flight
    finally:
        signal.signal(signal.SIGTERM, previous)
        service.close()
        sys.stdout.flush()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
