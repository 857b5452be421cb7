"""`nmt serve` with one client beside busy processes: the latency of a lone request on cores
that other processes keep busy, for each OpenMP wait policy of the server.

    python -m benchmarks serve-busy --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--sentences 500] \\
        [--threads 2] [--busy 0,2] [--seconds 30] [--policies default,spin] [--json FILE]

For each policy a server (`nmt serve --threads N`) is started on a free port with that OpenMP
wait policy in its environment: "default", none given, so that `nmt serve` sets its own (a
spin of 10,000, then sleep); "spin", libgomp's own default (spin 300,000 times, then sleep:
OMP_WAIT_POLICY=ACTIVE with GOMP_SPINCOUNT=300000); PASSIVE; ACTIVE (spin for ever); spin-10k
and spin-30k (ACTIVE with GOMP_SPINCOUNT 10,000 or 30,000). Then, for
each count of `--busy` processes (each a Python loop keeping one core busy, started before the
client and stopped after it), one client sends the lines one a request (`POST /v1/translate`,
a keep-alive connection), each once the previous is answered, for `--seconds`: sentences/s and
p50 / p90 latency. Prints a markdown table.

Issue 57 measured, with other processes on both cores, 0.17-0.62 sentences/s for one client
(p50 1-5.7 s), and 8.7-11.9 with OMP_WAIT_POLICY=PASSIVE or one thread. Run it on a machine
that is otherwise quiet: the busy processes are the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time

from benchmarks.common import median, percentile, read_test_set, write_json
from benchmarks.serve import Server, add_model_and_test_set

POLICIES = {
    "default": {},
    "spin": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
    # spin this many times, then sleep
    "spin-10k": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10000"},
    "spin-30k": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000"},
}


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
            raise SystemExit(f"nmt serve answered {response.status}")
        times.append(time.perf_counter() - start)
    conn.close()
    return times


def measure(args: argparse.Namespace, lines: list[str], policy: str) -> list[dict]:
    """One row per count of busy processes, for a server of wait policy `policy`."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # the server's environment is this one's
        os.environ.pop(name, None)
    os.environ.update(POLICIES[policy])
    rows = []
    with Server(
        "-c", args.checkpoint, "--threads", str(args.threads), threads=args.threads
    ) as server:
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
            rows.append(
                {
                    "policy": policy,
                    "busy": busy,
                    "requests": len(times),
                    "sent_s": len(times) / sum(times),
                    "p50_ms": 1000 * median(times),
                    "p90_ms": 1000 * percentile(times, 90),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks serve-busy", description=__doc__.split("\n\n")[0]
    )
    add_model_and_test_set(p)
    p.set_defaults(sentences=500)
    p.add_argument("--busy", default="0,2", help="comma-separated counts of busy processes")
    p.add_argument("--seconds", type=float, default=30.0, help="the client's time at each count")
    p.add_argument(
        "--policies", default="default,spin", help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    args.busy = [int(b) for b in args.busy.split(",")]
    lines = read_test_set(args)
    rows = [row for policy in args.policies.split(",") for row in measure(args, lines, policy)]
    print(
        f"\n{args.threads} server threads, {os.cpu_count()} cores, one client {args.seconds:g} s "
        "each\n"
    )
    print("| OpenMP wait policy | busy processes | requests | sentences/s | p50 ms | p90 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['policy']} | {r['busy']} | {r['requests']} | {r['sent_s']:.2f} | "
            f"{r['p50_ms']:.1f} | {r['p90_ms']:.1f} |"
        )
    write_json(args.json, rows)
    return rows
