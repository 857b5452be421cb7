"""Pictures (`nmt plot`): attention heat maps from `translate --attention` files, and learning
curves from run directories' `metrics.jsonl`. matplotlib is an optional extra, imported only
here (`pip install 'nmt[plot]'`); without it the commands say how to install it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.atomic import FileArg, check_outputs, open_for_reading, os_errors_as, replacing, target
from nmt.decoding.alignment import load_attention
from nmt.errors import NmtError
from nmt.fields import check_bounds, flag
from nmt.options import PlotAttentionOptions

log = logging.getLogger(__name__)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise NmtError(
            "nmt plot needs matplotlib: pip install 'nmt[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _format(path: Path) -> str:
    """The image format of `path`, by its suffix (png without one), checked before any work:
    matplotlib would refuse an unknown one only when saving."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = path.suffix.lstrip(".").lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise NmtError(
            f"-o {path}: unknown image format .{fmt} (one of: {', '.join(sorted(supported))})"
        )
    return fmt


def _save(fig: Any, path: Path, dpi: int) -> None:
    """Write a figure whole or not at all (in the format of the file's suffix)."""
    with replacing(path, "the figure") as tmp, open(tmp, "xb") as f:
        fig.savefig(f, format=_format(path), dpi=dpi, bbox_inches="tight")


# ------------------------------------------------------------------ attention


# a side of one map: 0.28 inch each at 100 dpi stays under matplotlib's 2^16 pixels
MAX_PIECES = 2000


def plot_attention(
    attention: str | Path,
    out_dir: str | Path,
    *,
    layer: int | None = None,
    average: bool = False,
    sentences: int = 0,
    dpi: int = 100,
) -> list[Path]:
    """One PNG per sentence of `attention`, an `nmt translate --attention` file:
    `out_dir/attention_<i>.png` (i = the 0-based input line), source pieces across, target
    pieces down, heads averaged;
    a panel per decoder layer, or only `layer` (0-based, negative from the end), or with
    `average` one panel averaged over layers too. `sentences` > 0: only the first that many.
    The whole file (those sentences) is checked before anything is drawn."""
    check_bounds(PlotAttentionOptions, flag, sentences=sentences)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NmtError(
            f"-o {out}: exists and is not a directory; give a directory for attention_<line>.png"
        )
    with contextlib.suppress(FileNotFoundError):  # load_attention words a missing file
        open_for_reading(attention, "the attention file", None).close()  # never a FIFO or a device
    items = load_attention(attention, sentences)
    check_outputs(
        [FileArg("ATTENTION", attention, "the attention file")],
        [FileArg("-o", out / f"attention_{i}.png") for i, *_ in items],
    )
    for index, weights, _, _ in items:
        L, _, T, S = weights.shape
        if layer is not None and not -L <= layer < L:
            raise NmtError(
                f"--layer {layer}: {attention} has {L} layer(s) (0 .. {L - 1}, or negative from "
                "the end)"
            )
        if max(T, S) > MAX_PIECES:
            raise NmtError(
                f"{attention}: attention_{index}: {T} x {S} pieces, too many to draw (at most "
                f"{MAX_PIECES})"
            )
    plt = _pyplot()
    with os_errors_as(f"-o {out}", "cannot create the directory"):
        out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, weights, src, tgt in items:
        fig = _attention_figure(plt, index, weights, src, tgt, layer, average)
        written.append(out / f"attention_{index}.png")
        _save(fig, written[-1], dpi)
        plt.close(fig)
    log.info("wrote %d figure(s) to %s", len(written), out)
    return written


def _attention_figure(
    plt: Any,
    index: int,
    weights: np.ndarray,
    src: list[str],
    tgt: list[str],
    layer: int | None,
    average: bool,
) -> Any:
    """The figure of one sentence (see `plot_attention`); weights (L, H, T, S)."""
    L = weights.shape[0]
    if average:
        panels = [("layers and heads averaged", weights.mean((0, 1)))]
    else:
        layers = range(L) if layer is None else [layer % L]
        panels = [(f"layer {i}, heads averaged", weights[i].mean(0)) for i in layers]
    cell = 0.28  # inches per piece, so that labels stay readable
    width = max(3.0, cell * len(src) + 1.5)
    height = max(2.5, cell * len(tgt) + 1.2)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (title, matrix) in zip(axes[0], panels, strict=True):
        ax.imshow(matrix, cmap="Greys", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
        ax.set(xlabel="source", ylabel="target")
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"sentence {index}", fontsize=10)
    return fig


# ------------------------------------------------------------------ learning curves

# (panel title, train key, valid key, log scale)
PANELS = (
    ("loss (bits per token, label-smoothed)", "loss", "valid_loss", False),
    ("perplexity", "ppl", "valid_ppl", True),
    ("valid BLEU (greedy, val split)", None, "valid_bleu", False),
    ("learning rate", "lr", None, False),
)


