"""nmt against CTranslate2 after `nmt export`: speed, peak memory, BLEU, and how many
translations are identical.

    python -m benchmarks engines --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--beam 5] [--threads 2]

The checkpoint is exported once per `--quantization` (float32 = no quantization) into a
temporary directory with `nmt export`. Each engine then runs in its own child process, which
loads the model, translates the test set and writes it; we report
- `translate s`: the translation alone, timed inside that process (model loaded; the
  sentencepiece encoding and decoding included for both engines), best of `--repeat`;
- `process s` and `peak RSS MB`: the whole child (start-up, imports, loading), its wall time
  and its own peak resident memory (VmHWM at its end).
nmt runs at each `--precision` (fp32; fp32,int8 adds `nmt translate --precision int8`) on each
of `--nmt-engines` (torch, ctranslate2: the conversion into the cache happens at load, outside
the timed translation) with `--threads T` and its default workers (one per thread), through the
Python API that `nmt translate` is a reader/writer over; CTranslate2 with `inter_threads=T,
intra_threads=1`, the same layout (`--layouts` adds others, e.g. 1x2). Sentences are batched as
nmt batches them (sorted by length, `--batch-size` each) and submitted asynchronously, so that the
inter_threads decode batches in parallel; the length limits as `benchmarks.ct2` says.
`--max-len-a 0 --max-len-b N` gives every sentence the same limit, N tokens and the EOS (a
randomly initialised model, e.g. `python -m benchmarks import --workdir W`'s W/model.pt, runs
every output to it): both engines then decode N + 1 steps per batch, and their outputs differ by
the token CTranslate2 writes where nmt forces the EOS. Prints a markdown table (BLEU and chrF
by sacreBLEU); `--json FILE` writes the figures. `measure()` serves the distill suite too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import ct2
from benchmarks.common import (
    add_decode_args,
    add_test_set_args,
    child_env,
    peak_rss_mb,
    read_test_set,
    run_child,
    write_json,
)


def add_engine_args(p: argparse.ArgumentParser, precision: str = "fp32") -> None:
    """Which engines measure() runs, and how."""
    p.add_argument("--batch-size", type=int, help="default: the checkpoint's decode.batch_size")
    p.add_argument(
        "--precision",
        default=precision,
        help="comma-separated `nmt translate --precision` runs, e.g. fp32,int8",
    )
    p.add_argument(
        "--nmt-engines",
        default="torch,ctranslate2",
        help="comma-separated `nmt translate --engine` runs at each --precision",
    )
    p.add_argument("--quantization", default="float32,int8", help="comma-separated export types")
    p.add_argument(
        "--layouts", default="", help="CTranslate2 inter x intra threads besides Tx1, e.g. 1x2"
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument(
        "--max-len-a",
        type=float,
        help="both engines' length limit, a * source tokens + b (default: the checkpoint's "
        "decode.max_len_a and max_len_b); e.g. 0 and 30 for a randomly initialised model, "
        "whose outputs all run to the limit",
    )
    p.add_argument("--max-len-b", type=int)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks engines", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint")
    add_test_set_args(p)
    add_decode_args(p)
    add_engine_args(p)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.child and not args.checkpoint:
        p.error("--checkpoint is required")
    return args


# ------------------------------------------------------------------ the child processes


def _timed(translate: Any, texts: list[str], repeat: int) -> tuple[float, list[str]]:
    """The best of `repeat` calls' seconds, and the translations."""
    best = float("inf")
    out: list[str] = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = translate(texts)
        best = min(best, time.perf_counter() - start)
    return best, out


def _nmt_translate(spec: dict) -> Any:
    import torch

    from nmt import Translator

    torch.set_num_threads(spec["threads"])
    translator = Translator.load(
        spec["checkpoint"],
        device="cpu",
        precision=spec["precision"],
        beam=spec["beam"],
        batch_size=spec["batch_size"],
        max_len_a=spec["max_len_a"],
        max_len_b=spec["max_len_b"],
        engine=spec["nmt_engine"],
        cache_dir=spec["cache_dir"],
    )
    return translator.translate


def _ct2_translate(spec: dict) -> Any:
    import ctranslate2

    encode, decode = ct2.tokens(spec["tokenizer"])
    translator = ctranslate2.Translator(
        spec["model_dir"], device="cpu", inter_threads=spec["inter"], intra_threads=spec["intra"]
    )
    max_len = (spec["max_len_a"], spec["max_len_b"])

    def translate(texts: list[str]) -> list[str]:
        pieces = encode(texts)
        groups = ct2.batches(texts, pieces, spec["batch_size"])
        pending = ct2.translate_batches(
            translator, pieces, groups, spec["beam"], spec["lenpen"], max_len, asynchronous=True
        )
        out = [""] * len(texts)
        for ids, results in pending:
            for i, r in zip(ids, results, strict=True):
                out[i] = decode(r.result().hypotheses[0])
        return out

    return translate


