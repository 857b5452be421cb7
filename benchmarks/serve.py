"""`nmt serve`: throughput and latency under 1 / 8 / 32 / 128 concurrent clients,
one sentence a request, next to offline translation of the same lines in the same run.

    python -m benchmarks serve --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--threads 2] \\
        [--clients 1,8,32,128] [--device cpu|cuda] [--json FILE]

In order, with nothing else running:
1. offline: `nmt translate` of all the lines in a child process (the command as users run it,
   `--threads`), its translation time (the wall time less that of translating nothing, i.e.
   start-up and loading), and sentences/s;
2. one line alone: each of the first `--alone` lines translated on its own by the API in
   this process (a Translator of the same settings), the p50 of those times: the latency a
   lone request cannot beat;
3. the server: `nmt serve --threads N` on a free port; for each client count, that many
   threads each with its own keep-alive connection send the lines one a request
   (`POST /v1/translate`) until all are translated: sentences/s, p50 / p95 / p99 latency, and
   the cores the server and the client threads used meanwhile (CPU seconds over wall seconds:
   on a 2-core machine the clients take a share of what the server could use), and the mean
   sentences in a decoded batch (the server's /metrics).
   Every answer must equal the offline translation of its line.

The bars (issue 35): with 32 clients at least 0.8x the offline sentences/s; with 1 client a
p50 latency within 1.5x of translating that one line alone. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchmarks.common import (
    DEMO_CHECKPOINT,
    add_test_set_args,
    child_env,
    closed_loop,
    cpu_seconds,
    median,
    percentile,
    read_test_set,
    write_json,
)

START_TIMEOUT = 300  # s: loading and the warm-up batch


class Server:
    """`nmt serve ARGS` on a free loopback port (`--port 0`, the URL read from its first line),
    ready once `/ready` answers 200; stopped when the `with` block ends."""

    def __init__(self, *args: str, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nmt", "serve", "--port", "0", *args],
            env=child_env(threads),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        line = ""
        while not line:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"nmt serve never printed its URL (exit {self.proc.returncode})")
            if select.select([self.proc.stdout], [], [], 1)[0]:
                line = self.proc.stdout.readline()  # type: ignore[union-attr]
        self.url = line.split()[2].rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])
        while self.get("/ready")[0] != 200:  # the socket listens before serving: retried
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"nmt serve never got ready (exit {self.proc.returncode})")
            time.sleep(0.05)

    def get(self, path: str) -> tuple[int, str]:
        """(status, text) of GET `path`; a refused connection is (0, "")."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=120) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")
        except (ConnectionError, urllib.error.URLError):
            return 0, ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def offline(
    ckpt: str, lines: list[str], threads: int, device: str, options: Sequence[str] = ()
) -> tuple[float, list[str]]:
    """(seconds translating, the translations) of `nmt translate [OPTIONS]` on `lines`."""

    def run(text: str) -> tuple[float, str]:
        start = time.perf_counter()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "nmt",
                "translate",
                "-c",
                ckpt,
                "--threads",
                str(threads),
                "--device",
                device,
                *options,
            ],
            input=text,
            capture_output=True,
            text=True,
            check=True,
        )
        return time.perf_counter() - start, out.stdout

    idle, _ = run("")
    total, out = run("\n".join(lines) + "\n")
    return total - idle, out.splitlines()


def alone(ckpt: str, lines: list[str], threads: int, device: str) -> float:
    from nmt import Translator

    tr = Translator.load(ckpt, threads=threads, device=device)
    tr.translate(lines[:2])
    times = []
    for line in lines:
        start = time.perf_counter()
        tr.translate([line])
        times.append(time.perf_counter() - start)
    return median(times)


def batches(server: Server) -> tuple[float, float]:
    """(batches decoded, sentences in them) so far, from the server's /metrics."""
    text = server.get("/metrics")[1]
    count, total = (
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(f"nmt_batch_sentences_{kind}{{")
        )
        for kind in ("count", "sum")
    )
    return count, total