# the fields of a record that are drawn: where present, each must be a number within +-MAX_VALUE,
# far beyond any real run's; near the float maximum matplotlib's axis limits overflow (a
# ValueError at 1.7e308, overflow warnings of log-scale ticks at 1e300)
MAX_VALUE = 1e100
PLOTTED = ("update", "elapsed", *(key for _, *keys, _ in PANELS for key in keys if key))
Record = dict[str, Any]  # a record of metrics.jsonl


def read_metrics(run_dir: str | Path) -> tuple[list[Record], list[Record]]:
    """The train and valid records of RUN_DIR/metrics.jsonl, by update; where a resumed run
    wrote an update twice, the later record. The file is text a user may edit: a bad record
    (not UTF-8 or not JSON, as the partial last line of a killed run; not an object with an
    integer `update`; a drawn field that is not a number within +-MAX_VALUE) is skipped, and
    one warning says how many, naming the file and the first one's line."""
    path = Path(run_dir) / "metrics.jsonl"
    records: dict[tuple[str, int], Record] = {}
    bad = 0
    first_bad = 0
    try:
        with open_for_reading(path, "metrics", None) as f:
            for lineno, line in enumerate(f, 1):
                if (rec := _record(line)) is not None:
                    records[rec.get("type", "train"), rec["update"]] = rec
                elif line.strip():
                    bad += 1
                    first_bad = first_bad or lineno
    except FileNotFoundError:
        raise NmtError(f"{run_dir}: no metrics.jsonl (not a run directory of nmt train?)") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror or e})") from None
    if bad:
        log.warning(
            "%s: skipped %d bad record(s), the first on line %d (not a JSON object with an integer "
            "update and numbers)",
            path,
            bad,
            first_bad,
        )
    by_update = sorted(records.items(), key=lambda kv: kv[0][1])
    return [r for (k, _), r in by_update if k == "train"], [
        r for (k, _), r in by_update if k == "valid"
    ]


def _record(line: bytes) -> Record | None:
    """One line of metrics.jsonl as a record, or None where it is not one (see `read_metrics`)."""
    try:
        rec = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8 or not JSON; arrays nested too deep
        return None
    if (
        isinstance(rec, dict)
        and isinstance(rec.get("type", "train"), str)
        and isinstance(rec.get("update"), int)
        and all(_drawable(rec[k]) for k in PLOTTED if k in rec)
    ):
        return rec
    return None


def _drawable(value: Any) -> bool:
    # Python compares an int with a float exactly: no overflow for an integer beyond any float;
    # False for NaN
    return type(value) in (int, float) and abs(value) <= MAX_VALUE  # not a bool


def plot_curves(
    run_dirs: Sequence[str | Path], output: str | Path, *, labels: Sequence[str] = (), dpi: int = 72
) -> Path:
    """Train and valid loss, perplexity, valid BLEU and learning rate of each run, against
    updates (left) and wall-clock time (right), several runs on one figure (one colour per
    run; train solid, valid dashed with dots)."""
    if labels and len(labels) != len(run_dirs):
        raise NmtError(f"--label given {len(labels)} times for {len(run_dirs)} run directories")
    out = target(output, "-o")
    check_outputs(
        [FileArg("RUN_DIR", Path(d) / "metrics.jsonl", "the metrics") for d in run_dirs],
        [FileArg("-o", output)],
    )
    plt = _pyplot()
    _format(out)  # before the work
    runs = [
        (labels[i] if labels else Path(d).name or str(d), *read_metrics(d))
        for i, d in enumerate(run_dirs)
    ]
    for d, (_, train, valid) in zip(run_dirs, runs, strict=True):
        if not train and not valid:  # an empty figure is no picture of a run
            raise NmtError(
                f"{Path(d) / 'metrics.jsonl'}: no records to draw (a run that has not logged an "
                "update yet?)"
            )
    fig, axes = plt.subplots(len(PANELS), 2, figsize=(11, 3.0 * len(PANELS)), squeeze=False)
    for run, (label, train, valid) in enumerate(runs):
        for row, (title, train_key, valid_key, log_scale) in enumerate(PANELS):
            for col, x_key in enumerate(("update", "elapsed")):
                ax = axes[row][col]
                for records, key, style, kind in (
                    (train, train_key, "-", "train"),
                    (valid, valid_key, "--o", "valid"),
                ):
                    points = [
                        (r[x_key] / (60 if col else 1), r[key])
                        for r in records
                        if key and key in r and x_key in r  # a number: `read_metrics` checked
                    ]
                    if points:
                        xs, ys = np.array(points).T
                        ax.plot(
                            xs,
                            ys,
                            style,
                            color=f"C{run % 10}",  # one colour per run
                            markersize=3,
                            linewidth=1.2,
                            label=f"{label} ({kind})",
                        )
                ax.set_title(title, fontsize=9)
                ax.set_xlabel("updates" if col == 0 else "wall time (minutes)", fontsize=8)
                if log_scale:
                    ax.set_yscale("log")
                ax.grid(alpha=0.3)
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out, dpi)
    plt.close(fig)
    log.info("wrote %s (%d run(s))", out, len(runs))
    return out
