"""How long `nmt translate` takes for one line, the whole command, and where that time goes.

    python -m benchmarks startup --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--rounds 7] [--line "A man is walking."]

Each round runs, one after the other in fresh processes, with the same interpreter:
- `python -c pass`: the interpreter alone;
- `python -c "import torch"`: torch's import;
- `python -c "import nmt.cli, nmt.translate"`: every module the command imports;
- `python -m nmt translate -c CK --engine E` with the line on stdin, for each of `--engines`
  (torch, ctranslate2): the whole command (loading the checkpoint, one decode, writing the line,
  exiting); CTranslate2's from a warm cache (`--cache-dir` in a temporary folder, filled once
  before the rounds: that first conversion is timed on its own);
- with ctranslate2 among the engines, a bare script of the same line: `ctranslate2.Translator`
  over the cached conversion and sentencepiece, nothing of nmt (the floor of that engine).
Prints a markdown table of each one's median and range over the rounds, and its peak resident
memory (the child's own, from wait4), and, by difference, what loading and translating the line
cost beyond the imports. Time nothing else meanwhile: on a 2-core machine any other load shows
in every row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, median, spread, write_json


def wall(cmd: list[str], stdin: str = "") -> float:
    """Seconds `cmd` ran, from start to exit; a failure stops the benchmark."""
    return run(cmd, stdin)[0]


def run(cmd: list[str], stdin: str = "") -> tuple[float, float]:
    """(seconds `cmd` ran from start to exit, its own peak resident memory in MB); a failure
    stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    proc.stdin.write(stdin.encode())  # type: ignore[union-attr]
    proc.stdin.close()  # type: ignore[union-attr]
    proc.stdout.read()  # type: ignore[union-attr]
    err = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = err.decode(errors="replace").strip()[-500:]
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {tail}")
    return seconds, usage.ru_maxrss / 1024


BARE = """
import sys, ctranslate2, sentencepiece
model = sys.argv[1]
sp = sentencepiece.SentencePieceProcessor(model_file=model + "/spm.model")
tr = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=0)
result = tr.translate_batch([sp.encode(sys.stdin.readline().strip(), out_type=str)], beam_size=5)
print(sp.decode(result[0].hypotheses[0]))
"""


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks startup", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--line", default="A man is walking down the street.")
    p.add_argument("--engines", default="torch,ctranslate2", help="nmt translate --engine runs")
    p.add_argument("--json", help="write each step's times here")
    args = p.parse_args(argv)
    py = sys.executable
    imports = "the command's imports (`import nmt.cli, nmt.translate`)"
    command = "`nmt translate` of one line, the whole command"
    engines = [e for e in args.engines.split(",") if e]
    line = args.line + "\n"
    cache = tempfile.mkdtemp(prefix="nmt-startup-")
    translate = [py, "-m", "nmt", "translate", "-c", args.checkpoint, "--cache-dir", cache]
    steps = {
        "interpreter (`python -c pass`)": ([py, "-c", "pass"], ""),
        "`import torch`": ([py, "-c", "import torch"], ""),
        imports: ([py, "-c", "import nmt.cli, nmt.translate"], ""),
    }
    for engine in engines:
        steps[f"{command}, `--engine {engine}`"] = ([*translate, "--engine", engine], line)
    wall(*steps["`import torch`"])  # a warm page cache for the first round too
    conversion = None
    if "ctranslate2" in engines:  # the first use converts the checkpoint into the cache
        conversion = wall([*translate, "--engine", "ctranslate2"], line)
        (model,) = Path(cache, "ctranslate2").iterdir()
        steps["bare CTranslate2 script of the line (`ctranslate2`, `sentencepiece`)"] = (
            [py, "-c", BARE, str(model)],
            line,
        )
    times: dict[str, list[float]] = {name: [] for name in steps}
    peaks: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (cmd, stdin) in steps.items():
            seconds, peak = run(cmd, stdin)
            times[name].append(seconds)
            peaks[name].append(peak)
    shutil.rmtree(cache, ignore_errors=True)
    medians = {name: median(t) for name, t in times.items()}
    print(f"{args.rounds} rounds, {args.checkpoint}\n")
    print("| step | median s | range s | peak RSS MB |\n| --- | ---: | ---: | ---: |")
    for name, t in times.items():
        print(f"| {name} | {medians[name]:.2f} | {spread(t)} | {max(peaks[name]):.0f} |")
    for engine in engines:
        print(
            f"| `--engine {engine}`: loading, translating, writing and exiting (its row less "
            f"the imports) | {medians[f'{command}, `--engine {engine}`'] - medians[imports]:.2f} "
            "| | |"
        )
    if conversion is not None:
        print(
            f"| the first `--engine ctranslate2` run, converting into the cache | "
            f"{conversion:.2f} | | |"
        )
    result = {
        "checkpoint": args.checkpoint,
        "rounds": args.rounds,
        "seconds": times,
        "peak_rss_mb": peaks,
        "conversion_seconds": conversion,
    }
    write_json(args.json, result)
    return result
