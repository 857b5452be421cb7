"""Pictures (`nmt plot`): attention heat maps from `translate --attention` files, and learning
curves from run directories' `metrics.jsonl`. matplotlib is an optional extra, imported only
here (`pip install 'nmt[plot]'`); without it the commands say how to install it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.atomic import FileArg, check_outputs, replacing, target
from nmt.decoding.alignment import load_attention
from nmt.errors import NmtError

log = logging.getLogger(__name__)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise NmtError("nmt plot needs matplotlib: pip install 'nmt[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, dpi: int) -> None:
    """Write a figure whole or not at all (png by the file's suffix)."""
    with replacing(path, "the figure") as tmp, open(tmp, "xb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight")


# ------------------------------------------------------------------ attention


def plot_attention(path: str | Path, out_dir: str | Path, *, layer: int | None = None, average: bool = False,
                   sentences: int = 0, dpi: int = 100) -> list[Path]:
    """One PNG per sentence of an `nmt translate --attention` file: `out_dir/attention_<i>.png`
    (i = the 0-based input line), source pieces across, target pieces down, heads averaged;
    a panel per decoder layer, or only `layer` (0-based, negative from the end), or with
    `average` one panel averaged over layers too. `sentences` > 0: only the first that many."""
    plt = _pyplot()
    items = load_attention(path)
    if sentences:
        items = items[:sentences]
    out = Path(out_dir)
    check_outputs([FileArg("ATTENTION", path, "the attention file")],
                  [FileArg("-o", out / f"attention_{i}.png") for i, *_ in items])
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, weights, src, tgt in items:
        L = weights.shape[0]
        if layer is not None and not -L <= layer < L:
            raise NmtError(f"--layer {layer}: {path} has {L} layer(s) (0 .. {L - 1}, or negative from the end)")
        if average:
            panels = [("layers and heads averaged", weights.mean((0, 1)))]
        elif layer is not None:
            panels = [(f"layer {layer % L}, heads averaged", weights[layer].mean(0))]
        else:
            panels = [(f"layer {i}, heads averaged", weights[i].mean(0)) for i in range(L)]
        cell = 0.28  # inches per piece, so that labels stay readable
        width, height = max(3.0, cell * len(src) + 1.5), max(2.5, cell * len(tgt) + 1.2)
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
        for ax, (title, matrix) in zip(axes[0], panels, strict=True):
            ax.imshow(matrix, cmap="Greys", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
            ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
            ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
            ax.set_xlabel("source")
            ax.set_ylabel("target")
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"sentence {index}", fontsize=10)
        written.append(out / f"attention_{index}.png")
        _save(fig, written[-1], dpi)
        plt.close(fig)
    log.info("wrote %d figure(s) to %s", len(written), out)
    return written


# ------------------------------------------------------------------ learning curves

# (panel title, train key, valid key, log scale)
PANELS = (("loss (bits per token, label-smoothed)", "loss", "valid_loss", False),
          ("perplexity", "ppl", "valid_ppl", True),
          ("valid BLEU (greedy, val split)", None, "valid_bleu", False),
          ("learning rate", "lr", None, False))


def read_metrics(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The train and valid records of RUN_DIR/metrics.jsonl, by update; where a resumed run
    wrote an update twice, the later record."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise NmtError(f"{run_dir}: no metrics.jsonl (not a run directory of nmt train?)")
    records: dict[tuple[str, int], dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a partial last line of a killed run
            if isinstance(rec, dict) and isinstance(rec.get("update"), int):
                records[(str(rec.get("type", "train")), rec["update"])] = rec
    by_kind = ([r for (k, _), r in sorted(records.items(), key=lambda kv: kv[0][1]) if k == kind]
               for kind in ("train", "valid"))
    train, valid = by_kind
    return train, valid


def plot_curves(run_dirs: Sequence[str | Path], output: str | Path, *, labels: Sequence[str] = (),
                dpi: int = 72) -> Path:
    """Train and valid loss, perplexity, valid BLEU and learning rate of each run, against
    updates (left) and wall-clock time (right), several runs on one figure (one colour per
    run; train solid, valid dashed with dots)."""
    if labels and len(labels) != len(run_dirs):
        raise NmtError(f"--label given {len(labels)} times for {len(run_dirs)} run directories")
    out = target(output, "-o")
    check_outputs([FileArg("RUN_DIR", Path(d) / "metrics.jsonl", "the metrics") for d in run_dirs],
                  [FileArg("-o", output)])
    runs = [(labels[i] if labels else Path(d).name or str(d), *read_metrics(d)) for i, d in enumerate(run_dirs)]
    plt = _pyplot()
    fig, axes = plt.subplots(len(PANELS), 2, figsize=(11, 3.0 * len(PANELS)), squeeze=False)
    for run, (label, train, valid) in enumerate(runs):
        color = f"C{run % 10}"
        for row, (title, train_key, valid_key, log_scale) in enumerate(PANELS):
            for col, x_key in enumerate(("update", "elapsed")):
                ax = axes[row][col]
                for records, key, style, kind in ((train, train_key, "-", "train"), (valid, valid_key, "--o", "valid")):
                    points = [(r[x_key] / (60 if col else 1), r[key]) for r in records
                              if key and isinstance(r.get(key), (int, float)) and x_key in r]
                    if points:
                        xs, ys = np.array(points).T
                        ax.plot(xs, ys, style, color=color, markersize=3, linewidth=1.2, label=f"{label} ({kind})")
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
