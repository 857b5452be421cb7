"""A real `nmt serve` process for the tests: started on a free loopback port (`--port 0`, the
URL read from its first line), ready once `/ready` answers 200, talked to over HTTP. `Engine`:
what a server and its offline references decode with (the `engine` fixture, tests/conftest.py,
gives every server test torch and CTranslate2)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 300  # s: loading and the warm-up batch, on a loaded machine
ENGINES = ("torch", "ctranslate2")  # the `engine` fixture's (tests/conftest.py)
# The CTranslate2 variant of a test that starts servers of its own, waits out a timeout or drives
# a browser runs with the slow tests (`make test-slow`): ~3-18 s each on 2 cores
slow_on_ctranslate2 = pytest.mark.parametrize(
    "engine", ["torch", pytest.param("ctranslate2", marks=pytest.mark.slow)], indirect=True
)


@dataclass(frozen=True)
class Engine:
    """The engine (`--engine`) of a test's server and of the offline translations it is compared
    with; CTranslate2's conversions are kept in `cache`, made once a test session."""

    name: str  # torch or ctranslate2
    cache: Path

    @property
    def args(self) -> tuple[str, ...]:
        """Its options of `nmt serve` and `nmt translate`."""
        return ("--engine", self.name, "--cache-dir", str(self.cache))

    def load(self, checkpoint: Path, **options: Any) -> Any:
        """`Translator.load` of `checkpoint` on the CPU with this engine and `options`."""
        from nmt import Translator

        options.update(engine=self.name, cache_dir=str(self.cache))
        return Translator.load(checkpoint, device="cpu", **options)

    def refusal(self, setting: str) -> str | None:
        """What CTranslate2's one-line refusal of `setting`, a setting only torch decodes
        (nmt/engine.py), says; None on torch."""
        return None if self.name == "torch" else f"engine ctranslate2 cannot honour {setting}"

    def answered(self, status: int, answer: Any, needs: str | None = None) -> bool:
        """Whether a request was answered as this engine answers it: 200, or where it `needs` a
        setting only torch decodes, on CTranslate2 the 400 that names it."""
        refused = self.refusal(needs) if needs else None
        if refused:
            return status == 400 and refused in answer["error"]
        return status == 200


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nmt", "serve", "--port", "0", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        line = ""
        while not line:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.fail("never printed its URL")
            if select.select([self.proc.stdout], [], [], 1)[0]:
                line = self.proc.stdout.readline()  # type: ignore[union-attr]
        self.url = line.split()[2].rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])
        while (
            self.get("/ready")[0] != 200
        ):  # the socket listens before serving: a refused or failed try is retried
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.fail("never got ready")
            time.sleep(0.05)

    def fail(self, what: str) -> None:
        err = self.stop(signal.SIGKILL)[1]
        raise AssertionError(f"nmt serve {what} (exit {self.proc.returncode}): {err}")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, the JSON answer or the text if not JSON, headers); a refused connection is (0,
        None, {})."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text, hdrs = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            status, text, hdrs = e.code, e.read(), dict(e.headers)
        except (ConnectionError, urllib.error.URLError):
            return 0, None, {}
        try:
            return status, json.loads(text), hdrs
        except ValueError:
            return status, text.decode("utf-8", "replace"), hdrs

    def get(self, path: str, **kw: Any) -> tuple[int, Any, dict[str, str]]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any, dict[str, str]]:
        return self.request("POST", path, body, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> tuple[int, str]:
        """Send `sig`; (exit status, stderr) once it has ended (killed after `timeout` s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=60)
            err += f"\n(killed: still running {timeout} s after signal {sig})"
        return self.proc.returncode, err

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop(signal.SIGKILL if exc[0] else signal.SIGTERM)


def translate_offline(ckpt: Path, lines: list[str], *args: str) -> list[str]:
    """`nmt translate -c CKPT ARGS` of `lines` in a child process on one thread: the offline
    translation a served answer must equal."""
    out = subprocess.run(
        [sys.executable, "-m", "nmt", "translate", "-c", str(ckpt), *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


async def asgi_request(
    app: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """One request to the ASGI `app` in this process, as uvicorn hands it over, with exactly these
    headers: (status, headers, the JSON answer or its text). The client stays connected until
    answered."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    delivered = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:  # the body is read: the client waits for its answer, never gone
            await asyncio.Event().wait()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    answer_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]}
    try:
        return start["status"], answer_headers, json.loads(content)
    except ValueError:
        return start["status"], answer_headers, content.decode("utf-8", "replace")


@contextmanager
def in_process(translator: Any, **options: Any) -> Iterator[tuple[Any, Any]]:
    """A Service of the translator as model en-de, with these ServeOptions, and its application
    (no HTTP, no process)."""
    from nmt.options import ServeOptions
    from nmt.serve.app import Service
    from nmt.serve.model import Model

    service = Service(
        {"en-de": Model("en-de", translator, "en", "de")}, ServeOptions(**options), []
    )
    try:
        yield service, service.app()
    finally:
        service.close()
