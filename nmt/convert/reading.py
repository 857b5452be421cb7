"""What every `nmt import` shares: reading a model's files, its numbers and its weights.

- Files are read under nmt's one rule (`nmt.atomic.open_for_reading`: regular files only, a FIFO
  or a device refused without blocking, a size bound), each recorded in `Reader.files`, so that
  the command can refuse an output that is one of them.
- JSON and YAML of the wrong shape (a list where a mapping belongs, a string where a number does,
  nesting past the parser's depth) and weights that are missing, of another shape or type, not
  finite, or never used are each one line naming the file and the key.
- Weights are read lazily (`Weights`): a tensor only when the mapping asks for it, its shape and
  type checked before its data is read, so a forged shape or an unused member of a `.npz` is
  never decompressed. Nothing runs code from a file: `.bin` loads with
  `torch.load(weights_only=True)`, `.npz` members are parsed without pickles, safetensors is
  read by its library.
- An imported config passes `nmt.config.validate`, as any nmt config does, and its decode
  settings `nmt.config.check_decode` (`decode_settings`); where each weight goes is
  `nmt.convert.table`'s. The model read must compute finite log-probabilities of a probe
  sentence (`check_computes`): finite weights may still overflow float32.
- A weights file past the address-space limit is one line (safetensors maps it whole).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import yaml
from safetensors import SafetensorError, safe_open

from nmt.atomic import READ_LIMIT, open_for_reading, os_errors_as
from nmt.config import Config, DecodeConfig, ModelConfig, check_decode, validate
from nmt.errors import NmtError, one_line
from nmt.fields import shown
from nmt.models.transformer import Transformer
from nmt.tokenizer import Tokenizer

# Marian and OPUS-MT use 512 to 1024; a longer table is a broken config, not a model
MAX_POSITIONS = 1 << 16
_FLOATS = {"F16", "BF16", "F32", "F64"}  # safetensors' names of the floating-point types
_NPY_HEADER = 1 << 16  # more than numpy writes before a .npy member's data
# a language of data.source_lang / target_lang: en, deu, zh_Hant, pt-BR
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*")
TOO_LARGE = "too large for this process's memory (its address-space limit, ulimit -v)"
# a sentence the model translates once at import: weights that overflow float32 (1e30 in a
# layer, a LayerNorm scale of 3e38 from a flipped exponent bit) make its log-probabilities NaN
PROBE = "A dog runs through the snow, 3 children watch it."


@dataclasses.dataclass
class Imported:
    """A model read from its source: config, weights in nmt's layout, tokenizer, the decode
    settings it ships with (beam, length penalty: `DecodeConfig` keys) and the files read."""

    model: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    decode: dict[str, Any]
    source: str  # what it was read from, for the checkpoint's record
    files: list[Path]  # every file read: no output of the import may be one of them
    # the data.source_lang / target_lang it names
    languages: dict[str, str] = dataclasses.field(default_factory=dict)


class Keys:
    """A JSON or YAML mapping (config.json, decoder.yml, special:model.yml), each value read as
    the type its reader expects (None: the default); anything else is one line naming `where`
    (the file) and the key."""

    def __init__(self, raw: Any, where: str):
        if isinstance(raw, list):  # named by its kind, not its items
            raise NmtError(f"{where}: not a mapping of keys (it is a list)")
        if not isinstance(raw, dict):
            raise NmtError(
                f"{where}: not a mapping of keys (it is {'empty' if raw is None else shown(raw)})"
            )
        self.raw = raw
        self.where = where

    def _get(self, key: str, default: Any, ok: Callable[[Any], bool], what: str) -> Any:
        value = self.raw.get(key)
        value = default if value is None else value
        if value is None:
            raise NmtError(f"{self.where}: {key} is missing; it must be {what}")
        if not ok(value):
            raise NmtError(f"{self.where}: {key} is {shown(value)}, not {what}")
        return value

    def int(self, key: str, default: int | None = None) -> int:
        return self._get(key, default, lambda v: type(v) is int, "an integer")  # not a bool

    def number(self, key: str, default: float) -> float:
        return float(
            self._get(
                key,
                default,
                lambda v: type(v) in (int, float) and math.isfinite(v),
                "a finite number",
            )
        )

    def flag(self, key: str, default: bool) -> bool:
        return self._get(key, default, lambda v: isinstance(v, bool), "true or false")

    def text(self, key: str, default: str) -> str:
        return self._get(key, default, lambda v: isinstance(v, str), "a string")

    def names(self, key: str) -> list[str]:
        return self._get(
            key,
            [],
            lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
            "a list of file names",
        )

    def need(self, ok: bool, what: str) -> None:
        if not ok:
            raise NmtError(f"{self.where}: {what}; nmt import cannot map it")


class Reader:
    """The files of one import, each opened under `open_for_reading`'s rule and recorded."""

    def __init__(self) -> None:
        self.files: list[Path] = []

    def open(self, path: Path, what: str, limit: int | None = READ_LIMIT) -> BinaryIO:
        try:
            f = open_for_reading(path, what, limit)
        except FileNotFoundError:
            raise NmtError(f"{path}: not found") from None
        self.files.append(path)
        return f

    def bytes(self, path: Path, what: str) -> bytes:
        with self.open(path, what) as f, os_errors_as(path, f"cannot read {what}"):
            return f.read()

    def text(self, path: Path, what: str) -> str:
        try:
            return self.bytes(path, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise NmtError(f"{path}: {what} is not UTF-8 text ({one_line(e)})") from None

    def json(self, path: Path) -> Keys:
        try:
            return Keys(json.loads(self.text(path, "a JSON file")), str(path))
        except RecursionError:
            raise NmtError(f"{path}: nested too deeply to be a model's JSON") from None
        # JSONDecodeError, or an integer of more digits than Python converts
        except ValueError as e:
            raise NmtError(f"{path}: not readable JSON ({one_line(e)})") from None

    def weights(self, path: Path, prefix: str = "") -> Weights:
        """The tensors of a .safetensors or .bin (a pickled state dict) file, named without
        `prefix`."""
        with self.open(path, "the weights file", limit=None) as f:
            w = _Safetensors(path) if path.suffix == ".safetensors" else _StateDict(path, f)
        w.keys = {key.removeprefix(prefix): key for key in w.keys}
        return w

    def npz(self, path: Path) -> Npz:
        """Marian's .npz, its members read lazily from the open file."""
        return Npz(path, self.open(path, "the model file", limit=None))


def load_yaml(text: str, where: str, loader: Any = yaml.SafeLoader) -> Any:
    try:
        return yaml.load(text, Loader=loader)
    except RecursionError:
        raise NmtError(f"{where}: nested too deeply to be a model's YAML") from None
    except (
        yaml.YAMLError,
        ValueError,
    ) as e:  # ValueError: an integer of more digits than Python converts
        raise NmtError(f"{where}: not readable YAML ({one_line(e)})") from None


def pieces_in_id_order(vocab: dict[str, int], path: Path) -> list[str]:
    pieces: list[str | None] = [None] * len(vocab)
    for piece, i in vocab.items():
        if not 0 <= i < len(vocab) or pieces[i] is not None:
            raise NmtError(
                f"{path}: ids are not 0..{len(vocab) - 1}, each once (id {i} of {piece!r})"
            )
        pieces[i] = piece
    return [p for p in pieces if p is not None]


def check_config(cfg: ModelConfig, where: str, keys: dict[str, str]) -> None:
    """The imported model config under nmt's own validation; `keys` maps nmt's model keys to the
    source's, so that a refusal names the file, the source's key and nmt's."""
    validate(
        Config(model=cfg),
        {"_file": where, **{f"model.{k}": f"{where} ({v})" for k, v in keys.items()}},
    )
    key = keys.get("max_positions", "max_positions")
    if cfg.max_positions > MAX_POSITIONS:
        raise NmtError(
            f"{where} ({key}): {cfg.max_positions} positions, more than nmt imports "
            f"({MAX_POSITIONS:,})"
        )
    if cfg.max_positions < 2:  # a source token and </s>; a first target token after the start
        raise NmtError(
            f"{where} ({key}): {cfg.max_positions} position, too few to translate anything (at "
            "least 2)"
        )


def decode_settings(
    settings: dict[str, Any], names: dict[str, str], vocab_size: int
) -> dict[str, Any]:
    """`settings` (DecodeConfig keys read from the model's files, a lenpen always), checked as
    training checks a config's decode section (`nmt.config.check_decode`, the beam below the
    vocabulary too) and with a length penalty between 0 and 10: a value nothing can decode with
    is refused naming its file and key (`names`: nmt's key -> "file: key")."""
    if not 0 <= settings["lenpen"] <= 10:
        raise NmtError(f"{names['lenpen']} {settings['lenpen']!r} is not a number between 0 and 10")
    decode = dataclasses.replace(DecodeConfig(), **settings)
    check_decode(decode, lambda key: names.get(key, f"decode.{key}"), vocab_size)
    return settings


def check_computes(imported: Imported) -> None:
    """Refuse a model whose log-probabilities of `PROBE` (its translation forced, step by step
    as the search decodes) are not all finite, naming its source: every weight finite, yet
    their products overflow float32, and each translation would come out empty."""
    tok = imported.tokenizer
    cfg = imported.model
    model = Transformer(cfg, tok.vocab_size, tok.specials.pad, tok.source_vocab_size).eval()
    model.load_state_dict(imported.weights)
    limit = cfg.max_positions - 1
    src = torch.tensor([[*tok.encode(PROBE)[: limit - 1], tok.specials.eos]])  # (1, S)
    feed = [tok.specials.bos, *tok.encode_target(PROBE)[: limit - 1]]
    with torch.inference_mode():
        state = model.encode(src)
        for token in feed:
            lprobs, state = model.decode_step(torch.tensor([token]), state)  # (1, V)
            if not lprobs.isfinite().all():
                raise NmtError(
                    f"{imported.source}: the model computes NaN or infinite log-probabilities (on "
                    "a probe sentence): its weights overflow float32; nmt import refuses it"
                )


# ---------------------------------------------------------------- weights


class Weights:
    """A weights file's tensors by name, read when `take` asks: each checked (present, of the
    shape the mapping expects, floating-point, finite) before it is used, and every name the
    mapping never took refused by `check_all_used`. `hint` ends shape errors (the sizes meant)."""

    def __init__(self, path: Path, keys: list[str]):
        self.path = path
        self.used = set[str]()
        self.hint = ""
        self.keys = {key: key for key in keys}  # name -> the file's key

    def take(self, name: str, *shape: int) -> torch.Tensor:
        """Weight `name` of `shape` as float32; a vector (n,) may be stored (1, n), as Marian and
        Hugging Face's final_logits_bias store theirs."""
        if name not in self.keys:
            raise NmtError(f"{self.path}: no weight {name}")
        key = self.keys[name]
        have, dtype, floating = self._header(key)
        if not floating:
            raise NmtError(f"{self.path}: weight {key} holds {dtype}, not floating-point numbers")
        if have != shape and not (len(shape) == 1 and have == (1, *shape)):
            want = (1, *shape) if len(shape) == 1 else shape
            raise NmtError(f"{self.path}: weight {key} has shape {have}, not {want}{self.hint}")
        tensor = self._read(key, shape).float().reshape(shape)
        if not torch.isfinite(tensor).all():
            raise NmtError(f"{self.path}: weight {key} holds NaN or infinite values")
        self.used.add(name)
        return tensor

    def has(self, name: str) -> bool:
        return name in self.keys

    def ignore(self, *names: str) -> None:
        """Names a source may hold that the model does not read (copies of tied weights, tables
        it recomputes): not refused as unused."""
        self.used.update(names)

    def check_all_used(self, why: str) -> None:
        if unused := sorted(set(self.keys) - self.used):
            more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
            raise NmtError(
                f"{self.path}: weight {self.keys[unused[0]]}{more} is not part of the model {why}; "
                "nmt import refuses weights it would drop"
            )

    def _header(self, name: str) -> tuple[tuple[int, ...], str, bool]:
        """(shape, dtype name, whether floating-point) of `name`, its data not read."""
        raise NotImplementedError

    def _read(self, name: str, want: tuple[int, ...]) -> torch.Tensor:
        raise NotImplementedError


class _StateDict(Weights):
    """pytorch_model.bin: a state dict pickled by torch.save, loaded with weights_only (no code
    runs)."""

    def __init__(self, path: Path, f: BinaryIO):
        try:
            # torch's deprecation notes on a quantized tensor: the refusal says it all
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - a damaged or forged file's error is the user's
            if zipfile.is_zipfile(path) and "Weights only load failed" in str(e):
                raise NmtError(
                    f"{path}: holds objects that safe loading (weights_only) refuses"
                ) from None
            raise NmtError(f"{path}: cannot read ({one_line(e)})") from None
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in state.items()
        ):
            raise NmtError(f"{path}: not a state dict of tensors")
        super().__init__(path, list(state))
        self.state = state

    def _header(self, name: str) -> tuple[tuple[int, ...], str, bool]:
        t = self.state[name]
        # sparse, or no data at all: no array of floats either
        if t.layout != torch.strided or t.is_meta:
            return tuple(t.shape), f"a {'meta' if t.is_meta else t.layout} tensor", False
        return tuple(t.shape), str(t.dtype).removeprefix("torch."), t.dtype.is_floating_point

    def _read(self, name: str, want: tuple[int, ...]) -> torch.Tensor:
        return self.state[name]


