"""A preallocated self-attention cache against the cache the decoder grows by one position a step.

    .venv/bin/python scripts/bench_kv_cache.py --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--sentences 1000] [--rounds 3] [--layouts 1x1,2x1]

The decoder (`nmt.models.layers.append`) gives each step a new cache one position longer: it
allocates it and copies the live rows of the old one into it, reordered by the beam. The
alternative measured here keeps two buffers per layer's keys and values for the whole search,
allocated once (doubling their length when a search outgrows them), and copies each step's
reordered rows from one into the other: the same copy, no allocation, and attention over a
strided view. It replaces `append` in this process only; the package is unchanged.

Each round runs both caches, alternating, each in a fresh process (`Translator.translate` of
the first `--sentences` lines of test_2016_flickr, batches of 32, beam 5; the best of 2
translations in the process counts), for each layout W x T (W workers of T threads). Prints
sent/s, the process's peak RSS (VmHWM), and whether the translations equal the grown cache's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from profile_decode import read_source, source_arguments  # noqa: E402


def preallocated_append(original, pairs: int):  # type: ignore[no-untyped-def]
    """A drop-in for `append` that writes into the partner of the buffer the cache lies in.

    Each thread keeps its last `pairs` buffer pairs (a search's layers times keys and values);
    a cache not in a buffer (step 0's) gets a new pair."""
    import torch

    local = threading.local()

    def append(cache, new, rows, slots=None, width=0):  # type: ignore[no-untyped-def]
        if slots is not None:  # rows at different positions (nmt serve): not measured here
            return original(cache, new, rows, slots, width)
        known = getattr(local, "pairs", None)
        if known is None:
            known = local.pairs = OrderedDict()
        n, length = new.size(0), cache.size(2) + new.size(2)
        target = known.get(cache.untyped_storage().data_ptr())
        if target is None or target.size(2) < length or target.size(0) < n:
            capacity = max(32, 2 * length)
            a, b = (new.new_empty(n, new.size(1), capacity, new.size(3)) for _ in range(2))
            known[a.untyped_storage().data_ptr()], known[b.untyped_storage().data_ptr()] = b, a
            while len(known) > 2 * pairs:
                known.popitem(last=False)
            target = a
        out = target[:n, :, :length]
        old = cache.size(2)
        if rows is None:
            out[:, :, :old] = cache
        else:
            torch.index_select(cache, 0, rows, out=out[:, :, :old])
        out[:, :, old:] = new
        return out

    return append


def child(args: argparse.Namespace) -> None:
    import torch

    import nmt.models.layers as layers
    from nmt import Translator

    workers, threads = (int(x) for x in args.layout.split("x"))
    tr = Translator.load(args.checkpoint, device="cpu", threads=workers * threads, workers=workers, batch_size=32)
    if args.cache == "preallocated":
        layers.append = preallocated_append(layers.append, len(tr.loaded.model.decoder))
    lines = read_source(args)
    best, out = float("inf"), []
    for _ in range(2):
        start = time.perf_counter()
        out = tr.translate(lines)
        best = min(best, time.perf_counter() - start)
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"seconds": best, "hwm_mb": hwm / 1024, "out": out, "torch": torch.__version__}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source_arguments(p, sentences=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layouts", default="1x1,2x1", help="W x T: W workers of T threads each")
    p.add_argument("--cache", help=argparse.SUPPRESS)  # set in the child processes
    p.add_argument("--layout", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cache:
        return child(args)
    print("| layout (workers x threads) | round | grown: sent/s | peak RSS MB | preallocated: sent/s | "
          "peak RSS MB | same translations |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for layout in args.layouts.split(","):
        for r in range(1, args.rounds + 1):
            res = {}
            for cache in ("grown", "preallocated"):
                cmd = [sys.executable, __file__, "--checkpoint", args.checkpoint, "--data-dir", args.data_dir,
                       "--test", args.test, "--src", args.src, "--sentences", str(args.sentences),
                       "--cache", cache, "--layout", layout]
                res[cache] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            g, q = res["grown"], res["preallocated"]
            n = len(g["out"])
            print(f"| {layout} | {r} | {n / g['seconds']:.1f} | {g['hwm_mb']:.0f} | {n / q['seconds']:.1f} | "
                  f"{q['hwm_mb']:.0f} | {g['out'] == q['out']} |", flush=True)


if __name__ == "__main__":
    main()
