"""How long `nmt translate` takes for one line, the whole command, and where that time goes.

    python -m benchmarks startup --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--rounds 7] [--line "A man is walking."]

Each round runs, one after the other in fresh processes, with the same interpreter:
- `python -c pass`: the interpreter alone;
- `python -c "import torch"`: torch's import;
- `python -c "import nmt.cli, nmt.translate"`: every module the command imports;
- `python -m nmt translate -c CK` with the line on stdin: the whole command (loading the
  checkpoint, one decode, writing the line, exiting).
Prints a markdown table of each one's median and range over the rounds and, by difference,
what loading and translating the line cost beyond the imports. Time nothing else meanwhile:
on a 2-core machine any other load shows in every row.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchmarks.common import ROOT, median, spread, write_json


def wall(cmd: list[str], stdin: str = "") -> float:
    """Seconds `cmd` ran, from start to exit; a failure stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, text=True, capture_output=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks startup", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--line", default="A man is walking down the street.")
    p.add_argument("--json", help="write each step's times here")
    args = p.parse_args(argv)
    py = sys.executable
    imports = "the command's imports (`import nmt.cli, nmt.translate`)"
    command = "`nmt translate` of one line, the whole command"
    steps = {
        "interpreter (`python -c pass`)": ([py, "-c", "pass"], ""),
        "`import torch`": ([py, "-c", "import torch"], ""),
        imports: ([py, "-c", "import nmt.cli, nmt.translate"], ""),
        command: ([py, "-m", "nmt", "translate", "-c", args.checkpoint], args.line + "\n"),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    wall(*steps["`import torch`"])  # a warm page cache for the first round too
    for _ in range(args.rounds):
        for name, (cmd, stdin) in steps.items():
            times[name].append(wall(cmd, stdin))
    medians = {name: median(t) for name, t in times.items()}
    print(f"{args.rounds} rounds, {args.checkpoint}\n")
    print("| step | median s | range s |\n| --- | ---: | ---: |")
    for name, t in times.items():
        print(f"| {name} | {medians[name]:.2f} | {spread(t)} |")
    print(
        "| loading, translating, writing and exiting (the last row less the third) | "
        f"{medians[command] - medians[imports]:.2f} | |"
    )
    result = {"checkpoint": args.checkpoint, "rounds": args.rounds, "seconds": times}
    write_json(args.json, result)
    return result
