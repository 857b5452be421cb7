"""Benchmark CTranslate2 (after `nmt export`) against `nmt translate`: speed, peak memory, BLEU,
and how many translations are identical.

    .venv/bin/python scripts/bench_ctranslate2.py --checkpoint runs/m30k/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--beam 5] [--threads 2]

The checkpoint is exported once per `--quantization` (float32 = no quantization) into a
temporary directory with `nmt export`. Each engine then runs in its own subprocess, which
loads the model, translates the test set and writes it; we report
- `translate s`: the translation alone, timed inside that process (model loaded; the
  sentencepiece encoding and decoding included for both engines), best of `--repeat`;
- `process s` and `peak RSS MB`: the whole subprocess (start-up, imports, loading), its wall
  time and its own peak resident memory (VmHWM at its end; a child's getrusage would start
  from this process's own RSS, which Linux carries over fork and exec).
nmt runs at each `--precision` (fp32; fp32,int8 adds `nmt translate --precision int8`) with
`--threads T` and its default workers (one per thread), through the Python API
that `nmt translate` is a reader/writer over; CTranslate2 with `inter_threads=T,
intra_threads=1`, the same layout (`--layouts` adds others, e.g. 1x2).
CTranslate2 decodes with the settings that equal nmt's `length` style (length_penalty =
lenpen, |Y| counting EOS via return_end_token, disable_unk); the checkpoint's lenpen_style
must be `length` (or `none` with lenpen 0) for the outputs to be comparable. Sentences are
batched as nmt batches them (sorted by length, `--batch-size` each) and submitted
asynchronously, so that the inter_threads decode batches in parallel. CTranslate2's length
limit (`max_decoding_length`) is one number per call, so each batch gets nmt's limit for its
longest source, max_len_a * (tokens + 1) + max_len_b (+1 for the EOS step); where a shorter
sentence of the batch reaches its own nmt limit (an under-trained model repeating itself),
nmt stops it with EOS and CTranslate2 goes on, so such outputs differ. `--max-len-a 0
--max-len-b N` gives every sentence the same limit, N tokens and the EOS (a randomly
initialised model, e.g. `bench_import.py --workdir W`'s W/model.pt, runs every output to it):
both engines then decode N + 1 steps per batch, and their outputs differ by the token
CTranslate2 writes where nmt forces the EOS. CTranslate2's pieces come from, and go back to
text through, the checkpoint's own tokenizer (`ct2_tokens`), an imported model's too.
Prints a markdown table (BLEU and chrF by sacreBLEU); `--json FILE` writes the figures.
`measure()` is the same for other scripts (bench_distill.py: several checkpoints and test sets).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
from bench_translate import add_test_set_args  # noqa: E402


def add_engine_args(p: argparse.ArgumentParser, precision: str = "fp32") -> None:
    """Which engines measure() runs, and how."""
    p.add_argument("--batch-size", type=int, help="default: the checkpoint's decode.batch_size")
    p.add_argument("--precision", default=precision, help="comma-separated `nmt translate --precision` runs, e.g. fp32,int8")
    p.add_argument("--quantization", default="float32,int8", help="comma-separated export types")
    p.add_argument("--layouts", default="", help="CTranslate2 inter x intra threads besides Tx1, e.g. 1x2")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--max-len-a", type=float, help="both engines' length limit, a * source tokens + b "
                   "(default: the checkpoint's decode.max_len_a and max_len_b); e.g. 0 and 30 for a "
                   "randomly initialised model, whose outputs all run to the limit")
    p.add_argument("--max-len-b", type=int)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    add_test_set_args(p)
    add_engine_args(p)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--worker", nargs=2, metavar=("ENGINE", "SPEC"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------ the worker processes


def _nmt_worker(spec: dict) -> dict:
    import torch

    from nmt import Translator

    torch.set_num_threads(spec["threads"])
    translator = Translator.load(spec["checkpoint"], device="cpu", precision=spec["precision"], beam=spec["beam"],
                                 batch_size=spec["batch_size"], max_len_a=spec["max_len_a"],
                                 max_len_b=spec["max_len_b"])
    texts = Path(spec["input"]).read_text(encoding="utf-8").split("\n")[:-1]
    best, out = float("inf"), []
    for _ in range(spec["repeat"]):
        start = time.perf_counter()
        out = translator.translate(texts)
        best = min(best, time.perf_counter() - start)
    Path(spec["output"]).write_text("".join(t + "\n" for t in out), encoding="utf-8")
    return {"translate_s": best}


def ct2_tokens(tokenizer_file: str) -> tuple[Callable[[list[str]], list[list[str]]], Callable[[list[str]], str]]:
    """A checkpoint's own tokenizer (nmt's, of either kind: one sentencepiece model, or an imported
    model's source and target models over a vocabulary; `tokenizer_file` as `write_tokenizer`
    wrote it) as CTranslate2 takes and gives tokens: texts -> their source pieces (no EOS:
    `nmt export`'s config adds it), and an output's pieces -> the text nmt writes for them."""
    from nmt.tokenizer import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    source, target = tok.vocabularies()
    ids = {piece: i for i, piece in enumerate(target)}

    def encode(texts: list[str]) -> list[list[str]]:
        return [[source[i] for i in seq] for seq in tok.encode_batch(texts)]

    def decode(pieces: list[str]) -> str:
        return tok.decode([ids.get(p, tok.specials.unk) for p in pieces if p != "</s>"])

    return encode, decode


def write_tokenizer(state: dict, path: Path) -> str:
    """The tokenizer of a loaded checkpoint `state`, written to `path` for `ct2_tokens` (so that a
    CTranslate2 process need not load the checkpoint's weights)."""
    path.write_bytes(state["tokenizer"]["model"])
    return str(path)


def _ct2_worker(spec: dict) -> dict:
    import ctranslate2

    encode, decode = ct2_tokens(spec["tokenizer"])
    translator = ctranslate2.Translator(spec["model_dir"], device="cpu", inter_threads=spec["inter"],
                                       intra_threads=spec["intra"])
    texts = Path(spec["input"]).read_text(encoding="utf-8").split("\n")[:-1]
    best, out = float("inf"), []
    for _ in range(spec["repeat"]):
        start = time.perf_counter()
        pieces = encode(texts)
        order = sorted((i for i, t in enumerate(texts) if t.strip()), key=lambda i: -len(pieces[i]))
        pending = []  # nmt's batching by length, and its length limit per batch (the longest source's)
        for b in range(0, len(order), spec["batch_size"]):
            ids = order[b : b + spec["batch_size"]]
            limit = max(int(spec["max_len_a"] * (len(pieces[i]) + 1) + spec["max_len_b"]) for i in ids) + 1
            pending.append((ids, translator.translate_batch(
                [pieces[i] for i in ids], beam_size=spec["beam"], length_penalty=spec["lenpen"],
                return_end_token=True, disable_unk=True, max_decoding_length=limit, asynchronous=True)))
        out = [""] * len(texts)
        for ids, results in pending:  # asynchronous: the inter_threads decode batches in parallel
            for i, r in zip(ids, results, strict=True):
                out[i] = decode(r.result().hypotheses[0])
        best = min(best, time.perf_counter() - start)
    Path(spec["output"]).write_text("".join(t + "\n" for t in out), encoding="utf-8")
    return {"translate_s": best}


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_worker(engine: str, spec: dict, threads: int) -> dict:
    """This script as a subprocess in worker mode: its figures, wall time and own peak RSS."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--checkpoint", "-", "--worker", engine, json.dumps(spec)],
                          stdout=subprocess.PIPE, env=env, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{engine} worker failed ({proc.returncode})")
    return {**json.loads(proc.stdout), "process_s": seconds}


# ------------------------------------------------------------------ the benchmark


def measure(args: argparse.Namespace, checkpoint: str, test: str) -> list[dict]:
    """Every engine of args (nmt at each --precision, CTranslate2 at each --quantization and
    layout) on one test set: a row each with its speed, peak memory, BLEU and chrF."""
    from nmt.checkpoint import load_checkpoint
    from nmt.config import config_from_dict
    from nmt.convert.ctranslate2 import export
    from nmt.evaluate import score_corpus
    from nmt.textio import read_lines

    state = load_checkpoint(checkpoint)
    decode = config_from_dict(state["config"]).decode
    if not (decode.lenpen_style == "length" or (decode.lenpen_style == "none" and decode.lenpen == 0)):
        sys.exit(f"decode.lenpen_style {decode.lenpen_style}: CTranslate2 normalises by length only")
    lenpen = decode.lenpen if decode.lenpen_style == "length" else 0.0
    batch = args.batch_size or decode.batch_size
    max_len = {"max_len_a": decode.max_len_a if args.max_len_a is None else args.max_len_a,
               "max_len_b": decode.max_len_b if args.max_len_b is None else args.max_len_b}
    prefix = Path(args.data_dir) / test
    src = list(read_lines(next(prefix.parent.glob(f"{prefix.name}.{args.src}*"))))
    ref = list(read_lines(next(prefix.parent.glob(f"{prefix.name}.{args.tgt}*"))))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "src.txt"
        inp.write_text("".join(s + "\n" for s in src), encoding="utf-8")
        base = {"input": str(inp), "beam": args.beam, "batch_size": batch, "repeat": args.repeat, **max_len}
        tokenizer = write_tokenizer(state, Path(tmp) / "tokenizer")
        runs = [(f"nmt translate ({p})", "nmt", {"checkpoint": checkpoint, "threads": args.threads, "precision": p}, None)
                for p in args.precision.split(",")]
        for q in args.quantization.split(","):
            model_dir = Path(tmp) / q
            export(checkpoint, model_dir, quantization=None if q == "float32" else q)
            size = (model_dir / "model.bin").stat().st_size / 2**20
            layouts = [(args.threads, 1)] + [tuple(map(int, x.split("x"))) for x in args.layouts.split(",") if x]
            for inter, intra in layouts:
                runs.append((f"CTranslate2 {q} ({inter}×{intra})", "ct2",
                             {"tokenizer": tokenizer, "model_dir": str(model_dir), "inter": inter, "intra": intra,
                              "lenpen": lenpen}, size))
        outputs: dict[str, list[str]] = {}
        for name, engine, spec, size in runs:
            out = Path(tmp) / f"{len(outputs)}.txt"
            figures = run_worker(engine, {**base, **spec, "output": str(out)}, args.threads)
            hyps = out.read_text(encoding="utf-8").split("\n")[:-1]
            outputs[name] = hyps
            bleu, chrf = (s.score for s in score_corpus(hyps, [ref], metrics=("bleu", "chrf")))
            same = sum(a == b for a, b in zip(hyps, outputs[runs[0][0]], strict=True))
            rows.append({"checkpoint": checkpoint, "test": test, "engine": name, "model_mb": size,
                         "sentences": len(src), "beam": args.beam, "batch_size": batch, "lenpen": lenpen,
                         "threads": args.threads, **figures, "sent_per_s": len(src) / figures["translate_s"],
                         "bleu": bleu, "chrf": chrf, "same_as_first": same})
    return rows


def caption(row: dict) -> str:
    """What a row of measure() was measured on, in words."""
    return (f"{row['test']}, {row['sentences']} sentences, beam {row['beam']}, batch {row['batch_size']}, "
            f"lenpen {row['lenpen']}, {row['threads']} threads")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        engine, spec = args.worker
        figures = (_nmt_worker if engine == "nmt" else _ct2_worker)(json.loads(spec))
        print(json.dumps({**figures, "peak_rss_mb": peak_rss_mb()}))
        return
    rows = measure(args, args.checkpoint, args.test)
    r0 = rows[0]
    print(caption(r0) + "\n")
    print(f"| engine | translate s | sent/s | process s | peak RSS MB | BLEU | chrF | identical to {r0['engine']} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['engine']} | {r['translate_s']:.2f} | {r['sent_per_s']:.1f} | {r['process_s']:.1f} | "
              f"{r['peak_rss_mb']:.0f} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['same_as_first']} / {r['sentences']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