class _Safetensors(Weights):
    def __init__(self, path: Path):
        try:
            self.file = safe_open(str(path), framework="pt")  # maps the whole file into memory
            names = list(self.file.keys())
        except MemoryError as e:  # a file past the address-space limit (ulimit -v)
            raise NmtError(f"{path}: {TOO_LARGE} ({one_line(e)})") from None
        except (SafetensorError, OSError) as e:
            raise NmtError(f"{path}: not a readable safetensors file ({one_line(e)})") from None
        super().__init__(path, names)

    def _header(self, name: str) -> tuple[tuple[int, ...], str, bool]:
        part = self.file.get_slice(name)
        return tuple(part.get_shape()), part.get_dtype(), part.get_dtype() in _FLOATS

    def _read(self, name: str, want: tuple[int, ...]) -> torch.Tensor:
        try:
            return self.file.get_tensor(name)
        except MemoryError as e:
            raise NmtError(f"{self.path}: weight {name}: {TOO_LARGE} ({one_line(e)})") from None
        except (SafetensorError, OSError) as e:
            raise NmtError(f"{self.path}: weight {name} cannot be read ({one_line(e)})") from None


class Npz(Weights):
    """Marian's model.npz: a zip of .npy members, each parsed here (header, then the data it
    declares), never with pickles; a member is decompressed only when taken, after its stored
    size is checked against the shape the mapping expects."""

    def __init__(self, path: Path, f: BinaryIO):
        try:
            self.zip = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            f.close()
            raise NmtError(f"{path}: not a .npz archive of arrays ({one_line(e)})") from None
        self.file = f
        self.members = {info.filename.removesuffix(".npy"): info for info in self.zip.infolist()}
        super().__init__(path, [name for name in self.members if not name.startswith("special:")])

    def close(self) -> None:
        self.zip.close()
        self.file.close()

    def member(
        self, name: str, limit: int | None
    ) -> tuple[tuple[int, ...], np.dtype, np.ndarray | None]:
        """(shape, dtype, array) of member `name`; with `limit` None only its header is read (the
        array is None), else its data too, unless the member stores more than `limit` bytes of
        data: its declared size is checked before its data is decompressed."""
        info = self.members[name]
        try:
            with self.zip.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = read(f)
                if dtype.hasobject:
                    raise NmtError(
                        f"{self.path}: {name} holds Python objects (pickles), which nmt never loads"
                    )
                if limit is None:
                    return shape, dtype, None
                if info.file_size > limit + _NPY_HEADER:
                    raise NmtError(
                        f"{self.path}: {name} stores {info.file_size:,} bytes, more than the "
                        f"{limit:,} it may hold"
                    )
                size = math.prod(shape) * dtype.itemsize
                raw = f.read(size)
        except MemoryError as e:
            raise NmtError(f"{self.path}: {name}: {TOO_LARGE} ({one_line(e)})") from None
        except (
            ValueError,
            OSError,
            EOFError,
            RuntimeError,
            NotImplementedError,
            zipfile.BadZipFile,
        ) as e:
            raise NmtError(f"{self.path}: {name} is not a readable array ({one_line(e)})") from None
        if len(raw) < size:
            raise NmtError(f"{self.path}: {name} is truncated ({len(raw):,} of {size:,} bytes)")
        return shape, dtype, np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran else "C")

    def _header(self, name: str) -> tuple[tuple[int, ...], str, bool]:
        shape, dtype, _ = self.member(name, None)
        return shape, str(dtype), dtype.kind == "f"

    def _read(self, name: str, want: tuple[int, ...]) -> torch.Tensor:
        array = self.member(name, math.prod(want) * 8)[2]  # float64 at most
        assert array is not None
        return torch.from_numpy(array.astype(np.float32))