def child(spec: dict) -> None:
    """One engine: load, translate spec["input"] --repeat times, write spec["output"], print
    the best time and the peak memory."""
    if spec["engine"] == "nmt":
        translate = _nmt_translate(spec)
    else:
        translate = _ct2_translate(spec)
    texts = Path(spec["input"]).read_text(encoding="utf-8").split("\n")[:-1]
    seconds, out = _timed(translate, texts, spec["repeat"])
    Path(spec["output"]).write_text("".join(t + "\n" for t in out), encoding="utf-8")
    print(json.dumps({"translate_s": seconds, "peak_rss_mb": peak_rss_mb()}))


# ------------------------------------------------------------------ the benchmark


def measure(args: argparse.Namespace, checkpoint: str, test: str) -> list[dict]:
    """Every engine of args (nmt at each --precision, CTranslate2 at each --quantization and
    layout) on one test set: a row each with its speed, peak memory, BLEU and chrF."""
    from nmt.checkpoint import load_checkpoint
    from nmt.config import config_from_dict
    from nmt.evaluate import score_corpus

    state = load_checkpoint(checkpoint)
    decode = config_from_dict(state["config"]).decode
    length_penalty = ct2.lenpen(decode)
    batch = args.batch_size or decode.batch_size
    max_len = {
        "max_len_a": decode.max_len_a if args.max_len_a is None else args.max_len_a,
        "max_len_b": decode.max_len_b if args.max_len_b is None else args.max_len_b,
    }
    args.test = test
    src = read_test_set(args, args.src)
    ref = read_test_set(args, args.tgt)
    layouts = [(args.threads, 1)]
    layouts += [tuple(map(int, x.split("x"))) for x in args.layouts.split(",") if x]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "src.txt"
        inp.write_text("".join(s + "\n" for s in src), encoding="utf-8")
        base = {
            "input": str(inp),
            "beam": args.beam,
            "batch_size": batch,
            "repeat": args.repeat,
            **max_len,
        }
        tokenizer = ct2.write_tokenizer(state, Path(tmp) / "tokenizer")
        runs: list[tuple[str, dict, float | None]] = []
        for precision in args.precision.split(","):
            for nmt_engine in args.nmt_engines.split(","):
                spec = {
                    "engine": "nmt",
                    "nmt_engine": nmt_engine,
                    "cache_dir": str(Path(tmp) / "cache"),
                    "checkpoint": checkpoint,
                    "threads": args.threads,
                    "precision": precision,
                }
                runs.append((f"nmt translate --engine {nmt_engine} ({precision})", spec, None))
        for quantization in args.quantization.split(","):
            model_dir = Path(tmp) / quantization
            size = ct2.export(checkpoint, model_dir, quantization)
            for inter, intra in layouts:
                spec = {
                    "engine": "ct2",
                    "tokenizer": tokenizer,
                    "model_dir": str(model_dir),
                    "inter": inter,
                    "intra": intra,
                    "lenpen": length_penalty,
                }
                runs.append((f"CTranslate2 {quantization} ({inter}×{intra})", spec, size))
        first: list[str] = []
        for n, (name, spec, size) in enumerate(runs):
            out = Path(tmp) / f"{n}.txt"
            start = time.perf_counter()
            figures = run_child(
                "engines", {**base, **spec, "output": str(out)}, env=child_env(args.threads)
            )
            figures["process_s"] = time.perf_counter() - start
            hyps = out.read_text(encoding="utf-8").split("\n")[:-1]
            first = first or hyps
            bleu, chrf = (s.score for s in score_corpus(hyps, [ref], metrics=("bleu", "chrf")))
            same = sum(a == b for a, b in zip(hyps, first, strict=True))
            rows.append(
                {
                    "checkpoint": checkpoint,
                    "test": test,
                    "engine": name,
                    "model_mb": size,
                    "sentences": len(src),
                    "beam": args.beam,
                    "batch_size": batch,
                    "lenpen": length_penalty,
                    "threads": args.threads,
                    **figures,
                    "sent_per_s": len(src) / figures["translate_s"],
                    "bleu": bleu,
                    "chrf": chrf,
                    "same_as_first": same,
                }
            )
    return rows


def caption(row: dict) -> str:
    """What a row of measure() was measured on, in words."""
    return (
        f"{row['test']}, {row['sentences']} sentences, beam {row['beam']}, batch "
        f"{row['batch_size']}, lenpen {row['lenpen']}, {row['threads']} threads"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return []
    rows = measure(args, args.checkpoint, args.test)
    first = rows[0]
    print(caption(first) + "\n")
    print(
        "| engine | translate s | sent/s | process s | peak RSS MB | BLEU | chrF | identical to "
        f"{first['engine']} |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['engine']} | {r['translate_s']:.2f} | {r['sent_per_s']:.1f} | "
            f"{r['process_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
            f"{r['same_as_first']} / {r['sentences']} |"
        )
    write_json(args.json, rows)
    sys.stdout.flush()
    return rows
