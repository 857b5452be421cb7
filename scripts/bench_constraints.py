"""Benchmark lexically constrained decoding (issue 27) on a Multi30k test set.

    .venv/bin/python scripts/bench_constraints.py --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--beam 5] [--threads 2]

Three runs of the same model and settings, side by side in one process, alternating for
`--rounds` rounds (median time): without constraints, with 1 and with 3 constraints per
sentence. The constraints are reference words (alphabetic, `--min-chars` or longer) that the
unconstrained translation missed, chosen with a fixed seed; a sentence with fewer such words
gets fewer. For each run: BLEU and chrF against the reference, the term-use rate (the share
of the chosen words that appear in the output as words, by construction 0 without
constraints; and anywhere in it, the token-level guarantee: `Hund` is met inside `Hunde`), and sentences per second of `Translator.translate` (model loaded, time of the
call alone). Prints a markdown table; `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt import Translator  # noqa: E402
from nmt.textio import read_lines  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from bench_translate import add_test_set_args  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    add_test_set_args(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sentences", type=int, default=0, help="the first N sentences; 0 = all")
    p.add_argument("--min-chars", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures to this file")
    return p.parse_args(argv)


def words(text: str) -> list[str]:
    """The words of a sentence, punctuation stripped from their ends."""
    return [w.strip(".,;:!?\"'()") for w in text.split()]


def missed_words(hyp: str, ref: str, min_chars: int) -> list[str]:
    have = set(words(hyp))
    out: list[str] = []
    for w in words(ref):
        if len(w) >= min_chars and w.isalpha() and w not in have and w not in out:
            out.append(w)
    return out


def term_use(outputs: list[str], asks: list[list[str]], whole_words: bool = True) -> float:
    """The share of asked words in the outputs: as whole words, or anywhere (a constraint is a
    token sequence, so `Hund` is also met inside `Hunde`)."""
    total = sum(len(a) for a in asks)
    used = sum((w in set(words(o))) if whole_words else (w in o) for o, a in zip(outputs, asks) for w in a)
    return used / total if total else 0.0


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    data = Path(args.data_dir)
    src = list(read_lines(data / f"{args.test}.{args.src}.gz"))
    ref = list(read_lines(data / f"{args.test}.{args.tgt}.gz"))
    if args.sentences:
        src, ref = src[: args.sentences], ref[: args.sentences]
    translator = Translator.load(args.checkpoint, beam=args.beam, threads=args.threads, device="cpu")
    plain = translator.translate(src)
    rng = random.Random(args.seed)
    missed = [missed_words(h, r, args.min_chars) for h, r in zip(plain, ref)]
    picks = {k: [rng.sample(m, k=min(k, len(m))) for m in missed] for k in (1, 3)}
    runs = {"none": None, "1 per sentence": picks[1], "3 per sentence": picks[3]}
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[str]] = {}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            asks = runs[name]
            start = time.perf_counter()
            out = translator.translate(src) if asks is None else translator.translate(src, constraints=asks)
            times[name].append(time.perf_counter() - start)
            outputs.setdefault(name, out)
            assert outputs[name] == out, f"{name}: round {r} differs"
    rows = []
    for name, asks in runs.items():
        out = outputs[name]
        seconds = statistics.median(times[name])
        rows.append({
            "constraints": name, "sentences": len(src),
            "asked": sum(len(a) for a in asks) if asks else 0,
            "bleu": round(sacrebleu.corpus_bleu(out, [ref]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(out, [ref]).score, 2),
            "term_use": round(term_use(out, asks if asks else picks[1]), 4),
            "term_anywhere": round(term_use(out, asks if asks else picks[1], whole_words=False), 4),
            "seconds": round(seconds, 2), "sent_per_s": round(len(src) / seconds, 1),
        })
    base = rows[0]["sent_per_s"]
    for row in rows:
        row["speed_vs_none"] = round(row["sent_per_s"] / base, 3)
    print(f"{args.checkpoint}, {args.test} ({len(src)} sentences), beam {args.beam}, {args.threads} threads, "
          f"median of {args.rounds} alternating rounds; torch {torch.__version__}")
    print("| constraints | words asked | BLEU | chrF | term use (words) | term use (anywhere) | s | sent/s | vs none |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['constraints']} | {row['asked']} | {row['bleu']} | {row['chrf']} | {row['term_use']:.1%} "
              f"| {row['term_anywhere']:.1%} "
              f"| {row['seconds']} | {row['sent_per_s']} | {row['speed_vs_none']} |")
    result = {"checkpoint": args.checkpoint, "test": args.test, "beam": args.beam, "threads": args.threads,
              "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
