"""A teacher and its students side by side, on the same machine and test sets, with every
engine: BLEU, chrF, sentences/s and peak memory.

    python -m benchmarks distill \\
        --model teacher=runs/m30k_en_de/checkpoint_avg.pt \\
        --model reference=runs/distill_en_de_reference/run/checkpoint_avg.pt \\
        --model distilled=runs/distill_en_de/run/checkpoint_avg.pt \\
        [--tests test_2016_flickr,test_2017_flickr] [--data-dir ../shared/data/multi30k] [--threads
        2]

Each model runs through the engines suite's `measure()`: `nmt translate` at fp32 and int8
(the Python API, model loaded, best of --repeat), then `nmt export` to CTranslate2 float32 and
int8, each engine in its own child process whose peak resident memory is reported. Decoding
uses each checkpoint's own decode settings (beam 5 unless --beam). The first --model is the
baseline: `× first` is a model's sentences/s over the first model's with the same engine, and
`Δ BLEU` its BLEU minus the first model's with the same engine. Prints one markdown table per
test set; `--json FILE` writes every row. Nothing else may run on the machine meanwhile
(2 cores: any other load halves a 2-thread figure).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import add_decode_args, add_test_set_args, write_json
from benchmarks.engines import add_engine_args, caption, measure


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks distill", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=CHECKPOINT",
        help="a checkpoint and the name it gets in the table; the first is the baseline",
    )
    p.add_argument(
        "--tests", default="test_2016_flickr,test_2017_flickr", help="comma-separated test sets"
    )
    add_test_set_args(p)
    add_decode_args(p)
    add_engine_args(p, precision="fp32,int8")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    models = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"--model {spec}: expected NAME=CHECKPOINT")
        if not Path(path).is_file():
            p.error(f"--model {spec}: {path} is not a file")
        models.append((name, path))
    args.models = models
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    tests = args.tests.split(",")
    rows = []
    for test in tests:
        for name, path in args.models:
            print(f"measuring {name} on {test}", file=sys.stderr, flush=True)
            rows += [{"model": name, **r} for r in measure(args, path, test)]
    first = args.models[0][0]
    for test in tests:
        here = [r for r in rows if r["test"] == test]
        base = {r["engine"]: r for r in here if r["model"] == first}
        print(f"\n{caption(here[0])} (the first model's lenpen)\n")
        print(
            f"| model | engine | BLEU | Δ BLEU | chrF | sent/s | × {first} | peak RSS MB | model "
            "MB |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in here:
            b = base[r["engine"]]
            size = f"{r['model_mb']:.1f}" if r["model_mb"] else "-"
            print(
                f"| {r['model']} | {r['engine']} | {r['bleu']:.2f} | {r['bleu'] - b['bleu']:+.2f} "
                f"| {r['chrf']:.2f} | {r['sent_per_s']:.1f} | "
                f"{r['sent_per_s'] / b['sent_per_s']:.2f} | {r['peak_rss_mb']:.0f} | {size} |"
            )
    write_json(args.json, rows)
    return rows
