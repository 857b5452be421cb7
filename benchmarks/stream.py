"""What continuous batching can reach without HTTP: `nmt serve`'s decode machinery in one
process, under a closed loop of clients, next to offline translation of the same lines.

    python -m benchmarks stream --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--clients 32] [--threads 2] [--rounds 3]

`--clients` threads each send one line at a time and send the next when it is answered (as
the serve suite's clients do over HTTP), until every line of the test set is translated.
Three runs a round, in this order, each round in the same process:
1. offline: `Translator.translate` of all the lines (what `nmt translate` runs: one worker per
   thread, batches of `decode.batch_size` sorted by length);
2. batcher: nmt.serve's `Batcher` with a `Stream` per lane, as `nmt serve` builds them (one lane
   per thread, each search on one thread; the batcher's threads hand each step to its lane);
3. even: the same `Stream`s, each stepped by its own thread with no hand-off, a lane taking
   waiting lines only while it holds fewer than clients / lanes: the sentences split evenly.
Every translation must equal the offline one. Prints sentences/s, x offline (of its round) and
the mean sentences a search step held. The figures go into docs/benchmarks.md with the date,
commit and CPU. Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from benchmarks.common import DEMO_CHECKPOINT, add_test_set_args, read_test_set, write_json


class Loop:
    """A closed loop of `clients` over `texts`: `waiting`, the lines sent and not yet taken;
    `done(i, text)` records line i's translation and sends its client's next line."""

    def __init__(self, texts: list[str], clients: int):
        first = min(clients, len(texts))
        self.texts = texts
        self.out = [""] * len(texts)
        self.waiting = deque(range(first))
        self.sent = first
        self.left = len(texts)
        self.cond = threading.Condition()

    def done(self, i: int, text: str) -> None:
        with self.cond:
            self.out[i] = text
            self.left -= 1
            if self.sent < len(self.texts):
                self.waiting.append(self.sent)
                self.sent += 1
            self.cond.notify_all()


def timed_threads(target: Callable[[], None], n: int) -> float:
    """The seconds `n` threads running `target` take to end."""
    start = time.perf_counter()
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def run_batcher(
    tr: Any, texts: list[str], clients: int, threads: int
) -> tuple[list[str], float, float]:
    from nmt.decoding.predict import decode_workers
    from nmt.options import ServeOptions
    from nmt.serve.batching import Batcher, Job
    from nmt.serve.stream import Stream

    lanes = decode_workers(0, tr.device)
    opts = ServeOptions()  # the server's defaults
    sizes: list[int] = []
    batcher = Batcher(
        lambda key, jobs: tr.translate_nbest([j.item for j in jobs]),
        batch_tokens=opts.batch_tokens,
        max_queue=opts.max_queue,
        on_batch=lambda n, size: sizes.append(size),
        lanes=lanes,
        stream=lambda key: Stream(tr, 1, False, None, (max(1, threads // lanes), threads)),
    )
    encode = tr.loaded.tokenizer.encode
    out = [""] * len(texts)
    lines = iter(range(len(texts)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(lines, None)
            if i is None:
                return
            job = Job("plain", texts[i], tokens=len(encode(texts[i])) + 1)
            batcher.submit([job])
            result = job.future.result()
            out[i] = result[0].text if result else ""

    seconds = timed_threads(client, clients)
    batcher.close()
    return out, seconds, statistics.mean(sizes)


def run_even(
    tr: Any, texts: list[str], clients: int, threads: int
) -> tuple[list[str], float, float]:
    import torch

    from nmt.decoding.predict import decode_workers
    from nmt.serve.batching import Job
    from nmt.serve.stream import Stream

    lanes = decode_workers(0, tr.device)
    share = -(-clients // lanes)
    loop = Loop(texts, clients)
    sizes: list[int] = []

    def lane() -> None:
        torch.set_num_threads(max(1, threads // lanes))
        stream = Stream(tr, 1, False, None, (max(1, threads // lanes), threads))
        while True:
            with loop.cond:
                while loop.left and not len(stream) and not loop.waiting:
                    loop.cond.wait()
                if not loop.left:
                    return
                take = [
                    loop.waiting.popleft()
                    for _ in range(min(len(loop.waiting), max(0, share - len(stream))))
                ]
            jobs = [Job("plain", texts[i], tokens=0, index=i) for i in take]
            sizes.append(len(stream) + len(jobs))
            for job, result in stream.run(jobs):
                loop.done(job.index, result[0].text if result else "")

    return loop.out, timed_threads(lane, lanes), statistics.mean(sizes)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks stream", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    add_test_set_args(p)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write each round's figures here")
    args = p.parse_args(argv)
    texts = read_test_set(args)

    import torch

    from nmt import Translator

    torch.set_num_threads(args.threads)
    tr = Translator.load(args.checkpoint, device="cpu", threads=args.threads)
    tr.translate(texts[:64])  # warm-up
    print(
        f"{len(texts)} lines, {args.clients} clients, {args.threads} threads, torch "
        f"{torch.__version__}\n"
    )
    print(
        "| round | offline sent/s | batcher sent/s | x offline | mean sentences a step | even "
        "sent/s | x offline | mean sentences a step |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rounds = []
    for r in range(1, args.rounds + 1):
        start = time.perf_counter()
        ref = tr.translate(texts)
        offline = len(texts) / (time.perf_counter() - start)
        cells = [f"{offline:.1f}"]
        figures: dict[str, Any] = {"round": r, "offline_sent_per_s": offline}
        for name, run in (("batcher", run_batcher), ("even", run_even)):
            out, seconds, mean = run(tr, texts, args.clients, args.threads)
            if out != ref:
                bad = next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)
                sys.exit(
                    f"{name}: line {bad + 1} differs from the offline translation: {out[bad]!r} != "
                    f"{ref[bad]!r}"
                )
            rate = len(texts) / seconds
            cells += [f"{rate:.1f}", f"{rate / offline:.2f}", f"{mean:.1f}"]
            figures[name] = {"sent_per_s": rate, "mean_sentences_a_step": mean}
        print(f"| {r} | " + " | ".join(cells) + " |", flush=True)
        rounds.append(figures)
    write_json(args.json, rounds)
    return rounds
