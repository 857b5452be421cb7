"""`nmt serve` under hostile clients, below the requests: heads that never end or never arrive,
connections that hold every file, requests nobody waits for any more, and stopping with
requests in flight (SIGTERM, Ctrl-C twice). Real server processes on loopback ports
(tests/serving.py), on torch and on CTranslate2 (the `engine` fixture); the batch path's early
ends in process."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip(
    "starlette", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)
pytest.importorskip(
    "uvicorn", reason="nmt serve's extra is not installed: pip install 'nmt[serve]'"
)

from serving import ROOT, Server, slow_on_ctranslate2  # noqa: E402

from nmt import Translator  # noqa: E402
from nmt.serve.batching import Job  # noqa: E402
from nmt.serve.model import JobKey, Model  # noqa: E402
from nmt.terminology import Request  # noqa: E402

HEAD_LIMIT = 4096
CONNECTIONS = 4
STOPPED = {"error": "the server stopped before this request was answered; retry"}
LONG = "a dog and a cat and " * 20


@pytest.fixture(scope="module")
def server(engine, trained_checkpoint):
    with Server(
        *engine.args,
        "--model",
        f"en-de={trained_checkpoint}",
        "--head-timeout",
        "2",
        "--max-head-bytes",
        str(HEAD_LIMIT),
        "--max-connections",
        str(CONNECTIONS),
    ) as s:
        yield s


def connect(s: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.port), timeout=120)


def answer(sock: socket.socket) -> bytes:
    """All the server sends until it closes (a reset ends it too), then `sock` is closed."""
    data = b""
    try:
        while more := sock.recv(65536):
            data += more
    except ConnectionResetError:
        pass
    sock.close()
    return data


def error_of(data: bytes) -> tuple[int, dict]:
    """(status, JSON error) of an answer read whole."""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def send_until_refused(sock: socket.socket, chunks: int, chunk: bytes) -> None:
    try:
        for _ in range(chunks):
            sock.sendall(chunk)
    except OSError:  # the server answered and closed: the rest is not read
        pass


def healthy(s: Server) -> None:
    """Until /health answers 200 (connections the server closed are gone), for at most 60 s."""
    deadline = time.monotonic() + 60
    while s.get("/health")[0] != 200:
        assert time.monotonic() < deadline, "the server never served /health again"
        time.sleep(0.1)


# ------------------------------------------------------------------ heads and connections


def test_a_head_over_the_limit_is_431_whether_it_comes_in_pieces_or_at_once(server):
    """uvicorn's httptools parser kept every byte of an endless header (310 MB -> 3.3 GB for
    one connection): the head is bounded, in header lines, in one header, in the URL."""
    too_large = (
        431,
        {
            "error": f"the request head (request line and headers) is larger than this server's "
            f"limit of {HEAD_LIMIT} bytes"
        },
    )
    lines = connect(server)
    lines.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    send_until_refused(lines, 100_000, b"X-Line: " + b"a" * 90 + b"\r\n")  # ~10 MB offered
    assert error_of(answer(lines)) == too_large
    url = connect(server)
    send_until_refused(url, 100_000, b"GET /" + b"a" * 100)
    assert error_of(answer(url)) == too_large
    whole = connect(server)  # a complete head in one read, parsed before any bound was reached
    whole.sendall(
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2 * HEAD_LIMIT + b"\r\n\r\n"
    )
    assert error_of(answer(whole)) == too_large
    healthy(server)
    assert server.get("/health", headers={"X-Fits": "a" * (HEAD_LIMIT // 2)})[0] == 200


@slow_on_ctranslate2
def test_a_head_that_does_not_arrive_in_time_is_408_slowloris_or_silent(server):
    healthy(server)
    slow = connect(server)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    silent = connect(server)
    deadline = time.monotonic() + 60
    try:  # a header line every 0.2 s, for ever: the head's clock does not restart with each
        while time.monotonic() < deadline:
            slow.sendall(b"X-Slow: a\r\n")
            time.sleep(0.2)
    except OSError:
        pass
    late = (408, {"error": "the request head did not arrive within 2 s"})
    assert error_of(answer(slow)) == late
    assert error_of(answer(silent)) == late


@slow_on_ctranslate2
def test_silent_connections_past_the_limit_cannot_lock_new_clients_out(server):
    """1,000 silent sockets held every file of a 1,000-file limit: past --max-connections a
    connection is answered 503 at once, and the silent ones are closed at the head timeout."""
    healthy(server)
    silent = [connect(server) for _ in range(CONNECTIONS)]
    deadline = time.monotonic() + 60
    while True:  # the server has accepted them all
        extra = connect(server)
        status, error = error_of(answer(extra))
        if status == 503:
            break
        assert time.monotonic() < deadline, (status, error)
    assert error == {
        "error": f"this server has {CONNECTIONS} connections open, its limit; retry later"
    }
    assert [error_of(answer(s))[0] for s in silent] == [408] * CONNECTIONS
    healthy(server)


def test_an_invalid_request_is_a_json_400(server):
    healthy(server)
    bad = connect(server)
    bad.sendall(b"NOT HTTP\r\n\r\n")
    assert error_of(answer(bad)) == (400, {"error": "invalid HTTP request"})


# ------------------------------------------------------------------ requests nobody waits for


class LateJob(Job):
    """A job whose request stops waiting after `steps` decoding steps (reads of `abandoned`)."""

    steps = 3
    reads = 0

    @property  # type: ignore[override]
    def abandoned(self) -> bool:
        self.reads += 1
        return self.reads > self.steps

    @abandoned.setter
    def abandoned(self, value: bool) -> None:
        pass


# torch only: CTranslate2's beam search cannot be stopped; it decodes such a sentence to its end
@pytest.mark.parametrize(
    ("overrides", "first"),
    [({}, LONG), ({}, Request(LONG, constraints=("Hund",))), ({"sampling": True, "seed": 1}, LONG)],
    ids=["beam", "constraints", "sampling"],
)
def test_a_batch_ends_the_sentences_nobody_waits_for_at_their_next_step(
    trained_checkpoint, overrides, first
):
    """A request answered 504 (or whose client went away) kept its batch decoding to the end
    with sampling, constraints or --no-continuous; later clients got 504 too, and SIGTERM
    waited for it. Its sentences now end at their search's next step; the others' are whole."""
    translator = Translator.load(trained_checkpoint, device="cpu", engine="torch")
    model = Model("en-de", translator, "en", "de", continuous=False)
    key = JobKey.translation(overrides, 1, attend=False, lang=None)
    tr = model.variant(key)
    whole = [h[0].text for h in tr.translate_nbest([first, "A dog runs."])]
    assert len(whole[0].split()) > 2 * LateJob.steps, whole  # long enough to be cut

    # sampling decodes one sentence a call: the second is sentence 1 of its request's generators
    jobs = [LateJob(key, first, tokens=1), Job(key, "A dog runs.", tokens=1, index=1)]
    got = [hyps[0].text for hyps in model.decode(key, jobs)]
    assert len(got[0].split()) <= LateJob.steps + 1 < len(whole[0].split())
    assert got[1] == whole[1]


@slow_on_ctranslate2
def test_504s_and_clients_gone_log_nothing_and_health_slash_redirects_nowhere(
    engine, trained_checkpoint, monkeypatch
):
    """Every 504 or disconnect logged `ERROR asyncio _GatheringFuture exception was never
    retrieved`; `/health/` redirected to the Host the client named. Also: a lone search's
    OpenMP threads spin briefly, then sleep (GOMP_SPINCOUNT=10000), unless the environment says."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with Server(
        *engine.args,
        "--model",
        f"en-de={trained_checkpoint}",
        "--max-wait-ms",
        "8000",
        "--timeout",
        "1",
        env={"OMP_DISPLAY_ENV": "VERBOSE"},
    ) as s:
        assert s.post("/v1/translate", {"texts": ["A dog."]})[0] == 504
        body = json.dumps({"texts": ["A cat."]}).encode()
        gone = connect(s)
        gone.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.3)
        gone.close()
        other = connect(s)
        other.sendall(b"GET /health/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        redirected = answer(other)
        assert s.post("/v1/translate", {"texts": ["A dog."]})[0] == 504
        code, err = s.stop()
    assert (
        error_of(redirected) == (404, {"error": "Not Found"}) and b"evil.example" not in redirected
    )
    assert code == 0 and "never retrieved" not in err and "Traceback" not in err, err
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in err and "GOMP_SPINCOUNT = '10000'" in err, err


# ------------------------------------------------------------------ stopping


@slow_on_ctranslate2
def test_sigterm_drains_within_the_drain_timeout_and_exits(engine, trained_checkpoint):
    """SIGTERM with requests in flight that would run long (here, held 60 s for company) left
    the process running: those still running after --drain-timeout are answered 503, and it
    exits 0. The environment's OpenMP wait policy is kept."""
    s = Server(
        *engine.args,
        "--model",
        f"en-de={trained_checkpoint}",
        "--max-wait-ms",
        "60000",
        "--drain-timeout",
        "1",
        env={"OMP_DISPLAY_ENV": "VERBOSE", "OMP_WAIT_POLICY": "PASSIVE"},
    )
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(s.post, "/v1/translate", {"texts": ["A dog."]}) for _ in range(2)]
        wait_for_queue(s, 2)
        code, err = s.stop(signal.SIGTERM, timeout=50)  # within the 60 s the batch is held
        got = [f.result(120)[:2] for f in answers]
    assert code == 0, err
    assert got == [(503, STOPPED)] * 2
    assert "Traceback" not in err and "never retrieved" not in err, err
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in err and "GOMP_SPINCOUNT = '0'" in err, err


