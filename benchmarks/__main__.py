"""`python -m benchmarks SUITE [OPTIONS]`: run one suite (`SUITE --help` gives its options);
without a suite, list them."""

from __future__ import annotations

import importlib
import sys

# suite -> (module, what it measures)
SUITES = {
    "prepare": (
        "prepare",
        "`nmt prepare-bpe` on Multi30k and a 1M-pair corpus: pairs/s, peak memory",
    ),
    "train": ("train", "the trainer on Multi30k or a WMT-shaped workload: tok/s, memory, MFU"),
    "translate": ("translate", "`nmt translate` on a test set: sent/s, the whole command, BLEU"),
    "engines": ("engines", "nmt against CTranslate2 after `nmt export`: sent/s, memory, BLEU"),
    "distill": ("distill", "a teacher and its students, every engine: BLEU, sent/s, memory"),
    "import": (
        "import_opus",
        "an imported OPUS-MT-shaped model: nmt against CTranslate2's converter",
    ),
    "constraints": ("constraints", "lexically constrained decoding: speed, BLEU, term use"),
    "startup": (
        "startup",
        "`nmt translate` of one line per engine: interpreter, imports, the command, peak memory",
    ),
    "serve": ("serve", "`nmt serve` under 1 to 128 clients: sent/s and latency against offline"),
    "serve-busy": (
        "serve_busy",
        "`nmt serve`, one client beside busy processes, per OpenMP wait policy",
    ),
    "libretranslate": (
        "libretranslate",
        "`nmt serve` against LibreTranslate on the same weights: sent/s, latency, answers",
    ),
    "stream": ("stream", "`nmt serve`'s searches without HTTP, under a closed loop of clients"),
    "loss": ("loss", "the chunked training loss alone: ms and error, against another checkout"),
    "three-models": (
        "three_models",
        "RNN, RNN + attention and Transformer given the same CPU time",
    ),
    "profile-decode": (
        "profile_decode",
        "where decoding time goes (torch.profiler), next to CTranslate2",
    ),
    "perf-decode": ("perf_decode", "where decoding time goes, sampled by Linux perf, both engines"),
    "profile-serve": ("profile_serve", "where `nmt serve`'s threads spend their time (py-spy)"),
    "equivalence": (
        "equivalence",
        "a digest of a short fixed run, to show a refactoring changed no result",
    ),
    "plot": ("plot", "docs/img/speed.png from the speed table of docs/benchmarks.md"),
}


def usage() -> str:
    width = max(len(name) for name in SUITES)
    lines = ["usage: python -m benchmarks SUITE [--help | OPTIONS]", "", "suites:"]
    for name, (_, what) in SUITES.items():
        lines.append(f"  {name:<{width}}  {what}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    suite, *options = argv
    if suite not in SUITES:
        print(f"unknown suite {suite!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{SUITES[suite][0]}")
    module.main(options)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
