"""Lexically constrained decoding on a Multi30k test set.

    python -m benchmarks constraints --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--beam 5] [--threads 2]

Three runs of the same model and settings, side by side in one process, alternating for
`--rounds` rounds (median time): without constraints, with 1 and with 3 constraints per
sentence. The constraints are reference words (alphabetic, `--min-chars` or longer) that the
unconstrained translation missed, chosen with a fixed seed; a sentence with fewer such words
gets fewer. For each run: BLEU and chrF against the reference, the term-use rate (the share
of the chosen words that appear in the output as words, by construction 0 without
constraints; and anywhere in it, the token-level guarantee: `Hund` is met inside `Hunde`), and
sentences per second of `Translator.translate` (model loaded, time of the call alone). Prints
a markdown table; `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.common import add_decode_args, add_test_set_args, median, read_test_set, write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks constraints", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint", required=True)
    add_test_set_args(p)
    add_decode_args(p)
    p.add_argument("--rounds", type=int, default=3)
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
    used = 0
    for output, asked in zip(outputs, asks):
        found = set(words(output)) if whole_words else output
        used += sum(w in found for w in asked)
    return used / total if total else 0.0


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    src = read_test_set(args, args.src)
    ref = read_test_set(args, args.tgt)

    import sacrebleu
    import torch

    from nmt import Translator

    translator = Translator.load(
        args.checkpoint, beam=args.beam, threads=args.threads, device="cpu"
    )
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
            if asks is None:
                out = translator.translate(src)
            else:
                out = translator.translate(src, constraints=asks)
            times[name].append(time.perf_counter() - start)
            outputs.setdefault(name, out)
            assert outputs[name] == out, f"{name}: round {r} differs"
    rows = []
    for name, asks in runs.items():
        out = outputs[name]
        seconds = median(times[name])
        scored = asks if asks else picks[1]
        rows.append(
            {
                "constraints": name,
                "sentences": len(src),
                "asked": sum(len(a) for a in asks) if asks else 0,
                "bleu": round(sacrebleu.corpus_bleu(out, [ref]).score, 2),
                "chrf": round(sacrebleu.corpus_chrf(out, [ref]).score, 2),
                "term_use": round(term_use(out, scored), 4),
                "term_anywhere": round(term_use(out, scored, whole_words=False), 4),
                "seconds": round(seconds, 2),
                "sent_per_s": round(len(src) / seconds, 1),
            }
        )
    base = rows[0]["sent_per_s"]
    for row in rows:
        row["speed_vs_none"] = round(row["sent_per_s"] / base, 3)
    print(
        f"{args.checkpoint}, {args.test} ({len(src)} sentences), beam {args.beam}, {args.threads} "
        f"threads, median of {args.rounds} alternating rounds; torch {torch.__version__}"
    )
    print(
        "| constraints | words asked | BLEU | chrF | term use (words) | term use (anywhere) | s | "
        "sent/s | vs none |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['constraints']} | {row['asked']} | {row['bleu']} | {row['chrf']} | "
            f"{row['term_use']:.1%} | {row['term_anywhere']:.1%} | {row['seconds']} | "
            f"{row['sent_per_s']} | {row['speed_vs_none']} |"
        )
    result = {
        "checkpoint": args.checkpoint,
        "test": args.test,
        "beam": args.beam,
        "threads": args.threads,
        "rows": rows,
    }
    write_json(args.json, result)
    return result
