"""RNN, RNN with attention and Transformer, trained on Multi30k en->de for the same CPU time.

    python -m benchmarks three-models [--max-time 900] [--data-dir ../shared/data/multi30k]

The data prepared once (data-bin/m30k_en_de, reused where it is), then three `nmt train`
processes started together, each with one thread and the same `train.max_time`, so that each
gets the same share of the cores: `configs/rnn_multi30k.yaml` without attention
(`model.attention=none`) and with it, and `configs/multi30k.yaml`. Then, for each run, its last
checkpoint and the average of its last 3 translate test_2016_flickr (beam 5, each config's
decode settings; the seconds it took) and are scored (BLEU, chrF); the attention of the
`--attention-lines` is saved and drawn for the two models that have it, and the learning curves
of the three are drawn. Runs: runs/bench_{rnn_none,rnn_attention,transformer}; everything else
in `--out` (default bench-out/three_models). Prints each translation's time and score.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import MULTI30K, ROOT, child_env, read_test_set, write_json

RUNS = {
    "rnn_none": ("configs/rnn_multi30k.yaml", ["--set", "model.attention=none"]),
    "rnn_attention": ("configs/rnn_multi30k.yaml", []),
    "transformer": ("configs/multi30k.yaml", []),
}
LABELS = ["RNN, no attention", "RNN + attention", "Transformer"]


def nmt(*args: str, stdout: int | None = None) -> str:
    """`python -m nmt ARGS` in the repository root; a failure stops the suite."""
    proc = subprocess.run(
        [sys.executable, "-m", "nmt", *args],
        cwd=ROOT,
        env=child_env(),
        text=True,
        stdout=subprocess.PIPE,
    )
    if proc.returncode:
        sys.exit(f"nmt {' '.join(args)} failed ({proc.returncode})")
    return proc.stdout


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks three-models", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--max-time", type=int, default=900, help="train.max_time of each model, seconds"
    )
    p.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k's files (NMT_MULTI30K)")
    p.add_argument("--prepared", default="data-bin/m30k_en_de")
    p.add_argument("--out", default="bench-out/three_models")
    p.add_argument(
        "--attention-lines",
        default="1,4",
        help="test_2016_flickr lines (1-based) whose attention is drawn",
    )
    p.add_argument(
        "--sentences", type=int, default=0, help="translate the first N test lines only (0: all)"
    )
    p.add_argument("--json", help="write the scores and times here")
    args = p.parse_args(argv)
    raw = Path(args.data_dir)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    prepared = args.prepared
    if not (ROOT / prepared / "prepare.json").is_file():
        nmt(
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "val"),
            "--testpref",
            f"{raw}/test_2016_flickr,{raw}/test_2017_flickr",
            "--vocab-size",
            "8000",
            "--destdir",
            prepared,
        )
    common = [
        "--set",
        f"data.dir={prepared}",
        "--set",
        "train.threads=1",
        "--set",
        f"train.max_time={args.max_time}",
    ]
    trainings = []
    for run, (config, extra) in RUNS.items():
        log = (out / f"train_{run}.log").open("w")
        cmd = [
            sys.executable,
            "-m",
            "nmt",
            "train",
            config,
            *common,
            *extra,
            "--run-dir",
            f"runs/bench_{run}",
        ]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
        )
        trainings.append((run, proc, log))
    for run, proc, log in trainings:
        if proc.wait():
            sys.exit(f"training {run} failed: {out / f'train_{run}.log'}")
        log.close()

    test = argparse.Namespace(
        data_dir=str(raw), test="test_2016_flickr", src="en", tgt="de", sentences=args.sentences
    )
    source = read_test_set(test, "en")
    (out / "test.en").write_text("".join(line + "\n" for line in source), encoding="utf-8")
    (out / "test.de").write_text(
        "".join(line + "\n" for line in read_test_set(test, "de")), encoding="utf-8"
    )
    picked = [source[int(i) - 1] for i in args.attention_lines.split(",")]
    (out / "attention.en").write_text("".join(line + "\n" for line in picked), encoding="utf-8")
    # Two readings of each run: its last checkpoint, and the average of its last 3 numbered ones
    # (a 15-minute run has 3-5, written every 200 updates: averaging 5 would reach back to update
    # 200 of a model still learning fast).
    results: dict[str, dict] = {}
    for run in RUNS:
        run_dir = f"runs/bench_{run}"
        nmt("average-checkpoints", run_dir, "--last", "3", "-o", f"{run_dir}/checkpoint_avg3.pt")
        for reading in ("last", "avg3"):
            hyp = out / f"hyp_{run}_{reading}.de"
            start = time.perf_counter()
            nmt(
                "translate",
                "-c",
                f"{run_dir}/checkpoint_{reading}.pt",
                "--beam",
                "5",
                "-i",
                str(out / "test.en"),
                "-o",
                str(hyp),
            )
            seconds = time.perf_counter() - start
            score = nmt(
                "score", "--ref", str(out / "test.de"), "--hyp", str(hyp), "--metrics", "bleu,chrf"
            )
            (out / f"score_{run}_{reading}.txt").write_text(score, encoding="utf-8")
            print(f"{run} {reading}: translated in {seconds:.1f} s\n{score.strip()}", flush=True)
            results[f"{run}_{reading}"] = {"translate_s": seconds, "score": score.strip()}
        if run != "rnn_none":
            attention = out / f"att_{run}_last.npz"
            text = nmt(
                "translate",
                "-c",
                f"{run_dir}/checkpoint_last.pt",
                "--beam",
                "5",
                "-i",
                str(out / "attention.en"),
                "--alignment",
                "--attention",
                str(attention),
            )
            (out / f"att_{run}_last.de").write_text(text, encoding="utf-8")
            nmt(
                "plot", "attention", str(attention), "-o", str(out / f"maps_{run}"), "--layer", "-1"
            )
    labels = [word for label in LABELS for word in ("--label", label)]
    nmt(
        "plot",
        "curves",
        *(f"runs/bench_{run}" for run in RUNS),
        *labels,
        "-o",
        str(out / "curves.png"),
    )
    write_json(args.json, results)
    return results
