"""Where each engine's decoding time goes, sampled by Linux `perf` (no profiler in the process,
so nothing is slowed): nmt next to CTranslate2 on the same weights and batches.

    .venv/bin/python scripts/perf_decode.py --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--sentences 200] [--batch-size 32] [--beam 5] [--threads 1] [--precision fp32|int8] [--repeat 5]

Each engine runs in a process of its own: it loads, decodes the first `--sentences` lines of the
test set once (warm-up), then `perf record -F 999 -p PID` attaches and the process decodes them
`--repeat` more times and exits. nmt: the `Translator` API, one worker of `--threads` threads;
CTranslate2: `nmt export`'s model (`--precision` int8: CTranslate2's int8), the same batches sorted
by length, beam and length penalty (scripts/profile_decode.py's `time_ct2`). Each sampled
function is grouped by what it is, and its share of the samples is turned into seconds of one
decode. Needs `perf` (Debian's linux-perf) and leave to use it (perf_event_paranoid <= 1, or root).
Prints a markdown table; figures go into docs/benchmarks.md with the date, commit and CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from profile_decode import ct2_decoder, decode_arguments, nmt_translator, read_source  # noqa: E402

# a sample's group: the first whose pattern matches "dso symbol"
GROUPS = [
    ("matrix products (MKL, oneDNN, fbgemm; JIT code; int8 (re)quantisation)",
     re.compile(r"\[JIT\]|gemm|gemv|mkl_blas|dnnl|fbgemm|jit_|brg", re.I)),
    ("Python interpreter", re.compile(r"libpython|python3")),
    ("engine: torch or CTranslate2 (attention, copies, softmax, top-k, dispatch)", re.compile(r"libtorch|libc10|libctranslate2|_C\.|torch")),
    ("C library (memory copies, malloc)", re.compile(r"libc\.so|libm\.so|libstdc")),
]
OTHER = "the OS kernel and the rest"


def child(args: argparse.Namespace) -> None:
    """Load, warm up, say "ready", wait for a line, decode `--repeat` times, print the seconds of one."""
    texts = read_source(args)
    if args.engine == "nmt":
        tr = nmt_translator(args)
        run = lambda: tr.translate(texts)  # noqa: E731
    else:
        run = ct2_decoder(args, texts, Path(args.ct2_model), args.tokenizer, args.lenpen, tuple(args.max_len))
    run()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    for _ in range(args.repeat):
        run()
    print(f"{(time.perf_counter() - start) / args.repeat:.4f}", flush=True)


def sample(argv: list[str], out: Path) -> tuple[float, dict[str, float]]:
    """Run a child under perf: (seconds of one decode, each group's share of the samples)."""
    env = {**os.environ, "OMP_NUM_THREADS": argv[argv.index("--threads") + 1]}
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin and proc.stdout
    if proc.stdout.readline().strip() != "ready":
        sys.exit(f"perf_decode: the {argv[argv.index('--engine') + 1]} process failed")
    perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-p", str(proc.pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # perf attaches
    proc.stdin.write("go\n")
    proc.stdin.flush()
    seconds = float(proc.stdout.readline())
    proc.wait()
    perf.wait()
    report = subprocess.run(["perf", "report", "-i", str(out), "--no-children", "--sort", "dso,sym", "-g", "none",
                             "--stdio", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    shares: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S.*)$", line)
        if m:
            what = m.group(2)
            shares[next((g for g, pat in GROUPS if pat.search(what)), OTHER)] += float(m.group(1)) / 100
    return seconds, shares


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    decode_arguments(p, sentences=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--engine", help=argparse.SUPPRESS)  # the child's options
    p.add_argument("--ct2-model", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--lenpen", type=float, help=argparse.SUPPRESS)
    p.add_argument("--max-len", type=float, nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine:
        return child(args)
    if not shutil.which("perf"):
        sys.exit("perf_decode: needs Linux perf (apt-get install linux-perf)")

    from bench_ctranslate2 import write_tokenizer

    from nmt.checkpoint import load_checkpoint

    state = load_checkpoint(args.checkpoint, map_location="cpu")
    cfg = state["config"]["decode"]
    common = ["--checkpoint", args.checkpoint, "--data-dir", args.data_dir, "--test", args.test, "--src", args.src,
              "--sentences", str(args.sentences), "--batch-size", str(args.batch_size), "--beam", str(args.beam),
              "--threads", str(args.threads), "--precision", args.precision, "--repeat", str(args.repeat)]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "ct2"
        subprocess.run([sys.executable, "-m", "nmt", "export", args.checkpoint, str(model), "--quantization",
                        "int8" if args.precision == "int8" else "float32"], check=True, stdout=subprocess.DEVNULL)
        runs = {
            "nmt": sample([*common, "--engine", "nmt"], Path(tmp) / "nmt.data"),
            "CTranslate2": sample([*common, "--engine", "ct2", "--ct2-model", str(model), "--tokenizer",
                                   write_tokenizer(state, Path(tmp) / "tokenizer"), "--lenpen", str(cfg["lenpen"]),
                                   "--max-len", str(cfg["max_len_a"]), str(cfg["max_len_b"])], Path(tmp) / "ct2.data"),
        }
    n = len(read_source(args))
    print(f"{n} sentences, batch {args.batch_size}, beam {args.beam}, {args.threads} thread(s), {args.precision}; "
          f"seconds of one decode (mean of {args.repeat}), split by perf's samples\n")
    names = list(runs)
    print("| what | " + " | ".join(f"{e} s" for e in names) + " |\n| --- |" + " ---: |" * len(names))
    for group in [g for g, _ in GROUPS] + [OTHER]:
        print(f"| {group} | " + " | ".join(f"{runs[e][0] * runs[e][1].get(group, 0):.3f}" for e in names) + " |")
    print("| whole decode | " + " | ".join(f"{runs[e][0]:.3f} ({n / runs[e][0]:.1f} sent/s)" for e in names) + " |")


if __name__ == "__main__":
    main()
