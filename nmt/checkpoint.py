"""Checkpoint files: atomic writes, loading with clear errors, listing, pruning, averaging.

`load_model_checkpoint` is the one loader of a checkpoint to translate or export with: it
adds to `load_checkpoint`'s checks the parsed config and the embedded sentencepiece model,
checked against the checkpoint's vocab_size.

The checkpoint format is described in `docs/architecture.md`. Checkpoints are loaded with
`torch.load(weights_only=True)`: they hold only tensors, dicts, lists, tuples, str, bytes,
int, float, bool and None (RNG states as torch ByteTensors, never numpy arrays), so loading
one cannot run code from the file.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.atomic import FileArg, check_outputs, fsync_path, open_for_reading, replacing, target
from nmt.config import Config, changed_keys, config_from_dict, config_to_dict
from nmt.errors import NmtError, one_line
from nmt.fields import check_bounds, flag
from nmt.options import AverageOptions
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Written by `nmt train` in its working directory (the run directory it started); read by
# `nmt translate` when no --checkpoint is given.
LAST_RUN_FILE = ".nmt-last-run"
SUPPORTED_FORMAT_VERSIONS = (1,)
REQUIRED_KEYS = ("format_version", "model", "config")
# Keys of an averaged checkpoint taken from the newest input; everything else is dropped.
KEPT_KEYS = ("format_version", "config", "vocab_size", "tokenizer", "update", "epoch")

_UPDATE_CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pt")
# What marks a directory as a run directory of `nmt train` (nmt.training.rundir writes them)
RUN_DIR_MARKERS = ("config.yaml", "metrics.jsonl", "train.log", "train.lock", "checkpoint_last.pt")


def to_cpu(obj: Any) -> Any:
    """`obj` with every tensor in it (dicts, lists, tuples) moved to the CPU: a checkpoint
    written on a GPU loads anywhere, also with a plain torch.load."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    return type(obj)(to_cpu(v) for v in obj) if isinstance(obj, (list, tuple)) else obj


