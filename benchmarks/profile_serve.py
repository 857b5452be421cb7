"""Where `nmt serve`'s time goes under concurrent clients, next to offline translation.

    python -m benchmarks profile-serve --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--clients 32] [--threads 2] [--seconds 10] [--data-dir ../shared/data/multi30k]

With nothing else running:
1. offline: the `Translator` API (what `nmt translate` runs: one worker thread per torch
   thread) on the test set in this process; each thread's CPU seconds over the wall seconds,
   read from /proc while it runs. A worker that never waits is at 1.00.
2. the server: `nmt serve --threads N`, `--clients` keep-alive clients (the serve suite's)
   sending the lines one a request; each thread's CPU over the wall time: the decode threads
   (the busiest ones), the event loop (the main thread), the rest.
3. where py-spy is installed (`pip install py-spy`; not a dependency of nmt): `py-spy record
   --idle` of the server for `--seconds` while the clients run again, and the decode threads'
   samples split into what they were doing: a search step (`BeamSearch.step`), sentences joining
   the search (`BeamSearch.add`: the encoder, the merge of states), the rest of a step's work
   (tokenizing, detokenizing, the books) and waiting for work. py-spy takes CPU of its own, so
   step 3 gives shares, not speeds; steps 1 and 2 run without it.
Prints markdown tables; figures go into docs/benchmarks.md with the date, commit and CPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import cpu_seconds, read_test_set, write_json
from benchmarks.serve import Server, add_model_and_test_set, clients

# a decode thread's py-spy stack -> what it was doing: the first of these frames it holds
KINDS = [("search step", "BeamSearch.step"), ("sentences joining", "BeamSearch.add")]


class ThreadCPU:
    """Each thread of process `pid`: CPU seconds over the `with` block, sampled from /proc every
    0.1 s (threads that end inside it keep their last reading)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()

    def read(self) -> dict[int, float]:
        """Each live thread's CPU seconds (0 from a thread that ended meanwhile: left out)."""
        seconds = {
            int(tid): cpu_seconds(self.pid, int(tid))
            for tid in os.listdir(f"/proc/{self.pid}/task")
        }
        return {tid: s for tid, s in seconds.items() if s}

    def __enter__(self) -> ThreadCPU:
        self.first, self.start = self.read(), time.perf_counter()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            self.last.update(self.read())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()
        self.last.update(self.read())
        self.wall = time.perf_counter() - self.start

    def cores(self) -> dict[int, float]:
        """CPU seconds over wall seconds of each thread that used any."""
        used = {tid: (s - self.first.get(tid, 0.0)) / self.wall for tid, s in self.last.items()}
        return {tid: c for tid, c in used.items() if c >= 0.005}


def split(busiest: dict[int, float], main: int, workers: int) -> str:
    """A thread -> cores map as the table's cells: the `workers` busiest threads other than `main`
    (the decode threads) each, `main`, the other threads together, the whole process."""
    rest = sorted(((c, t) for t, c in busiest.items() if t != main), reverse=True)
    decode, others = rest[:workers], rest[workers:]
    return (
        f"{', '.join(f'{c:.2f}' for c, _ in decode)} | {busiest.get(main, 0.0):.2f} | "
        f"{sum(c for c, _ in others):.2f} | {sum(busiest.values()):.2f}"
    )


def spy_shares(path: Path) -> dict[str, float]:
    """py-spy's raw output -> the decode threads' (nmt-torch*) samples by kind, as shares."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack.startswith("thread") or "nmt-torch" not in stack.split(";")[0]:
            continue
        idle = stack.rsplit(";", 1)[-1].startswith(
            "_worker "
        )  # the thread pool's wait for its next item
        kind = (
            "waiting for work"
            if idle
            else next((k for k, frame in KINDS if frame in stack), "other work")
        )
        counts[kind] += int(n)
    total = sum(counts.values()) or 1
    return {
        k: counts[k] / total for k in [*(k for k, _ in KINDS), "other work", "waiting for work"]
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks profile-serve", description=__doc__.split("\n\n")[0]
    )
    add_model_and_test_set(p)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=int, default=10, help="py-spy's recording (step 3)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    lines = read_test_set(args)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from nmt import Translator

    tr = Translator.load(args.checkpoint, threads=args.threads)
    tr.translate(lines[:64])
    with ThreadCPU(os.getpid()) as offline:
        tr.translate(lines)
    print(
        f"{len(lines)} lines of {args.test}.{args.src}, {args.threads} threads, torch "
        f"{torch.__version__}, {args.checkpoint}\n"
    )
    print(
        "| run | sentences/s | decode threads: cores each | main thread | other threads | process "
        "|\n| --- | ---: | --- | ---: | ---: | ---: |"
    )
    print(
        f"| offline (`Translator.translate`) | {len(lines) / offline.wall:.1f} | "
        f"{split(offline.cores(), os.getpid(), args.threads)} |"
    )
    figures: dict = {
        "offline": {"sent_per_s": len(lines) / offline.wall, "cores": offline.cores()},
    }
    with Server(
        "-c",
        args.checkpoint,
        "--threads",
        str(args.threads),
        "--max-queue",
        "100000",
        threads=args.threads,
    ) as server:
        clients(
            server.port, lines[:100], args.clients, [""] * 100, False
        )  # warm: every batch shape once
        with ThreadCPU(server.proc.pid) as served:
            seconds, _, _ = clients(server.port, lines, args.clients, [""] * len(lines), False)
        print(
            f"| serve, {args.clients} clients | {len(lines) / seconds:.1f} | "
            f"{split(served.cores(), server.proc.pid, args.threads)} |"
        )
        figures["serve"] = {"sent_per_s": len(lines) / seconds, "cores": served.cores()}
        spy = shutil.which("py-spy") or shutil.which(
            "py-spy", path=str(Path(sys.executable).parent)
        )
        if spy is None:
            print("\n(py-spy is not installed: no split of the decode threads' time)")
            write_json(args.json, figures)
            return figures
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "spy.txt"
            rec = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(server.proc.pid),
                    "--threads",
                    "--idle",
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--duration",
                    str(args.seconds),
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            clients(server.port, lines, args.clients, [""] * len(lines), False)
            if rec.wait() or not out.exists():
                raise SystemExit(
                    f"py-spy failed: {rec.stderr.read().strip() if rec.stderr else ''}"
                )
            shares = spy_shares(out)
    print(
        f"\nThe decode threads' py-spy samples ({args.clients} clients, {args.seconds:g} s at 250 "
        "Hz):\n\n| what | share |\n| --- | ---: |"
    )
    for kind, share in shares.items():
        print(f"| {kind} | {100 * share:.1f}% |")
    figures["decode_thread_shares"] = shares
    write_json(args.json, figures)
    return figures
