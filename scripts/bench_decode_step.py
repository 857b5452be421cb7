"""What a beam search step costs besides its arithmetic, and what compiling the decoder gives.

    .venv/bin/python scripts/bench_decode_step.py --checkpoint runs/m30k_en_de/checkpoint_avg.pt \\
        [--batch-sizes 1,14,32] [--threads 1] [--compile] [--sentences 200]

1. The fixed cost of a step: the checkpoint's architecture with random weights, decoding
   random sources of 15 tokens for exactly 20 steps (`min_len` = `max_len_b` = 20), beam 5,
   once at its own dimensions and once with d_model 8, one head and a feed-forward of 8: the same
   ops, the same vocabulary and search, next to no arithmetic in the layers. Milliseconds a
   step for each batch size (sentences), and the share of a step the second takes.
2. With `--compile`: `Translator.translate` of the first `--sentences` lines of the test set at
   each batch size, eagerly and with each decoder layer compiled (`torch.compile(dynamic=True)`,
   inductor's freezing on, 64 graphs allowed): the time the first call took (compiling),
   the best of 3 after it, and whether every translation is the same.
`--threads` torch threads, 1 worker. Prints markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from profile_decode import read_source, source_arguments  # noqa: E402


def step_ms(model, batch: int, vocab: int, reps: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Milliseconds a step of beam 5 over `batch` random 15-token sources, 20 steps a search."""
    import torch

    from nmt.config import DecodeConfig
    from nmt.decoding.search import beam_search

    cfg = DecodeConfig(beam=5, min_len=20, max_len_a=0.0, max_len_b=20)
    src = torch.randint(4, vocab, (batch, 15), generator=torch.Generator().manual_seed(batch))
    ids = dict(pad=1, unk=3, bos=0, eos=2)
    with torch.inference_mode():
        beam_search(model, src, cfg, **ids)
        start = time.perf_counter()
        for _ in range(reps):
            beam_search(model, src, cfg, **ids)
    return (time.perf_counter() - start) / reps / 21 * 1000  # 20 tokens and the final EOS step


def best_of_3(tr, lines: list[str]) -> tuple[float, list[str]]:  # type: ignore[no-untyped-def]
    """The shortest of 3 `tr.translate(lines)` in seconds, and the translations."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = tr.translate(lines)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source_arguments(p, sentences=200)
    p.add_argument("--batch-sizes", default="1,14,32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    import torch

    from nmt import Translator
    from nmt.models.kernels import PackedLinear, packing_works
    from nmt.models.transformer import Transformer

    torch.set_num_threads(args.threads)
    tr = Translator.load(args.checkpoint, threads=args.threads, workers=1)
    cfg, vocab, sizes = tr.loaded.model.cfg, tr.loaded.model.vocab_size, [int(b) for b in args.batch_sizes.split(",")]
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.checkpoint}\n\n"
          "| batch (sentences) | step at the model's dimensions, ms | the same ops at d_model 8, ms | share |\n"
          "| ---: | ---: | ---: | ---: |")
    for batch in sizes:
        times = []
        for dims in ({}, {"d_model": 8, "ffn_dim": 8, "heads": 1}):
            torch.manual_seed(0)
            model = Transformer(dataclasses.replace(cfg, dropout=0.0, **dims), vocab, 1).eval()
            if packing_works():  # as a model loaded for decoding
                model.cpu_output = PackedLinear(model.output_weight, model.output_bias)
            times.append(step_ms(model, batch, vocab))
        print(f"| {batch} | {times[0]:.2f} | {times[1]:.2f} | {times[1] / times[0]:.0%} |")
    if not args.compile:
        return
    import torch._dynamo
    import torch._inductor.config

    torch._inductor.config.freezing = True
    torch._dynamo.config.recompile_limit = 64
    lines = read_source(args)  # the first --sentences lines
    print(f"\n{len(lines)} lines of {args.test}.{args.src}\n\n"
          "| batch | eager s (best of 3) | compiled: first call s | compiled s (best of 3) | same translations |\n"
          "| ---: | ---: | ---: | ---: | --- |")
    for batch in sizes:
        tr = Translator.load(args.checkpoint, threads=args.threads, workers=1)
        tr.decode = dataclasses.replace(tr.decode, batch_size=batch)

        tr.translate(lines)
        eager, ref = best_of_3(tr, lines)
        for layer in tr.loaded.model.decoder:
            layer.forward = torch.compile(layer.forward, dynamic=True)
        start = time.perf_counter()
        tr.translate(lines)
        first = time.perf_counter() - start
        compiled, out = best_of_3(tr, lines)
        print(f"| {batch} | {eager:.2f} | {first:.1f} | {compiled:.2f} | {out == ref} |")


if __name__ == "__main__":
    main()
