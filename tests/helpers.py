"""Plain helpers that several test modules share (the shared fixtures are in conftest.py).

Test modules import them with `from helpers import ...`: pyproject's pytest settings put
tests/ on sys.path (`pythonpath = ["tests"]`).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from nmt import cli
from nmt.errors import NmtError

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the command line


def nmt(*args: str, cwd: Path = ROOT, stdin: str | bytes = "", env: Mapping[str, str] | None = None,
        timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """`python -m nmt ARGS` in a subprocess, its output captured. A str stdin gives str stdout
    and stderr; bytes give bytes. `env`: variables set on top of os.environ. `check`: assert
    that the command succeeded, showing the end of its stderr if not."""
    r = subprocess.run([sys.executable, "-m", "nmt", *args], cwd=cwd, input=stdin, capture_output=True,
                       text=isinstance(stdin, str), env=None if env is None else {**os.environ, **env},
                       timeout=timeout)
    if check:
        assert r.returncode == 0, f"nmt {' '.join(args)} failed:\n{r.stderr[-3000:]}"
    return r


def nmt_here(*args: str) -> int:
    """The real command line in this process (faster than a subprocess): its exit status."""
    try:
        cli.main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


# ------------------------------------------------------------------ synthetic data


def synthetic_pairs(
    task: str,
    n: int,
    *,
    seed: int,
    min_len: int = 3,
    max_len: int = 12,
    alphabet: Sequence[str] = "0123456789",
) -> list[tuple[str, str]]:
    """`n` pairs of space-separated symbol strings: the target copies, reverses or sorts
    (in alphabet order) the source."""
    rank = {symbol: i for i, symbol in enumerate(alphabet)}
    transforms = {
        "copy": lambda xs: xs,
        "reverse": lambda xs: xs[::-1],
        "sort": lambda xs: sorted(xs, key=rank.__getitem__),
    }
    if task not in transforms:
        raise NmtError(f"unknown synthetic task {task!r} (copy, reverse or sort)")
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        symbols = [rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((" ".join(symbols), " ".join(transforms[task](symbols))))
    return pairs


def write_parallel(
    pairs: Sequence[tuple[str, str]], prefix: str | Path, src_lang: str, tgt_lang: str
) -> tuple[Path, Path]:
    """Write PREFIX.src_lang and PREFIX.tgt_lang, one sentence per line (for prepare-bpe)."""
    paths = (Path(f"{prefix}.{src_lang}"), Path(f"{prefix}.{tgt_lang}"))
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for side, path in enumerate(paths):
        lines = [pair[side] for pair in pairs]
        if any("\n" in line for line in lines):
            raise ValueError("write_parallel: a sentence contains a newline")
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths
