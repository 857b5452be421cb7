"""What the suites share: the test set and how it is read, peak memory, running a suite as a
child process, and the statistics of repeated timings."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("NMT_MULTI30K") or ROOT.parent / "shared/data/multi30k")
DEMO_CHECKPOINT = ROOT / "runs/m30k_en_de/checkpoint_avg.pt"


# ------------------------------------------------------------------ the test set


def add_test_set_args(p: argparse.ArgumentParser, sentences: int = 0) -> None:
    """Which Multi30k test set, its languages, and how many of its lines (0: all)."""
    p.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k's files (NMT_MULTI30K)")
    p.add_argument("--test", default="test_2016_flickr")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument(
        "--sentences", type=int, default=sentences, help="the first N lines only (0: all)"
    )


def add_decode_args(p: argparse.ArgumentParser, threads: int = 2) -> None:
    """The beam and the torch threads of the decoding suites."""
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=threads)


def test_set_path(data_dir: str | Path, test: str, lang: str) -> Path:
    """`DATA_DIR/TEST.LANG.gz`, or the plain file; a missing one stops the suite."""
    data = Path(data_dir)
    for path in (data / f"{test}.{lang}.gz", data / f"{test}.{lang}"):
        if path.is_file():
            return path
    sys.exit(f"{data}: no {test}.{lang}[.gz] (give --data-dir; scripts/get_multi30k.sh)")


def read_test_set(args: argparse.Namespace, lang: str | None = None) -> list[str]:
    """The lines of the test set `add_test_set_args` names, in `lang` (default: the source),
    the first `--sentences` of them."""
    from nmt.textio import read_lines

    path = test_set_path(args.data_dir, args.test, lang or args.src)
    lines = list(read_lines(path))
    if args.sentences:
        return lines[: args.sentences]
    return lines


# ------------------------------------------------------------------ memory


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children_peak_rss_mb() -> float:
    """The largest peak resident memory of the children waited for so far, in MiB. Linux carries
    a process's own RSS over fork and exec, so a child's figure is at least its parent's at
    the fork: keep the parent small, or have the child report `peak_rss_mb`."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` so far, all its threads, or with `tid` of that
    one thread (/proc; 0 elsewhere, or once the thread has ended)."""
    if tid is None:
        stat = f"/proc/{pid}/stat"
    else:
        stat = f"/proc/{pid}/task/{tid}/stat"
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ child processes


def child_env(threads: int | None = None, nmt_from: str | Path | None = None) -> dict[str, str]:
    """The environment of a suite's child: this checkout importable (and `nmt_from`'s `nmt`
    ahead of it, to time another checkout), OMP_NUM_THREADS set where `threads` is given."""
    paths = [str(nmt_from)] if nmt_from else []
    paths += [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def child_command(suite: str, spec: dict[str, Any]) -> list[str]:
    """The command line that runs `suite` as a child on `spec` (its `--child` option)."""
    return [sys.executable, "-m", "benchmarks", suite, "--child", json.dumps(spec)]


def run_child(
    suite: str,
    spec: dict[str, Any],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    show_stderr: bool = False,
) -> dict[str, Any]:
    """Run `suite` as a fresh process on `spec` and return the JSON object its last line of
    output holds; a failure stops the suite with the child's error."""
    proc = subprocess.run(
        child_command(suite, spec),
        cwd=cwd or ROOT,
        env=env or child_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=None if show_stderr else subprocess.PIPE,
    )
    if proc.returncode:
        error = (proc.stderr or "above").strip()[-2000:]
        raise ChildFailed(f"{suite} child failed ({proc.returncode}): {error}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class ChildFailed(RuntimeError):
    """A suite's child process ended with an error."""


class Worker:
    """A suite's child that stays up: started with `--child SPEC`, it loads, warms up and prints
    one JSON line; then each `run()` sends it a line and returns the JSON line it answers."""

    def __init__(self, suite: str, spec: dict[str, Any], env: dict[str, str]):
        self.suite = suite
        self.proc = subprocess.Popen(
            child_command(suite, spec),
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self.answer()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def answer(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            sys.exit(f"the {self.suite} child failed ({self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def serve_requests(answer: Any) -> None:
    """The child side of `Worker`: print `{"ready": true}`, then for each line on stdin print
    the JSON of `answer()`."""
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(answer()), flush=True)


# ------------------------------------------------------------------ HTTP clients


@dataclass
class ClosedLoop:
    """What `closed_loop` measured: its wall seconds, the latency of each answered request, each
    request's answer (its JSON; None where none came), why the others got none (`timeout`, an
    HTTP status, an error's name: how many), and the CPU seconds of this process meanwhile."""

    seconds: float
    latencies: list[float]
    answers: list[Any]
    failures: dict[str, int] = field(default_factory=dict)
    client_cpu_s: float = 0.0


def closed_loop(
    port: int, requests: list[tuple[str, Any]], n: int, timeout: float = 600.0
) -> ClosedLoop:
    """`n` concurrent clients, threads of this process each with its own keep-alive connection to
    127.0.0.1:`port`, POST the JSON `requests` ((path, body) each), one at a time, each client
    its next once its last is answered, until all are sent. A request with no answer within
    `timeout` seconds (of silence on its socket), one refused, or one answered other than 200
    has None for answer and is counted in `failures`; its client goes on on a new connection."""
    todo = list(enumerate(requests))
    lock = threading.Lock()
    latencies: list[float] = []
    answers: list[Any] = [None] * len(requests)
    failures: dict[str, int] = {}

    def fail(why: str) -> None:
        with lock:
            failures[why] = failures.get(why, 0) + 1

    def client() -> None:
        conn = None
        while True:
            with lock:
                if not todo:
                    break
                i, (path, body) = todo.pop()
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            start = time.perf_counter()
            try:
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:  # TimeoutError is an OSError
                fail("timeout" if isinstance(e, TimeoutError) else type(e).__name__)
                conn.close()
                conn = None
                continue
            if response.status != 200:
                fail(str(response.status))
                continue
            latencies.append(time.perf_counter() - start)
            answers[i] = json.loads(data)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(n)]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ClosedLoop(
        time.perf_counter() - start, latencies, answers, failures, time.process_time() - cpu
    )


# ------------------------------------------------------------------ statistics and output


def percentile(xs: list[float], q: float) -> float:
    """The `q`th percentile of `xs`, the nearest rank."""
    ordered = sorted(xs)
    rank = int(round(q / 100 * (len(ordered) - 1)))
    return ordered[min(len(ordered) - 1, rank)]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float], digits: int = 2) -> str:
    """`min–max` of `xs`, as the pages write a range."""
    return f"{min(xs):.{digits}f}–{max(xs):.{digits}f}"


def write_json(path: str | Path | None, figures: Any) -> None:
    """The suite's figures to `path` ('-': stdout); nothing without a path."""
    if not path:
        return
    text = json.dumps(figures, indent=2, ensure_ascii=False)
    if str(path) == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n", encoding="utf-8")
