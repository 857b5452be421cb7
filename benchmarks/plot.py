"""Draw the speed-against-other-engines plot of docs/benchmarks.md from its own table.

    python -m benchmarks plot [--doc docs/benchmarks.md] [--out docs/img/speed.png]

The figures are written once, in the page: the table is the markdown table right after the line
`<!-- speed-table: ... -->`. Its first column names the setting (one group of bars each, top to
bottom as in the table); every column whose header ends in "sent/s" is one engine (nmt,
CTranslate2, Marian, ...), one bar per setting. An empty or "–" cell has no bar. Needs
matplotlib (`pip install 'nmt[plot]'`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT

MARKER = "<!-- speed-table"
SUFFIX = "sent/s"
EMPTY = {"", "-", "–", "—"}


def cells(line: str) -> list[str]:
    """The cells of one markdown table row, without emphasis or code marks."""
    inner = line.strip().strip("|")
    return [c.strip().replace("**", "").replace("`", "").strip() for c in inner.split("|")]


def read_table(doc: Path) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """(engines, [(setting, sentences/s per engine)]) from the table after the marker."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(MARKER)), None)
    if start is None:
        raise ValueError(f"{doc}: no '{MARKER} ... -->' line before the speed table")
    i = start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    rows = []
    while i < len(lines) and lines[i].strip().startswith("|"):
        rows.append(cells(lines[i]))
        i += 1
    if len(rows) < 3:
        raise ValueError(
            f"{doc}: no markdown table right after the '{MARKER}' line (line {start + 1})"
        )
    header, body = rows[0], rows[2:]  # rows[1] is the | --- | line
    columns = [k for k, name in enumerate(header) if name.endswith(SUFFIX)]
    if not columns:
        raise ValueError(f"{doc}: the speed table has no column whose header ends in '{SUFFIX}'")
    engines = [header[k][: -len(SUFFIX)].strip() for k in columns]
    settings = []
    for row in body:
        if len(row) != len(header):
            raise ValueError(
                f"{doc}: speed table row '{row[0]}' has {len(row)} cells, the header {len(header)}"
            )
        values: list[float | None] = []
        for k in columns:
            text = row[k].replace(",", "")
            if text in EMPTY:
                values.append(None)
                continue
            try:
                values.append(float(text))
            except ValueError:
                raise ValueError(
                    f"{doc}: speed table row '{row[0]}', column '{header[k]}': '{row[k]}' is not a "
                    "number"
                ) from None
        settings.append((row[0], values))
    if not settings:
        raise ValueError(f"{doc}: the speed table has no rows")
    return engines, settings


def draw(
    engines: list[str], settings: list[tuple[str, list[float | None]]], out: Path, plt: Any
) -> None:
    n = len(engines)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.42 * n * len(settings)))
    for e, engine in enumerate(engines):
        ys = [g + (e - (n - 1) / 2) * width for g in range(len(settings))]
        xs = [values[e] for _, values in settings]
        kept = [(y, x) for y, x in zip(ys, xs) if x is not None]
        bars = ax.barh([y for y, _ in kept], [x for _, x in kept], height=width, label=engine)
        ax.bar_label(bars, labels=[f"{x:,.1f}" for _, x in kept], padding=3, fontsize=8)
    ax.set_yticks(range(len(settings)), [name for name, _ in settings])
    ax.invert_yaxis()  # the table's first row on top
    ax.set_xscale("log")
    top = max(x for _, values in settings for x in values if x is not None)
    ax.set_xlim(1, top * 2.2)  # bars start at 1 sentence/s; room for the last label
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:,.0f}")
    ax.set_xlabel("sentences/s (log scale; higher is faster)")
    ax.set_title(f"Translation speed: {' against '.join(engines)} (each setting: one run)")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks plot", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--doc", type=Path, default=ROOT / "docs/benchmarks.md", help="the page holding the table"
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs/img/speed.png", help="the PNG to write")
    args = p.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        sys.exit(
            "the plot suite needs matplotlib: pip install 'nmt[plot]' (or pip install matplotlib)"
        )
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    try:
        engines, settings = read_table(args.doc)
    except (OSError, ValueError) as e:
        sys.exit(f"plot: {e}")
    draw(engines, settings, args.out, plt)
    print(f"{args.out}: {len(settings)} settings x {len(engines)} engines ({', '.join(engines)})")
