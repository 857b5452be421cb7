"""Digest a short, fixed-length run, to show that a refactoring changed no result.

    python -m benchmarks equivalence --repo CHECKOUT --prepared DIR --json digest.json
    python -m benchmarks equivalence --compare a.json b.json

Runs that checkout's `nmt` (PYTHONPATH=CHECKOUT) on data prepared once by `nmt prepare-bpe`
(made here from ../shared/data/multi30k if DIR does not exist): `nmt train` for
--updates updates of configs/multi30k.yaml (checkpoints and a validation with greedy BLEU
every --updates/2), `nmt average-checkpoints --last 2`, then `nmt translate` of the test
split (beam 5, 2-best with scores). The digest holds a sha256 of every tensor of the last
and averaged checkpoints (model, optimizer, RNG), the checkpoint's counters without the
wall-clock ones, the metrics without timings, and the translations. Two digests are equal
exactly when the runs are bit-identical in everything that does not measure time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import MULTI30K, ROOT, child_env

TIMING_KEYS = {"elapsed", "valid_s", "tgt_tokens_per_s", "updates_per_s", "rss_mb", "time"}
PLACE_KEYS = {"run_dir"}  # a temporary directory of each run


def tensor_digest(obj: Any, prefix: str = "") -> dict[str, str]:
    import torch

    out: dict[str, str] = {}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        out[prefix] = (
            f"{t.dtype}{tuple(t.shape)}:"
            + hashlib.sha256(
                t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            ).hexdigest()[:16]
        )
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            out.update(tensor_digest(obj[k], f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensor_digest(v, f"{prefix}[{i}]"))
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        if prefix.rsplit(".", 1)[-1] not in TIMING_KEYS | PLACE_KEYS:
            out[prefix] = repr(obj)
    elif isinstance(obj, bytes):
        out[prefix] = hashlib.sha256(obj).hexdigest()[:16]
    return out


def nmt(repo: Path, *args: str, cwd: Path, stdin: bytes | None = None) -> bytes:
    env = child_env(nmt_from=repo)
    proc = subprocess.run(
        [sys.executable, "-m", "nmt", *args], cwd=cwd, env=env, input=stdin, capture_output=True
    )
    if proc.returncode:
        raise SystemExit(f"nmt {' '.join(args)} failed:\n{proc.stderr.decode()[-2000:]}")
    return proc.stdout


def digest(repo: Path, prepared: Path, updates: int) -> dict:
    import torch

    repo = repo.resolve()
    prepared = prepared.resolve()
    if not (prepared / "prepare.json").is_file():
        nmt(
            repo,
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            str(MULTI30K / "train"),
            "--validpref",
            str(MULTI30K / "val"),
            "--testpref",
            str(MULTI30K / "test_2016_flickr"),
            "--vocab-size",
            "8000",
            "--destdir",
            str(prepared),
            "--workers",
            "1",
            cwd=ROOT,
        )
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        half = max(1, updates // 2)
        nmt(
            repo,
            "train",
            str(ROOT / "configs/multi30k.yaml"),
            "--set",
            f"data.dir={prepared}",
            "--run-dir",
            str(run),
            "--set",
            f"train.max_updates={updates}",
            "--set",
            "train.max_time=0",
            "--set",
            f"train.save_interval_updates={half}",
            "--set",
            f"train.validate_interval_updates={half}",
            "--set",
            "train.log_interval=10",
            "--set",
            "train.threads=2",
            "--device",
            "cpu",
            cwd=Path(tmp),
        )
        nmt(
            repo,
            "average-checkpoints",
            str(run),
            "--last",
            "2",
            "-o",
            str(run / "avg.pt"),
            cwd=Path(tmp),
        )
        test = (prepared / "test.raw.en").read_bytes()
        hyps = nmt(
            repo,
            "translate",
            "-c",
            str(run / "avg.pt"),
            "--beam",
            "5",
            "--nbest",
            "2",
            "--scores",
            "--threads",
            "2",
            "--device",
            "cpu",
            cwd=Path(tmp),
            stdin=test,
        )
        last = torch.load(run / "checkpoint_last.pt", weights_only=True)
        avg = torch.load(run / "avg.pt", weights_only=True)
        metrics = [
            {k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in (run / "metrics.jsonl").read_text().splitlines()
        ]
    return {
        "last": tensor_digest(last),
        "avg": tensor_digest(avg),
        "metrics": metrics,
        "translations_sha256": hashlib.sha256(hyps).hexdigest(),
        "translations_head": hyps.decode()[:400],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks equivalence",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--prepared", type=Path, default=Path("bench-out/equivalence-data"))
    ap.add_argument("--updates", type=int, default=60)
    ap.add_argument("--json", type=Path, help="write the digest here")
    ap.add_argument("--compare", nargs=2, type=Path)
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        diffs = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
        for part in ("last", "avg"):
            keys = sorted(set(a[part]) | set(b[part]))
            bad = [k for k in keys if a[part].get(k) != b[part].get(k)]
            print(
                f"{part}: {len(keys)} entries, {len(bad)} differ"
                + (f" (first: {bad[:5]})" if bad else "")
            )
        print("metrics:", "equal" if a["metrics"] == b["metrics"] else "DIFFER")
        print(
            "translations:",
            "equal" if a["translations_sha256"] == b["translations_sha256"] else "DIFFER",
        )
        raise SystemExit(1 if diffs else 0)
    result = digest(args.repo, args.prepared, args.updates)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(
        f"{len(result['last'])} checkpoint entries; translations "
        f"{result['translations_sha256'][:16]}"
    )
