"""`nmt translate` on a Multi30k test set: speed, peak memory, BLEU.

    python -m benchmarks translate --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--data-dir ../shared/data/multi30k] [--test test_2016_flickr] [--beam 5] [--threads 2]

Two measurements of the same decoding settings:
- translation time: in this process, with the model loaded and the source encoded, the time
  of `translate_token_lists` alone (best of `--repeat` runs), and the detokenized output's
  BLEU against the reference (nmt.evaluate);
- whole command: the real CLI (`python -m nmt translate -i ... -o ...`) in a subprocess:
  wall time including start-up and loading, and its peak RSS (getrusage of the children).
  Its output must equal the in-process one.

Prints one markdown table row (`--header` adds the header); `--json FILE` writes the figures.
Works with any checkpoint in nmt's format. A random (untrained) model never emits EOS and
decodes to the maximum length: cap it with --max-len-a / --max-len-b and say so.

OMP_WAIT_POLICY (inherited by the subprocess) matters: on cores shared with other busy
processes, PASSIVE avoids spinning OpenMP threads and was several times faster; on an idle
machine the default (spinning) is faster (measured 71.9 vs 44.7 sentences/s with PASSIVE).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    add_decode_args,
    add_test_set_args,
    children_peak_rss_mb,
    read_test_set,
    write_json,
)

HEADER = (
    "| checkpoint | device | threads × workers | beam | batch | sentences | translate s | sent/s "
    "| tok/s | command s | command sent/s | peak RSS MB | BLEU |\n| --- | --- | --- | --- | --- | "
    "--- | --- | --- | --- | --- | --- | --- | --- |"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks translate", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint", help="default: runs/m30k*/checkpoint_avg.pt")
    add_test_set_args(p)
    add_decode_args(p)
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="batches decoded at once (nmt translate --workers); 0 = one per thread",
    )
    p.add_argument("--batch-size", type=int, help="default: the checkpoint's decode.batch_size")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--max-len-a", type=float)
    p.add_argument("--max-len-b", type=int)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--shortlist", help="a file from `nmt shortlist` (nmt translate --shortlist)")
    p.add_argument(
        "--join",
        type=int,
        default=1,
        help="join every N consecutive lines (source and reference) into one, for longer "
        "inputs: Multi30k's ~13 tokens x 2 is about a WMT sentence's ~27",
    )
    p.add_argument("--repeat", type=int, default=1, help="in-process runs; the best counts")
    p.add_argument("--no-command", action="store_true", help="skip the whole-command run")
    p.add_argument("--header", action="store_true")
    p.add_argument("--json", help="also write the figures to this file ('-': stdout)")
    return p.parse_args(argv)


def find_checkpoint(given: str | None) -> Path:
    if given:
        checkpoint = Path(given)
    else:
        found = sorted(ROOT.glob("runs/m30k*/checkpoint_avg.pt"))
        if not found:
            sys.exit("no --checkpoint given and no runs/m30k*/checkpoint_avg.pt")
        checkpoint = found[-1]
    if not checkpoint.is_file():
        sys.exit(f"{checkpoint}: checkpoint not found")
    return checkpoint


def joined(lines: list[str], n: int) -> list[str]:
    """Every `n` consecutive lines joined into one."""
    if n <= 1:
        return lines
    return [" ".join(lines[i : i + n]) for i in range(0, len(lines), n)]


def decode_options(args: argparse.Namespace) -> dict[str, Any]:
    """The decode settings both runs use, as TranslateOptions / DecodeConfig fields."""
    options = {
        "beam": args.beam,
        "batch_size": args.batch_size,
        "max_tokens": args.max_tokens,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
    }
    return {key: value for key, value in options.items() if value is not None}


def cli_args(options: dict[str, Any]) -> list[str]:
    args = []
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    checkpoint = find_checkpoint(args.checkpoint)
    sentences = args.sentences
    args.sentences = 0  # joined first, then cut
    src = joined(read_test_set(args, args.src), args.join)
    refs = joined(read_test_set(args, args.tgt), args.join)
    if sentences:
        src = src[:sentences]
        refs = refs[:sentences]

    import torch

    from nmt.decoding.predict import (
        decode_workers,
        load_models,
        load_shortlist_for,
        translate_token_lists,
    )
    from nmt.evaluate import corpus_bleu

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    loaded = load_models([checkpoint], device, args.precision)
    cfg = replace(loaded.config.decode, **decode_options(args))
    workers = decode_workers(args.workers, device)
    shortlist = None
    if args.shortlist:
        shortlist = load_shortlist_for(args.shortlist, loaded, cfg.beam)
    seqs = [loaded.tokenizer.encode(s) if s.strip() else [] for s in src]
    times = []
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        hyps = translate_token_lists(
            loaded.model,
            seqs,
            cfg,
            specials=loaded.tokenizer.specials,
            device=device,
            precision=args.precision,
            max_positions=loaded.max_positions,
            workers=workers,
            shortlist=shortlist,
        )
        times.append(time.perf_counter() - start)
    seconds = min(times)
    outputs = [loaded.tokenizer.decode(h[0].tokens) if h else "" for h in hyps]
    out_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)  # EOS included: one step each
    result = {
        "checkpoint": str(checkpoint),
        "test": args.test,
        "join": args.join,
        "device": args.device,
        "threads": args.threads,
        "workers": workers,
        "precision": args.precision,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "beam": cfg.beam,
        "batch_size": cfg.batch_size,
        "shortlist": args.shortlist or "",
        "max_tokens": cfg.max_tokens,
        "max_len_a": cfg.max_len_a,
        "max_len_b": cfg.max_len_b,
        "sentences": len(src),
        "translate_s": seconds,
        "translate_s_all": times,
        "sent_per_s": len(src) / seconds,
        "tgt_tokens": out_tokens,
        "tok_per_s": out_tokens / seconds,
        "mean_output_tokens": out_tokens / max(1, len(src)),
        "bleu": corpus_bleu(outputs, [refs]),
    }
    if not args.no_command:
        result.update(run_command(args, checkpoint, src, outputs))
    print_row(result, args.header)
    write_json(args.json, result)
    return result


def run_command(
    args: argparse.Namespace, checkpoint: Path, src: list[str], expected: list[str]
) -> dict:
    """The real CLI in a subprocess: wall time, peak RSS, and its output checked."""
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "src.txt"
        out = Path(tmp) / "out.txt"
        inp.write_text("".join(s + "\n" for s in src), encoding="utf-8")
        cmd = [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "-c",
            str(checkpoint),
            "-i",
            str(inp),
            "-o",
            str(out),
            "--threads",
            str(args.threads),
            "--workers",
            str(args.workers),
            "--device",
            args.device,
            "--precision",
            args.precision,
            *cli_args(decode_options(args)),
        ]
        if args.shortlist:
            cmd += ["--shortlist", args.shortlist]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(f"nmt translate failed ({proc.returncode}):\n{proc.stderr}")
        got = out.read_text(encoding="utf-8").split("\n")[:-1]
    from nmt.api import clean_output

    same = got == [clean_output(e) for e in expected]
    if not same:
        print(
            "warning: the command's output differs from the in-process translation", file=sys.stderr
        )
    return {
        "command_s": seconds,
        "command_sent_per_s": len(src) / seconds,
        "peak_rss_mb": children_peak_rss_mb(),  # the only child so far: its peak is ours to report
        "command_output_matches": same,
    }


def print_row(r: dict, header: bool) -> None:
    if header:
        print(HEADER)
    batch = f"{r['max_tokens']} tok" if r["max_tokens"] else str(r["batch_size"])
    if "command_s" in r:
        command = f"{r['command_s']:.2f} | {r['command_sent_per_s']:.1f} | {r['peak_rss_mb']:.0f}"
    else:
        command = "- | - | -"
    name = Path(r["checkpoint"]).name
    if r.get("shortlist"):
        name += f" + {Path(r['shortlist']).name}"
    print(
        f"| {name} | {r['device']} {r['precision']} | {r['threads']} × {r['workers']} | "
        f"{r['beam']} | {batch} | {r['sentences']} | {r['translate_s']:.2f} | "
        f"{r['sent_per_s']:.1f} | {r['tok_per_s']:.0f} | {command} | {r['bleu']:.2f} |"
    )
