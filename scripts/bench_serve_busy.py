"""Benchmark `nmt serve` with one client beside busy processes: the latency of a lone request on
cores that other processes keep busy, for each OpenMP wait policy of the server.

    .venv/bin/python scripts/bench_serve_busy.py --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--lines FILE] [--threads 2] [--busy 0,2] [--seconds 30] [--policies default,spin] [--json FILE]

For each policy, a server (`nmt serve --threads N`) is started on a free port with that OpenMP
wait policy in its environment: "default", none given, so `nmt serve` sets PASSIVE; "spin",
libgomp's own default that `nmt serve` had before (spin 300,000 times, then sleep:
OMP_WAIT_POLICY=ACTIVE with GOMP_SPINCOUNT=300000); or PASSIVE, ACTIVE (spin for ever); then
for each count of `--busy` processes (each a Python loop that keeps one core busy, started
before the client and stopped after it), one client sends the lines one a request
(`POST /v1/translate`, a keep-alive connection), each once the previous is answered, for
`--seconds`: sentences/s and p50 / p90 latency. Prints a markdown table.

Issue 57 measured, with other processes on both cores, 0.17-0.62 sentences/s for one client
(p50 1-5.7 s) and 8.7-11.9 with OMP_WAIT_POLICY=PASSIVE or one thread. Run it on a machine that
is otherwise quiet: the busy processes are the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from serving import Server  # noqa: E402

LINES = ["A dog runs through the park.", "Two men are talking on a street corner.",
         "A woman in a red coat is reading a book on a bench.", "Children play football in the rain.",
         "A man rides a bicycle past a row of old houses."]


POLICIES = {"default": {}, "spin": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"},
            "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"}}


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def busy_processes(n: int) -> list[subprocess.Popen]:
    """`n` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(n)]


def lone_client(port: int, lines: list[str], seconds: float) -> list[float]:
    """The latency of each request one client sent, one after another, for `seconds`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or not times:
        body = json.dumps({"texts": [lines[len(times) % len(lines)]]})
        start = time.perf_counter()
        conn.request("POST", "/v1/translate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"the server answered {response.status}")
        times.append(time.perf_counter() - start)
    conn.close()
    return times


def measure(args: argparse.Namespace, lines: list[str], policy: str) -> list[dict]:
    env = {"OMP_NUM_THREADS": str(args.threads), **POLICIES[policy]}
    rows = []
    with Server("-c", args.checkpoint, "--threads", str(args.threads), env=env) as server:
        lone_client(server.port, lines, 1.0)  # warm
        for busy in args.busy:
            others = busy_processes(busy)
            try:
                time.sleep(0.5)  # the busy processes running
                times = lone_client(server.port, lines, args.seconds)
            finally:
                for p in others:
                    p.kill()
                    p.wait()
            rows.append({"policy": policy, "busy": busy, "requests": len(times),
                         "sent_per_s": len(times) / sum(times), "p50_ms": 1000 * statistics.median(times),
                         "p90_ms": 1000 * percentile(times, 90)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--lines", help="a file of source lines (default: five built-in sentences)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--busy", default="0,2", help="comma-separated counts of busy processes")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--policies", default="default,spin", help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument("--json")
    args = parser.parse_args()
    args.busy = [int(b) for b in args.busy.split(",")]
    lines = Path(args.lines).read_text("utf-8").splitlines()[:500] if args.lines else LINES
    rows = [row for policy in args.policies.split(",") for row in measure(args, lines, policy)]
    print(f"\n{args.threads} server threads, {os.cpu_count()} cores, one client for {args.seconds:g} s each\n")
    print("| OMP_WAIT_POLICY | busy processes | requests | sentences/s | p50 ms | p90 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['policy']} | {r['busy']} | {r['requests']} | {r['sent_per_s']:.2f} | {r['p50_ms']:.1f} | "
              f"{r['p90_ms']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", "utf-8")


if __name__ == "__main__":
    main()