def atomic_save(obj: Any, path: str | Path, *, own: bool = False) -> None:
    """torch.save `obj` so that `path` holds either its previous content or all of `obj`,
    even if the process is killed or the disk fills up (fsync, rename, fsync the directory).
    `own`: a file of a run directory (`nmt.atomic.own_file`), no link followed.
    """
    with replacing(Path(path), own=own) as tmp, open(tmp, "xb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Make `dst` (e.g. checkpoint_last.pt) the same file as `src`, atomically.

    A hard link costs no space; where links are impossible, a copy. Later writes to either
    name go through `atomic_save`, which replaces the name, never the shared content.
    """
    with replacing(Path(dst), own=True) as tmp:  # a run directory's file
        try:
            os.link(src, tmp)
        except OSError:  # filesystems without hard links
            shutil.copyfile(src, tmp)
            fsync_path(tmp)


def checkpoint_dict(
    weights: dict[str, torch.Tensor],
    cfg: Config,
    tokenizer: Tokenizer,
    *,
    update: int = 0,
    epoch: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """The dict of a checkpoint in nmt's format (`FORMAT_VERSION`): the weights, the config, the
    tokenizer, the counters, then `extra` entries (`train_state`, `imported_from`). The one builder:
    training, import and averaging (which keeps these keys of its first input) all write it."""
    return {
        "format_version": FORMAT_VERSION,
        "model": weights,
        "config": config_to_dict(cfg),
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": {"model": tokenizer.model_bytes, "sha256": tokenizer.sha256},
        "update": update,
        "epoch": epoch,
        **extra,
    }


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", *, mmap: bool = False
) -> dict[str, Any]:
    """Load and check a checkpoint. `mmap=True` pages tensors in lazily (cheap for
    averaging when `train_state` is large)."""
    try:
        open_for_reading(
            path, "the checkpoint", None
        ).close()  # a regular file: never a FIFO or a device
    except FileNotFoundError:
        raise NmtError(f"{path}: checkpoint not found") from None
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:
        reason = one_line(exc)
        if not zipfile.is_zipfile(path):  # torch's words for it depend on mmap: "invalid load key"
            reason = "not the zip archive that torch.save writes"
        elif "Weights only load failed" in reason:
            raise NmtError(
                f"{path}: checkpoint holds objects that safe loading (weights_only) refuses; it "
                f"was not written by nmt ({reason[:120]})"
            ) from exc
        raise NmtError(f"{path}: corrupt or truncated checkpoint ({reason})") from exc
    if not isinstance(ckpt, dict):
        raise NmtError(f"{path}: corrupt or truncated checkpoint (not a dict)")
    if missing := [key for key in REQUIRED_KEYS if key not in ckpt]:
        raise NmtError(f"{path}: corrupt or truncated checkpoint (missing {', '.join(missing)})")
    model = ckpt["model"]
    config = ckpt["config"]
    if not isinstance(model, dict) or not all(isinstance(t, torch.Tensor) for t in model.values()):
        raise NmtError(f"{path}: not an nmt checkpoint (its model is not a dict of tensors)")
    if bad := next(
        (k for k, t in model.items() if t.is_floating_point() and not t.isfinite().all()), None
    ):
        raise NmtError(
            f"{path}: weight {bad} holds NaN or infinite values; the checkpoint is damaged"
        )
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise NmtError(f"{path}: not an nmt checkpoint (its config is not a dict of sections)")
    if ckpt["format_version"] not in SUPPORTED_FORMAT_VERSIONS:
        raise NmtError(
            f"{path}: unsupported checkpoint format_version {ckpt['format_version']!r} (this nmt "
            f"reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})"
        )
    return ckpt


@dataclass
class ModelCheckpoint:
    """What translating or exporting needs of a checkpoint, checked (`load_model_checkpoint`)."""

    path: Path
    config: Config
    tokenizer: Tokenizer  # its sentencepiece model, with the special ids (`tokenizer.specials`)
    weights: dict[str, torch.Tensor]  # the model's state dict

    def load_into(self, model: torch.nn.Module) -> None:
        """Copy the weights into `model`, built from this checkpoint's model config; an NmtError
        naming the checkpoint where they do not fit it (missing or unexpected keys, other
        shapes)."""
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as e:
            raise NmtError(
                f"{self.path}: its weights do not match its model config ({one_line(e, 300)})"
            ) from None


def load_model_checkpoint(path: str | Path, *, mmap: bool = False) -> ModelCheckpoint:
    """Load `path` to translate or export with: `load_checkpoint`'s checks, then its config
    parsed and its sentencepiece model loaded, which must have the checkpoint's vocab_size.
    Every error is one line naming `path`."""
    path = Path(path)
    state = load_checkpoint(path, mmap=mmap)
    config = config_from_dict(state["config"], where=str(path))
    entry = state.get("tokenizer")
    vocab_size = state.get("vocab_size")
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("model"), bytes)
        or not isinstance(entry.get("sha256"), str)
    ):
        raise NmtError(
            f"{path}: the checkpoint holds no sentencepiece model (tokenizer); it cannot translate"
        )
    if type(vocab_size) is not int or vocab_size < 1:  # not a bool either
        raise NmtError(f"{path}: the checkpoint's vocab_size is missing or not a positive integer")
    tokenizer = Tokenizer.from_bytes(entry["model"], name=f"{path}: its sentencepiece model")
    if tokenizer.vocab_size != vocab_size:
        raise NmtError(
            f"{path}: vocab_size {vocab_size} differs from its sentencepiece model's "
            f"{tokenizer.vocab_size}; the checkpoint is inconsistent"
        )
    return ModelCheckpoint(path, config, tokenizer, state["model"])


def load_latest(run_dir: str | Path) -> dict[str, Any] | None:
    """The training checkpoint to resume `run_dir` from, or None for a fresh run.

    checkpoint_last.pt, unless a checkpoint_<update>.pt is newer (a kill between writing it
    and linking checkpoint_last.pt to it); if checkpoint_last.pt is missing, truncated or
    corrupt, the newest checkpoint_<update>.pt that loads, with a warning naming each file
    passed over, and then checkpoint_best.pt (written first at a save; the one file a user
    pruning the run keeps), never replaced by a fresh run. Where checkpoints exist but none
    loads, an NmtError names them.
    """
    run_dir = Path(run_dir)
    if not has_checkpoints(run_dir):
        return None
    last = run_dir / "checkpoint_last.pt"
    best = run_dir / "checkpoint_best.pt"
    numbered = [
        *reversed(list_update_checkpoints(run_dir)),
        *([(-1, best)] if best.is_file() else []),
    ]
    for path in [
        last,
        *(path for _, path in numbered),
    ]:  # a run directory's files are its own (training.rundir)
        if path.is_symlink():
            raise NmtError(
                f"{path}: a checkpoint is a symbolic link, which nmt does not follow; remove it"
            )
    failures: list[str] = []
    state = None
    source = last
    if last.is_file():
        state = _load_for_resume(last, failures)
    else:
        log.warning(
            "%s is missing; looking for the newest checkpoint_<update>.pt, then checkpoint_best.pt",
            last,
        )
    for number, path in numbered:  # newest first
        if state is not None and number <= state.get("update", -1):
            break
        newer = _load_for_resume(path, failures)
        if newer is not None:
            if state is not None:
                log.warning(
                    "%s is newer than %s (update %s); resuming from it",
                    path.name,
                    last.name,
                    state.get("update"),
                )
            state = newer
            source = path
            break
    if state is None:
        raise NmtError(
            f"{run_dir}: no checkpoint loads ({', '.join(failures)} are corrupt or truncated); "
            "move them away to start afresh"
        )
    if failures:
        log.warning("resuming from %s (passed over: %s)", source, ", ".join(failures))
    return state


def has_checkpoints(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a checkpoint that `nmt train` resumes (`load_latest`):
    checkpoint_last.pt, checkpoint_best.pt or a checkpoint_<update>.pt."""
    run_dir = Path(run_dir)
    return run_dir.is_dir() and (
        any((run_dir / f"checkpoint_{name}.pt").is_file() for name in ("last", "best"))
        or bool(list_update_checkpoints(run_dir))
    )


def _load_for_resume(path: Path, failures: list[str]) -> dict[str, Any] | None:
    try:
        state = load_checkpoint(path)
    except NmtError as e:
        log.warning("%s; trying another checkpoint", e)
        failures.append(path.name)
        return None
    if "train_state" not in state:
        raise NmtError(f"{path}: not a training checkpoint (no train_state); cannot resume from it")
    return state


def list_update_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The `checkpoint_<update>.pt` files of `run_dir`, oldest first (numeric order)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: run directory not found")
    matches = ((_UPDATE_CHECKPOINT.fullmatch(entry.name), entry) for entry in run_dir.iterdir())
    return sorted(
        (int(match.group(1)), entry)
        for match, entry in matches
        if match is not None and entry.is_file()
    )


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the `keep_last` newest `checkpoint_<update>.pt` (0 = keep all).

    checkpoint_best.pt, checkpoint_last.pt and averaged files never match the pattern.
    Returns the deleted paths.
    """
    if keep_last <= 0:
        return []
    doomed = [path for _, path in list_update_checkpoints(run_dir)[:-keep_last]]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def select_for_average(run_dir: str | Path, last: int) -> list[Path]:
    """The `last` (at least 1: `average_command` checks it) newest `checkpoint_<update>.pt` of
    `run_dir`, oldest first."""
    found = list_update_checkpoints(run_dir)
    if len(found) < last:
        raise NmtError(
            f"{run_dir}: asked to average the last {last} checkpoints but only {len(found)} "
            "checkpoint_<update>.pt file(s) exist"
        )
    return [path for _, path in found[-last:]]


def average_checkpoints(paths: list[Path], out: str | Path) -> dict[str, Any]:
    """Average the `model` weights of `paths` into a new checkpoint written to `out`.

    fairseq's rules: identical key sets and shapes; floating-point tensors are averaged in
    (at least) fp32 and stored back in their own dtype. Integer and bool buffers (counters,
    masks) have no meaningful mean, so they must be identical in every input and are copied.
    The mean is a running one (m += (x - m) / k): equal to sum / N up to rounding, it avoids
    the overflow of a large sum, and averaging copies of one checkpoint returns it bit for bit.
    Metadata comes from the newest (last) input; `train_state` is dropped and `averaged_from`
    records the input file names. Only one input is in memory at a time (loaded with mmap).
    """
    if not paths:
        raise NmtError("average: at least one checkpoint is needed")
    for path in paths:  # before any is read: reading big checkpoints takes minutes
        if not path.is_file():
            raise NmtError(f"{path}: checkpoint not found")
    check_average_output(paths, Path(out))

    first = paths[0]
    ckpt = load_checkpoint(first, mmap=True)
    reference = {key: ckpt.get(key) for key in ("config", "vocab_size", "tokenizer")}
    dtypes = {key: tensor.dtype for key, tensor in ckpt["model"].items()}
    mean = {
        key: tensor.to(torch.promote_types(tensor.dtype, torch.float32), copy=True)  # fp32 at least
        if tensor.is_floating_point()
        else tensor.clone()
        for key, tensor in ckpt["model"].items()
    }
    for k, path in enumerate(paths[1:], start=2):
        ckpt = load_checkpoint(path, mmap=True)
        state = ckpt["model"]
        _check_same_model(reference, ckpt, first, path)
        _check_compatible(mean, dtypes, state, first, path)
        for key, tensor in state.items():
            if tensor.is_floating_point():
                mean[key] += (tensor.to(mean[key].dtype) - mean[key]) / k
            elif not torch.equal(tensor, mean[key]):
                raise NmtError(
                    f"{path}: integer buffer {key} differs from {first}; integer and bool buffers "
                    "cannot be averaged and must be identical"
                )

    result = {key: ckpt[key] for key in KEPT_KEYS if key in ckpt}
    result["model"] = {key: mean[key].to(dtypes[key]) for key in mean}
    result["averaged_from"] = [path.name for path in paths]
    atomic_save(result, out)
    log.info(
        "averaged %d checkpoint(s) (%s) into %s", len(paths), ", ".join(p.name for p in paths), out
    )
    return result


def check_average_output(inputs: list[Path], out: Path) -> None:
    """Refuse an output that is one of the inputs (by any name: hard links, symlinks) or a name
    that `nmt train` owns in a run directory: overwriting them loses a training checkpoint that
    resuming needs (an average has no training state)."""
    check_outputs(
        [FileArg("CHECKPOINTS", p, "one of the checkpoints being averaged") for p in inputs],
        [FileArg("-o", out)],
    )
    out = target(out, "-o")
    owned = out.name in (
        "checkpoint_last.pt",
        "checkpoint_best.pt",
    ) or _UPDATE_CHECKPOINT.fullmatch(out.name)
    if owned and any((out.parent / marker).exists() for marker in RUN_DIR_MARKERS):
        raise NmtError(
            f"-o {out}: {out.name} is a name `nmt train` owns in the run directory {out.parent}; "
            f"write the average as e.g. {out.parent / 'checkpoint_avg.pt'}"
        )


def _check_same_model(
    reference: dict[str, Any], ckpt: dict[str, Any], first: Path, path: Path
) -> None:
    """Checkpoints to average must be of one model: the same tokenizer, vocabulary and model
    config (weights of equal shapes may belong to models that compute otherwise: 8 heads or 4)."""
    if (ckpt.get("tokenizer") or {}).get("sha256") != (reference["tokenizer"] or {}).get("sha256"):
        raise NmtError(f"average: {path} and {first} use different tokenizers")
    if ckpt.get("vocab_size") != reference["vocab_size"]:
        raise NmtError(
            f"average: vocab_size is {reference['vocab_size']} in {first} but "
            f"{ckpt.get('vocab_size')} in {path}"
        )
    cfg = config_from_dict(reference["config"], where=str(first))
    other = config_from_dict(ckpt["config"], where=str(path))
    check_direction(
        path, other, cfg.data, f"as {first} does; only checkpoints of one model can be averaged"
    )
    if changed := changed_keys(cfg, other, "model"):
        key, a, b = changed[0]
        raise NmtError(
            f"average: {key} is {a!r} in {first} but {b!r} in {path}; only checkpoints of one "
            "model can be averaged"
        )


def check_direction(path: Path | str, cfg: Config, data: Any, other: str) -> None:
    """Refuse the model of `path` unless it translates `data.source_lang` to `data.target_lang`
    (any object with both), where both sides name their languages (an import may not); `other`
    says what it must match."""
    have = (cfg.data.source_lang, cfg.data.target_lang)
    want = (data.source_lang, data.target_lang)
    if all(have + want) and have != want:
        raise NmtError(f"{path}: translates {'->'.join(have)}, not {'->'.join(want)} ({other})")


def _check_compatible(
    mean: dict[str, torch.Tensor],
    dtypes: dict[str, torch.dtype],
    state: dict[str, torch.Tensor],
    first: Path,
    path: Path,
) -> None:
    for key in sorted(mean.keys() ^ state.keys()):
        has, lacks = (first, path) if key in mean else (path, first)
        raise NmtError(f"average: key {key} is in {has} but not in {lacks}")
    for key, tensor in state.items():
        if tensor.shape != mean[key].shape:
            raise NmtError(
                f"average: key {key} has shape {tuple(mean[key].shape)} in {first} but "
                f"{tuple(tensor.shape)} in {path}"
            )
        if tensor.dtype != dtypes[key]:
            raise NmtError(
                f"average: key {key} has dtype {dtypes[key]} in {first} but {tensor.dtype} in "
                f"{path}"
            )


def average_command(inputs: list[Path], output: Path, last: int | None) -> None:
    """`nmt average-checkpoints`: the `last` latest numbered checkpoints of one run directory,
    or the given files, averaged into `output`."""
    check_bounds(AverageOptions, flag, last=last)
    paths = inputs
    if last is not None:
        if len(inputs) != 1 or not inputs[0].is_dir():
            raise NmtError("--last N takes exactly one run directory")
        paths = select_for_average(inputs[0], last)
    else:
        for path in inputs:
            if path.is_dir():
                raise NmtError(f"{path} is a directory: add --last N")
    average_checkpoints(paths, output)
