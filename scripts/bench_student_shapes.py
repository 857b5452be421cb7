"""How fast does a student of a given shape decode, before training one? Random weights of each
shape, with the teacher's vocabulary and decode settings, timed by bench_translate.py.

    .venv/bin/python scripts/bench_student_shapes.py --teacher runs/m30k_en_de/checkpoint_avg.pt \\
        --shape 6+1:encoder_layers=6,decoder_layers=1 \\
        --shape 6+1@160:encoder_layers=6,decoder_layers=1,d_model=160,ffn_dim=640 [--length 14]

Speed depends on the shape and on how many steps each sentence decodes, not on the weights; a
random model never emits EOS, so every sentence decodes exactly --length steps (max_len_a 0,
max_len_b LENGTH; the demo's model takes 15 steps a sentence on Multi30k's test_2016_flickr,
14 pieces and the EOS). The teacher's own shape is measured first and last (the machine's drift shows in the
two), and `× teacher` divides by their mean. Training time decides quality, which this script
does not measure: it tells which shapes can meet a speed bar, so that only those are trained.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import bench_translate  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="its vocabulary, tokenizer, decode settings and shape")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="model settings over the teacher's (integers), e.g. 6+1:encoder_layers=6,decoder_layers=1")
    p.add_argument("--length", type=int, default=14, help="decoding steps per sentence")
    p.add_argument("--limit", type=int, default=0, help="only the first N test sentences")
    bench_translate.add_test_set_args(p)
    args = p.parse_args(argv)
    args.shapes = []
    for spec in args.shape:
        name, sep, settings = spec.partition(":")
        try:
            pairs = [kv.split("=") for kv in settings.split(",")]
            args.shapes.append((name, {k: int(v) for k, v in pairs}))
        except ValueError:
            p.error(f"--shape {spec}: expected NAME:KEY=INTEGER,...")
        if not sep:
            p.error(f"--shape {spec}: expected NAME:KEY=INTEGER,...")
    return args


def random_checkpoint(teacher: dict, changes: dict[str, int], pad_id: int, path: Path) -> int:
    """The teacher's checkpoint with its model section changed and random weights; returns the
    number of parameters."""
    import torch

    from nmt.config import config_from_dict
    from nmt.models.transformer import build_model

    cfg = config_from_dict(teacher["config"])
    try:
        model_cfg = replace(cfg.model, **changes)
    except TypeError as e:
        sys.exit(f"--shape: {e}")
    torch.manual_seed(0)
    model = build_model(model_cfg, teacher["vocab_size"], pad_id=pad_id)
    config = {**teacher["config"], "model": asdict(model_cfg)}
    ckpt = {k: v for k, v in teacher.items() if k != "averaged_from"}
    torch.save({**ckpt, "config": config, "model": model.state_dict()}, path)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from nmt.checkpoint import load_checkpoint, load_model_checkpoint

    teacher = load_checkpoint(args.teacher)
    pad_id = load_model_checkpoint(args.teacher).tokenizer.specials.pad
    shapes = [("teacher", {}), *args.shapes, ("teacher", {})]
    common = ["--data-dir", args.data_dir, "--test", args.test, "--src", args.src, "--tgt", args.tgt,
              "--beam", str(args.beam), "--threads", str(args.threads), "--limit", str(args.limit),
              "--max-len-a", "0", "--max-len-b", str(args.length), "--no-command"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, changes) in enumerate(shapes):
            path = Path(tmp) / f"{i}.pt"
            params = random_checkpoint(teacher, changes, pad_id, path)
            print(f"measuring {name}", file=sys.stderr, flush=True)
            with contextlib.redirect_stdout(sys.stderr):  # its own row names the temporary file
                result = bench_translate.main(["--checkpoint", str(path), *common])
            rows.append((name, changes, params, result["sent_per_s"]))
    base = (rows[0][3] + rows[-1][3]) / 2
    print(f"\n{args.test}, beam {args.beam}, {args.length} decoding steps per sentence, {args.threads} threads, "
          "random weights\n")
    print("| shape | settings over the teacher's | parameters | sent/s | × teacher |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, changes, params, speed in rows:
        settings = ", ".join(f"{k} {v}" for k, v in changes.items()) or "-"
        print(f"| {name} | {settings} | {params / 1e6:.2f} M | {speed:.1f} | {speed / base:.2f} |")


if __name__ == "__main__":
    main()
