"""Where each engine's decoding time goes, sampled by Linux `perf` (no profiler in the process,
so nothing is slowed): nmt next to CTranslate2 on the same weights and batches.

    python -m benchmarks perf-decode --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--sentences 200] [--batch-size 32] [--beam 5] [--threads 1] [--precision fp32|int8]
        [--repeat 5]

Each engine runs in a process of its own: it loads, decodes the first `--sentences` lines of the
test set once (warm-up), then `perf record -F 999 -p PID` attaches and the process decodes them
`--repeat` more times and exits. nmt: the `Translator` API, one worker of `--threads` threads;
CTranslate2: `nmt export`'s model (`--precision` int8: CTranslate2's int8), the same batches sorted
by length, beam and length penalty (the profile-decode suite's `ct2_decoder`). Each sampled
function is grouped by what it is, and its share of the samples is turned into seconds of one
decode. Needs `perf` (Debian's linux-perf) and leave to use it (perf_event_paranoid <= 1, or root).
Prints a markdown table; figures go into docs/benchmarks.md with the date, commit and CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import ct2
from benchmarks.common import Worker, child_env, read_test_set, serve_requests, write_json
from benchmarks.profile_decode import ct2_decoder, decode_arguments, nmt_translator

# a sample's group: the first whose pattern matches "dso symbol"
GROUPS = [
    (
        "matrix products (MKL, oneDNN, fbgemm; JIT code; int8 (re)quantisation)",
        re.compile(r"\[JIT\]|gemm|gemv|mkl_blas|dnnl|fbgemm|jit_|brg", re.I),
    ),
    ("Python interpreter", re.compile(r"libpython|python3")),
    (
        "engine: torch or CTranslate2 (attention, copies, softmax, top-k, dispatch)",
        re.compile(r"libtorch|libc10|libctranslate2|_C\.|torch"),
    ),
    ("C library (memory copies, malloc)", re.compile(r"libc\.so|libm\.so|libstdc")),
]
OTHER = "the OS kernel and the rest"


def child(spec: dict) -> None:
    """Load, warm up, say ready; then for each request decode `--repeat` times and answer the
    seconds of one."""
    args = argparse.Namespace(**spec)
    texts = read_test_set(args)
    if args.engine == "nmt":
        translator = nmt_translator(args)

        def run() -> None:
            translator.translate(texts)

    else:
        max_len = (args.max_len_a, args.max_len_b)
        run = ct2_decoder(args, texts, Path(args.ct2_model), args.tokenizer, args.lenpen, max_len)
    run()

    def answer() -> dict:
        start = time.perf_counter()
        for _ in range(args.repeat):
            run()
        return {"seconds": (time.perf_counter() - start) / args.repeat}

    serve_requests(answer)


def sample(spec: dict, out: Path) -> tuple[float, dict[str, float]]:
    """Run a child under perf: (seconds of one decode, each group's share of the samples)."""
    worker = Worker("perf-decode", spec, child_env(spec["threads"]))
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-F", "999", "-p", str(worker.pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)  # perf attaches
    seconds = worker.run()["seconds"]
    worker.close()
    perf.wait()
    report = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            str(out),
            "--no-children",
            "--sort",
            "dso,sym",
            "-g",
            "none",
            "--stdio",
            "--percent-limit",
            "0",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S.*)$", line)
        if m:
            what = m.group(2)
            group = next((g for g, pattern in GROUPS if pattern.search(what)), OTHER)
            shares[group] += float(m.group(1)) / 100
    return seconds, shares


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks perf-decode", description=__doc__.split("\n\n")[0]
    )
    decode_arguments(p, sentences=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    if not args.checkpoint:
        p.error("--checkpoint is required")
    if not shutil.which("perf"):
        sys.exit("perf-decode: needs Linux perf (apt-get install linux-perf)")

    from nmt.checkpoint import load_checkpoint
    from nmt.config import config_from_dict

    state = load_checkpoint(args.checkpoint, map_location="cpu")
    decode = config_from_dict(state["config"]).decode
    common = {key: value for key, value in vars(args).items() if key not in ("json", "child")}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "ct2"
        ct2.export(args.checkpoint, model, "int8" if args.precision == "int8" else "float32")
        ct2_spec = {
            **common,
            "engine": "ct2",
            "ct2_model": str(model),
            "tokenizer": ct2.write_tokenizer(state, Path(tmp) / "tokenizer"),
            "lenpen": ct2.lenpen(decode),
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
        }
        runs = {
            "nmt": sample({**common, "engine": "nmt"}, Path(tmp) / "nmt.data"),
            "CTranslate2": sample(ct2_spec, Path(tmp) / "ct2.data"),
        }
    n = len(read_test_set(args))
    print(
        f"{n} sentences, batch {args.batch_size}, beam {args.beam}, {args.threads} thread(s), "
        f"{args.precision}; seconds of one decode (mean of {args.repeat}), split by perf's "
        "samples\n"
    )
    names = list(runs)
    print(
        "| what | " + " | ".join(f"{e} s" for e in names) + " |\n| --- |" + " ---: |" * len(names)
    )
    for group in [g for g, _ in GROUPS] + [OTHER]:
        cells = " | ".join(f"{runs[e][0] * runs[e][1].get(group, 0):.3f}" for e in names)
        print(f"| {group} | {cells} |")
    cells = " | ".join(f"{runs[e][0]:.3f} ({n / runs[e][0]:.1f} sent/s)" for e in names)
    print(f"| whole decode | {cells} |")
    figures = {e: {"seconds": runs[e][0], "shares": runs[e][1]} for e in names}
    write_json(args.json, figures)
    return figures
