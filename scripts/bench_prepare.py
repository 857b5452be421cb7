"""Benchmark `nmt prepare-bpe`: Multi30k en-de and a synthetic WMT-sized corpus.

    .venv/bin/python scripts/bench_prepare.py [--data ../shared/data/multi30k] [--pairs 1000000]

Each run is a fresh subprocess so that its peak RSS (getrusage of the process and its
children) is its own. The synthetic corpus recombines Multi30k pairs (1-3 consecutive
sentence pairs joined into one, picked at random) into `--pairs` gzip'd pairs in a
temporary directory; writing it is not timed. With `--reuse`, the synthetic corpus is
also run with the spm model of the first synthetic run (encoding only). Prints one
markdown table row per run; `--json FILE` also writes the figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/multi30k"


def run_one(spec: dict) -> dict:
    """In the child: run prepare-bpe once and measure it."""
    from nmt.prepare import PrepareOptions, prepare_bpe

    start = time.perf_counter()
    report = prepare_bpe(PrepareOptions(**spec), progress=False)
    wall = time.perf_counter() - start
    pairs = sum(split["lines"] for split in report["splits"].values())
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    return {
        "pairs": pairs,
        "train_pairs": report["splits"]["train"]["lines"],
        "wall_s": round(wall, 2),
        "pairs_per_s": round(pairs / wall),
        "peak_rss_mib": round(rss / 1024),
        "vocab_size": report["vocab_size"],
        "workers": spec["workers"],
    }


def measure(name: str, spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = {"run": name, **json.loads(out.stdout.strip().splitlines()[-1])}
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
    src, tgt = read_gz(data / "train.en.gz"), read_gz(data / "train.de.gz")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--pairs", type=int, default=1_000_000, help="synthetic corpus size")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--reuse", action="store_true", help="also time encoding alone")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return
    if not (args.data / "train.en.gz").is_file():
        sys.exit(f"{args.data}/train.en.gz not found (--data)")
    d = args.data
    common = {"source_lang": "en", "target_lang": "de", "vocab_size": args.vocab_size}
    common.update(workers=args.workers, validpref=str(d / "val"))
    common["testpref"] = f"{d}/test_2016_flickr,{d}/test_2017_flickr"
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
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
