"""Where `nmt translate`'s decoding time goes, next to CTranslate2 on the same weights.

    python -m benchmarks profile-decode --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--sentences 200] [--batch-size 32] [--beam 5] [--threads 1]

One process, `--threads` intra-op threads (1 by default: one core, so that every
millisecond is attributed to one op), the first `--sentences` lines of the test set
(Multi30k test_2016_flickr from ../shared or `--data-dir`), decoded twice by each engine;
the second run counts.
- nmt: the `Translator` API under torch.profiler. The table groups every op's self CPU time
  by what it is (matrix products, attention, the output layer's softmax, the search's top-k,
  the cache's copies, the rest), and "outside torch ops" is the wall time no op accounts
  for: Python, the dispatcher, the search's own bookkeeping.
- CTranslate2: the checkpoint exported with `nmt export` (float32 and int8), the same
  batches (sorted by length), beam and length penalty; with `--ct2-profile`, CTranslate2's
  own profiler where the installed build has it.
Prints markdown tables; figures go into docs/benchmarks.md with the date, commit and CPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import ct2
from benchmarks.common import add_decode_args, add_test_set_args, read_test_set, write_json

# what an op is, by the first pattern its name contains (aten::addmm, aten::mm, ...)
GROUPS = [
    (
        "matrix products",
        ("addmm", "aten::mm", "bmm", "linear", "matmul", "quantized", "fbgemm", "dynamic"),
    ),
    ("attention", ("scaled_dot_product", "_softmax", "baddbmm", "flash")),
    ("output softmax", ("log_softmax",)),
    (
        "search: top-k, sort, gather",
        ("topk", "sort", "gather", "argmax", "max", "scatter", "nonzero"),
    ),
    (
        "cache: cat, index, copy",
        ("cat", "index", "copy_", "clone", "contiguous", "narrow", "select", "slice"),
    ),
    ("layer norm", ("layer_norm",)),
    (
        "elementwise",
        ("add", "mul", "relu", "gelu", "div", "sub", "where", "masked_fill", "fill_", "eq", "ne"),
    ),
]


def group_of(name: str) -> str:
    for group, patterns in GROUPS:
        if any(p in name for p in patterns):
            return group
    return "other ops"


def decode_arguments(p: argparse.ArgumentParser, sentences: int) -> None:
    """The checkpoint, the test set, and the batches, beam, threads and precision of one engine's
    decoding (this suite's and perf-decode's)."""
    p.add_argument("--checkpoint", help="required")
    add_test_set_args(p, sentences)
    add_decode_args(p, threads=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", default="fp32", choices=("fp32", "int8"), help="nmt's")


def nmt_translator(args: argparse.Namespace) -> Any:
    """nmt's `Translator` of `decode_arguments`: one worker of `--threads` threads."""
    import torch

    from nmt import Translator

    torch.set_num_threads(args.threads)
    return Translator.load(
        args.checkpoint,
        device="cpu",
        beam=args.beam,
        batch_size=args.batch_size,
        threads=args.threads,
        workers=1,
        precision=args.precision,
    )


def profile_nmt(
    args: argparse.Namespace, texts: list[str]
) -> tuple[float, dict[str, float], list[tuple[str, float, int]]]:
    from torch.profiler import ProfilerActivity, profile

    translator = nmt_translator(args)
    translator.translate(texts)  # warm-up: allocator, kernels chosen
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        translator.translate(texts)
        wall = time.perf_counter() - start
    groups: dict[str, float] = defaultdict(float)
    ops = []
    for e in prof.key_averages():
        seconds = e.self_cpu_time_total / 1e6
        groups[group_of(e.key)] += seconds
        ops.append((e.key, seconds, e.count))
    groups["outside torch ops"] = wall - sum(s for _, s, _ in ops)
    return wall, dict(groups), sorted(ops, key=lambda o: -o[1])


def ct2_decoder(
    args: argparse.Namespace,
    texts: list[str],
    model_dir: Path,
    tokenizer: str,
    lenpen: float,
    max_len: tuple[float, float],
) -> Callable[[], None]:
    """A function that decodes `texts` once with CTranslate2 (1 x `--threads`) as nmt batches them:
    `--batch-size` sentences sorted by length, each batch limited as nmt limits its longest source,
    beam and length penalty as nmt's."""
    import ctranslate2

    translator = ctranslate2.Translator(
        str(model_dir), device="cpu", inter_threads=1, intra_threads=args.threads
    )
    pieces = ct2.tokens(tokenizer)[0](texts)
    groups = ct2.batches(texts, pieces, args.batch_size)

    def decode() -> None:
        ct2.translate_batches(translator, pieces, groups, args.beam, lenpen, max_len)

    return decode


def time_ct2(
    args: argparse.Namespace,
    texts: list[str],
    model_dir: Path,
    tokenizer: str,
    lenpen: float,
    max_len: tuple[float, float],
) -> float:
    decode = ct2_decoder(args, texts, model_dir, tokenizer, lenpen, max_len)

    def run() -> float:
        start = time.perf_counter()
        decode()
        return time.perf_counter() - start

    run()
    if args.ct2_profile:
        from ctranslate2 import profiling

        try:
            profiling.init_profiler(num_threads=args.threads)
        except Exception as e:  # a build without profiling support says so
            print(f"CTranslate2 profiler: {e}")
            return run()
        seconds = run()
        profiling.dump_profiler()
        return seconds
    return run()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks profile-decode", description=__doc__.split("\n\n")[0]
    )
    decode_arguments(p, sentences=200)
    p.add_argument("--top", type=int, default=15, help="ops listed")
    p.add_argument("--ct2-profile", action="store_true")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if not args.checkpoint:
        p.error("--checkpoint is required")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    texts = read_test_set(args)

    import torch

    from nmt.checkpoint import load_checkpoint
    from nmt.config import config_from_dict

    state = load_checkpoint(args.checkpoint, map_location="cpu")
    decode = config_from_dict(state["config"]).decode
    wall, groups, ops = profile_nmt(args, texts)
    print(
        f"## nmt ({args.precision}), {len(texts)} sentences, batch {args.batch_size}, beam "
        f"{args.beam}, {args.threads} thread(s), torch {torch.__version__}: {wall:.2f} s, "
        f"{len(texts) / wall:.1f} sent/s\n"
    )
    print("| what | self s | share |\n| --- | ---: | ---: |")
    for name, s in sorted(groups.items(), key=lambda g: -g[1]):
        print(f"| {name} | {s:.3f} | {s / wall:.1%} |")
    print("\n| op | self s | calls |\n| --- | ---: | ---: |")
    for name, s, n in ops[: args.top]:
        print(f"| `{name}` | {s:.3f} | {n:,} |")
    figures: dict[str, Any] = {"nmt_s": wall, "groups": groups, "ct2_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = ct2.write_tokenizer(state, Path(tmp) / "tokenizer")
        for quantization in ("float32", "int8"):
            model_dir = Path(tmp) / quantization
            ct2.export(args.checkpoint, model_dir, quantization)
            max_len = (decode.max_len_a, decode.max_len_b)
            seconds = time_ct2(args, texts, model_dir, tokenizer, ct2.lenpen(decode), max_len)
            figures["ct2_s"][quantization] = seconds
            print(
                f"\nCTranslate2 {quantization}, the same batches, 1 x {args.threads} thread(s): "
                f"{seconds:.2f} s, {len(texts) / seconds:.1f} sent/s ({wall / seconds:.2f}x nmt's "
                f"{args.precision} time)"
            )
    write_json(args.json, figures)
    return figures