@slow_on_ctranslate2
def test_a_second_ctrl_c_answers_what_is_in_flight_503_without_a_traceback(
    engine, trained_checkpoint
):
    """With requests in flight, a second Ctrl-C gave plain-text 500s and a traceback each; a
    single Ctrl-C exits 130 (as every command interrupted) once it has answered them."""
    s = Server(*engine.args, "--model", f"en-de={trained_checkpoint}", "--max-wait-ms", "60000")
    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(s.post, "/v1/translate", {"texts": ["A dog."]}) for _ in range(4)]
        wait_for_queue(s, 4)
        s.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while s.get("/health", timeout=5)[0] != 0:  # stopped accepting: the first Ctrl-C was taken
            assert time.monotonic() < deadline, "the server never stopped accepting"
            time.sleep(0.05)
        code, err = s.stop(signal.SIGINT, timeout=50)
        got = [f.result(120)[:2] for f in answers]
    assert code == 130 and "nmt: interrupted" in err, err
    assert got == [(503, STOPPED)] * 4
    assert (
        "Traceback" not in err and "Exception in ASGI" not in err and "never retrieved" not in err
    ), err


def wait_for_queue(s: Server, sentences: int) -> None:
    """Until the server's queue holds `sentences` (its metrics say), for at most 60 s."""
    deadline = time.monotonic() + 60
    while f'nmt_queue_sentences{{model="en-de"}} {sentences}.0' not in s.get("/metrics")[1]:
        assert time.monotonic() < deadline, f"the queue never held {sentences} sentences"
        time.sleep(0.02)


@slow_on_ctranslate2
def test_more_connections_than_the_process_may_open_files_for_is_one_line(
    engine, trained_checkpoint
):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit of open files here")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt",
            "serve",
            *engine.args,
            "-c",
            str(trained_checkpoint),
            "--port",
            "0",
            "--max-connections",
            str(hard),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.strip().splitlines() == [
        f"nmt: error: --max-connections {hard} needs {hard + 256} open files, and this process may "
        f"open at most {hard} (ulimit -Hn): lower --max-connections"
    ]
