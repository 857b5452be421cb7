"""`nmt prepare-bpe` on Multi30k en-de and on a synthetic WMT-sized corpus.

    python -m benchmarks prepare [--data-dir ../shared/data/multi30k] [--pairs 1000000] [--reuse]

Each run is a fresh child process so that its peak RSS (the process and its own children) is
its own. The synthetic corpus recombines Multi30k pairs (1-3 consecutive sentence pairs joined
into one, picked at random) into `--pairs` gzip'd pairs in a temporary directory; writing it is
not timed. With `--reuse`, the synthetic corpus is also run with the spm model of the first
synthetic run (encoding only). Prints one markdown table row per run; `--json FILE` also
writes the figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import MULTI30K, children_peak_rss_mb, peak_rss_mb, run_child, write_json


def child(spec: dict) -> None:
    """Run prepare-bpe once and print its figures."""
    from nmt.prepare import PrepareOptions, prepare_bpe

    start = time.perf_counter()
    report = prepare_bpe(PrepareOptions(**spec), progress=False)
    wall = time.perf_counter() - start
    pairs = sum(split["lines"] for split in report["splits"].values())
    figures = {
        "pairs": pairs,
        "train_pairs": report["splits"]["train"]["lines"],
        "wall_s": round(wall, 2),
        "pairs_per_s": round(pairs / wall),
        "peak_rss_mib": round(max(peak_rss_mb(), children_peak_rss_mb())),
        "vocab_size": report["vocab_size"],
        "workers": spec["workers"],
    }
    print(json.dumps(figures))


def measure(name: str, spec: dict) -> dict:
    result = {"run": name, **run_child("prepare", spec)}
    print(
        f"| {name} | {result['pairs']:,} | {result['workers']} | {result['wall_s']:.1f} "
        f"| {result['pairs_per_s']:,} | {result['peak_rss_mib']:,} |",
        flush=True,
    )
    return result


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def write_synthetic(data: Path, prefix: Path, pairs: int, seed: int = 1) -> None:
    """`pairs` pairs, each 1-3 consecutive Multi30k train pairs joined."""
    src = read_gz(data / "train.en.gz")
    tgt = read_gz(data / "train.de.gz")
    rng = random.Random(seed)
    with (
        gzip.open(f"{prefix}.en.gz", "wt", encoding="utf-8", compresslevel=1) as fs,
        gzip.open(f"{prefix}.de.gz", "wt", encoding="utf-8", compresslevel=1) as ft,
    ):
        for _ in range(pairs):
            k = rng.randint(1, 3)
            i = rng.randrange(len(src) - k)
            fs.write(" ".join(src[i : i + k]) + "\n")
            ft.write(" ".join(tgt[i : i + k]) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks prepare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=MULTI30K, help="Multi30k directory")
    parser.add_argument(
        "--pairs", type=int, default=1_000_000, help="synthetic corpus size (0: none)"
    )
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--reuse", action="store_true", help="also time encoding alone")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return []
    d = args.data_dir
    if not (d / "train.en.gz").is_file():
        sys.exit(f"{d}/train.en.gz not found (--data-dir)")
    common = {
        "source_lang": "en",
        "target_lang": "de",
        "vocab_size": args.vocab_size,
        "workers": args.workers,
        "validpref": str(d / "val"),
        "testpref": f"{d}/test_2016_flickr,{d}/test_2017_flickr",
    }
    print("| run | pairs (all splits) | workers | wall s | pairs/s | peak RSS MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        out = Path(tmp)
        spec = dict(common, trainpref=str(d / "train"), destdir=str(out / "m30k"))
        results.append(measure("multi30k en-de", spec))
        if args.pairs:
            start = time.perf_counter()
            write_synthetic(d, out / "synth", args.pairs)
            print(f"(wrote {args.pairs:,} synthetic pairs in {time.perf_counter() - start:.0f} s)")
            spec = dict(common, trainpref=str(out / "synth"), destdir=str(out / "synth-bin"))
            results.append(measure(f"synthetic {args.pairs:,}", spec))
            if args.reuse:
                spec = dict(spec, destdir=str(out / "synth-reuse"))
                spec["spm_model"] = str(out / "synth-bin" / "spm.model")
                results.append(measure(f"synthetic {args.pairs:,}, --spm-model", spec))
    write_json(args.json, results)
    return results