def clients(
    port: int, lines: list[str], n: int, expected: list[str], exact: bool
) -> tuple[float, list[float], float]:
    """(seconds for all lines, each request's latency, CPU seconds the clients used) with `n`
    concurrent keep-alive clients (threads of this process, `closed_loop`); unless `exact`,
    answers that differ from the offline ones (a GPU's float results depend on the batch) are
    counted, not fatal."""
    requests = [("/v1/translate", {"texts": [line]}) for line in lines]
    loop = closed_loop(port, requests, n)
    wrong = [
        i
        for i, answer in enumerate(loop.answers)
        if answer is None or answer["translations"][0]["text"] != expected[i]
    ]
    if wrong and exact:
        raise SystemExit(
            f"{len(wrong)} answers differ from the offline translation, e.g. line {wrong[0]}"
            + (f" (no answer: {loop.failures})" if loop.failures else "")
        )
    if wrong:
        print(
            f"{n} clients: {len(wrong)} of {len(lines)} answers differ from the offline translation"
        )
    return loop.seconds, loop.latencies, loop.client_cpu_s


def add_model_and_test_set(p: argparse.ArgumentParser) -> None:
    """The options of the model, the test set and the threads (this suite's and profile-serve's)."""
    p.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    add_test_set_args(p)
    p.add_argument("--threads", type=int, default=2)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks serve", description=__doc__.split("\n\n")[0]
    )
    add_model_and_test_set(p)
    p.add_argument("--device", default="cpu", help="cpu or cuda (offline, alone and the server)")
    p.add_argument("--clients", default="1,8,32,128")
    p.add_argument("--alone", type=int, default=200, help="lines timed on their own (step 2)")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="nmt serve --max-wait-ms")
    p.add_argument("--workers", type=int, default=0, help="nmt serve --workers (0: one per thread)")
    p.add_argument(
        "--no-continuous",
        action="store_true",
        help="nmt serve --no-continuous (decode whole batches)",
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    lines = read_test_set(args)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    seconds, expected = offline(args.checkpoint, lines, args.threads, args.device)
    rows = {
        "offline": {"sent_s": len(lines) / seconds, "seconds": seconds},
        "alone_p50_ms": 1000
        * alone(args.checkpoint, lines[: args.alone], args.threads, args.device),
    }
    options = [
        "-c",
        args.checkpoint,
        "--threads",
        str(args.threads),
        "--max-queue",
        "100000",
        "--device",
        args.device,
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--workers",
        str(args.workers),
    ]
    if args.no_continuous:
        options.append("--no-continuous")
    with Server(*options, threads=args.threads) as server:
        for n in [int(c) for c in args.clients.split(",")]:
            server_cpu, before = cpu_seconds(server.proc.pid), batches(server)
            seconds, lat, client_cpu = clients(
                server.port, lines, n, expected, args.device == "cpu"
            )
            count, total = (b - a for a, b in zip(before, batches(server), strict=True))
            rows[f"clients_{n}"] = {
                "sent_s": len(lines) / seconds,
                "seconds": seconds,
                "client_cpu_s": client_cpu,
                "server_cpu_s": cpu_seconds(server.proc.pid) - server_cpu,
                "mean_batch": total / max(count, 1),
                **{f"p{q}_ms": 1000 * percentile(lat, q) for q in (50, 95, 99)},
            }
    print(
        f"{len(lines)} lines of {args.test}.{args.src}, {args.device}, {args.threads} threads, "
        f"--max-wait-ms {args.max_wait_ms:g}, --workers {args.workers}, "
        f"{'--no-continuous' if args.no_continuous else 'continuous batching'}, {args.checkpoint}\n"
    )
    print(
        "| run | sentences/s | x offline | p50 ms | p95 ms | p99 ms | cores used: server, clients "
        "| mean batch |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    off = rows["offline"]["sent_s"]
    print(f"| offline `nmt translate` | {off:.1f} | 1.00 | | | | | |")
    print(
        f"| one line alone (API, p50 of {min(args.alone, len(lines))}) | | | "
        f"{rows['alone_p50_ms']:.1f} | | | | |"
    )
    for key, r in rows.items():
        if key.startswith("clients_"):
            print(
                f"| serve, {key[8:]} clients | {r['sent_s']:.1f} | {r['sent_s'] / off:.2f} | "
                f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['server_cpu_s'] / r['seconds']:.2f}, {r['client_cpu_s'] / r['seconds']:.2f} | "
                f"{r['mean_batch']:.1f} |"
            )
    if "clients_32" in rows:
        print(
            f"\nbar 1: 32 clients at {rows['clients_32']['sent_s'] / off:.2f}x offline (at least "
            "0.8)"
        )
    if "clients_1" in rows:
        print(
            f"bar 2: 1 client p50 at {rows['clients_1']['p50_ms'] / rows['alone_p50_ms']:.2f}x one "
            "line alone (at most 1.5)"
        )
    write_json(args.json, rows)
    return rows
