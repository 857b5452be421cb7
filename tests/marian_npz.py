"""Tiny random Marian releases, written as Marian lays them out, and Marian's computation of them.

`write_release(folder, variant)` writes what a Marian (OPUS-MT) release holds:
- `model.npz`: the parameters under Marian's names (`Wemb` or `encoder_Wemb`/`decoder_Wemb`,
  `encoder_l1_self_Wq`, ..., `decoder_l1_context_Wo_ln_scale`, `decoder_ff_logit_out_b`),
  matrices (in, out), biases and LayerNorm parameters (1, dim), and `special:model.yml`: the
  options' YAML as an int8 array with a trailing NUL, as Marian writes it. The random
  parameters (`random_weights`) are named here, as Marian names them, not by nmt's weight
  table (`nmt.convert.table`): the import reads them through the table, so they witness it;
  a trained model's go back through the table (`to_marian_layout`);
- `vocab.yml` in yaml-cpp's style (`yaml_cpp_key`), `</s>` 0 and `<unk>` 1 unless the
  variant moves `</s>` (or, separate vocabularies, `vocab.src.yml` and `vocab.trg.yml` of one
  size: `separate_vocabularies`); `source.spm` / `target.spm` (tiny sentencepiece models);
  `decoder.yml`.

`marian_log_probs` is Marian's transformer transcribed (src/models/transformer.h at marian-dev
c9f287db: embeddings times sqrt(dim), its sinusoids, `dan` / `n`+`da`+top `n` processing,
LayerNorm eps 1e-6, a zero vector before the first target token, the activations by version),
in float64, from the `.npz`'s arrays: the reference that the import is checked against
where CTranslate2 cannot be (it has no Marian position table, and maps gelu to one formula).
Pre-norm self-attention attends over the normalised input, as Marian trains since v1.10.24
(marian-dev 14042019: "fixes missing norm for keys and values in self-attention with pre-norm");
Marian before that, and its step-by-step decoder after the first step (DecoderLayerSelfAttention
passes the cached states, not the input, as keys), use the input unnormalised.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch

from nmt.config import ModelConfig
from nmt.convert.table import MARIAN, write

# Pieces a vocabulary may hold that YAML quotes, escapes or reads as something else, and that
# CTranslate2's line parser (`load_vocab`) reads right too: in every release's vocabulary.
AWKWARD = [
    '"',
    "'",
    "'a'",
    '"a"',
    "a:b",
    ":x",
    "x:",
    ":",
    "#",
    "#x",
    "x#",
    "\u2581#",
    "yes",
    "no",
    "null",
    "Null",
    "~",
    "true",
    "false",
    "on",
    "123",
    "1.5",
    "0x1F",
    "-",
    "-x",
    "--",
    "---",
    "...",
    "?",
    "?x",
    "\\",
    "a\\b",
    "\\x41",
    '"\\',
    "#\\x",
    "<<",
    "=",
    "!x",
    "&x",
    "*x",
    "%x",
    "@x",
    "`x",
    "|",
    ">",
    "[",
    "]",
    "{",
    "}",
    ",",
    "x,y",
    "\x01",
    "\xa0",
    "\x7f",
    "\x85",
    "\u2028",
    "a\u2029b",
    "\U0001f600",
]
# Pieces whose yaml-cpp form CTranslate2's parser misreads (an escape it does not know: \t -> "t",
# \b -> "b", \ufeff -> "ufeff", a \x escape inside a longer piece); only in vocabulary-only tests.
CT2_MISREAD = ["\t", "\b", "\ufeff", "a\x01"]

LANGUAGE_TOKENS = [">>fra<<", ">>deu<<"]


@dataclasses.dataclass(frozen=True)
class Variant:
    """One Marian model. tying: "all" (one `Wemb`, also the output layer: tied-embeddings-all),
    "src" (one `Wemb`, tied-embeddings-src, an output matrix of its own), "decoder"
    (`encoder_Wemb` and `decoder_Wemb`, the latter also the output layer: tied-embeddings) or
    "none" (`encoder_Wemb`, `decoder_Wemb` and an output matrix). An output matrix of its own is
    `decoder_ff_logit_out_W` (dim, V) as older Marian wrote it or `decoder_ff_logit_out_Wt`
    (V, dim) as newer Marian does (`untied_name`)."""

    pre_norm: bool = False
    top_norm: bool = (
        True  # pre-norm: a LayerNorm after each side's last layer (transformer-postprocess-top n)
    )
    tying: str = "all"
    untied_name: str = "W"
    activation: str = "swish"
    version: str = "v1.11.0 f00d062 2022-02-08 08:39:24 -0800"
    d_model: int = 32
    heads: int = 4
    ffn: int = 64
    layers: tuple[int, int] = (2, 2)
    eos_index: int = 0  # where </s> is in vocab.yml (Marian's own: 0)
    separate: bool = False  # vocab.src.yml and vocab.trg.yml (tying "decoder" or "none")
    seed: int = 0


@dataclasses.dataclass
class Release:
    folder: Path
    decoder_yml: Path
    npz: Path
    pieces: list[str]  # vocab.yml's (vocab.trg.yml's) pieces in id order
    weights: dict[str, np.ndarray]  # the parameters (without special:model.yml)
    options: dict[str, Any]  # special:model.yml
    source_pieces: list[str] | None = None  # vocab.src.yml's, where the vocabularies are separate

    @property
    def vocab_files(self) -> list[Path]:
        names = (
            ["vocab.src.yml", "vocab.trg.yml"] if self.source_pieces else ["vocab.yml", "vocab.yml"]
        )
        return [self.folder / name for name in names]

    @property
    def eos(self) -> int:
        return self.pieces.index("</s>")


# ------------------------------------------------------------------ sentencepiece models


def _corpus(seed: int, syllables: Sequence[str], n: int = 400) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(120)]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 10))).capitalize()
        + rng.choice(".?!")
        for _ in range(n)
    ]


SOURCE_SYLLABLES = ["ka", "lo", "mi", "te", "su", "ra", "ne", "po", "di", "ga", "bu", "fe"]
TARGET_SYLLABLES = ["ka", "lo", "mi", "te", "su", "ä", "ö", "ü", "ß", "ei", "ch", "sch"]


@functools.cache
def spm_models() -> tuple[bytes, bytes]:
    """(source.spm, target.spm): unigram models of 60 pieces with sentencepiece's default ids
    (<unk> 0, <s> 1, </s> 2), as Marian's releases ship them."""
    out = []
    for seed, syllables in ((1, SOURCE_SYLLABLES), (2, TARGET_SYLLABLES)):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(_corpus(seed, syllables)),
            model_writer=buf,
            vocab_size=60,
            model_type="unigram",
            character_coverage=1.0,
            minloglevel=2,
            num_threads=1,
        )
        out.append(buf.getvalue())
    return out[0], out[1]


def sample_texts(n: int, seed: int, side: str = "source") -> list[str]:
    """Sentences of the corpus the source (or target) model was trained on, drawn anew."""
    rng = random.Random(seed)
    corpus = _corpus(
        1 if side == "source" else 2, SOURCE_SYLLABLES if side == "source" else TARGET_SYLLABLES
    )
    return [" ".join(rng.choice(corpus).split()[: rng.randint(2, 6)]) for _ in range(n)]


def marian_vocabulary(eos_index: int = 0) -> list[str]:
    """The joint vocabulary of a release: </s>, <unk>, the source then target models' pieces,
    language tokens and the AWKWARD pieces; </s> moved to `eos_index`."""
    pieces = ["</s>", "<unk>"]
    for model in spm_models():
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces += [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not sp.is_control(i) and not sp.is_unknown(i)
        ]
    pieces = list(dict.fromkeys([*pieces, *LANGUAGE_TOKENS, *AWKWARD]))
    pieces.insert(eos_index, pieces.pop(0))
    return pieces


def separate_vocabularies() -> tuple[list[str], list[str]]:
    """A source and a target vocabulary of one size (as Marian's from two sentencepiece models
    of one size): </s>, <unk>, the side's model's pieces (the source's then the language tokens),
    the AWKWARD pieces, the shorter filled up with pieces of its own. A piece of both has two
    ids."""
    sides = []
    for model, extra in zip(spm_models(), (LANGUAGE_TOKENS, []), strict=True):
        sp = spm.SentencePieceProcessor(model_proto=model)
        own = [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not sp.is_control(i) and not sp.is_unknown(i)
        ]
        sides.append(list(dict.fromkeys(["</s>", "<unk>", *own, *extra, *AWKWARD])))
    n = max(map(len, sides))
    return sides[0] + [f"\u2581s{i}" for i in range(n - len(sides[0]))], sides[1] + [
        f"\u2581t{i}" for i in range(n - len(sides[1]))
    ]


# ------------------------------------------------------------------ YAML as yaml-cpp writes it


_PLAIN_START_BAD = set(",[]{}#&*!|>'\"%@`")
_NOT_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x84\x86-\x9f\ufeff\t\r\n]")


def _plain_ok(s: str) -> bool:
    """yaml-cpp's IsValidPlainScalar in block context (src/emitterutils.cpp): not empty nor a
    null word, no indicator first, no ': ' / ' #' / trailing ':' or ' ', nothing unprintable."""
    if not s or s in ("~", "null", "Null", "NULL") or s[0] in _PLAIN_START_BAD or s[0] == " ":
        return False
    if s[0] in "-?:" and (len(s) == 1 or s[1] == " "):
        return False
    if s.endswith((" ", ":")) or ": " in s or " #" in s:
        return False
    return not _NOT_PRINTABLE.search(s)


def _double_quoted(s: str) -> str:
    """yaml-cpp's WriteDoubleQuotedString: \\" \\\\ \\n \\t \\r \\b, \\xNN for other controls and
    for U+0080..U+00A0, \\ufeff; everything else as it is."""
    named = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b"}
    out = []
    for ch in s:
        o = ord(ch)
        if ch in named:
            out.append(named[ch])
        elif o < 0x20 or 0x80 <= o <= 0xA0:
            out.append(f"\\x{o:02x}")
        elif o == 0xFEFF:
            out.append("\\ufeff")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def yaml_cpp_key(s: str) -> str:
    return s if _plain_ok(s) else _double_quoted(s)


def write_vocab_yml(path: Path, pieces: Sequence[str], extra_styles: bool = False) -> None:
    """`piece: id` lines as Marian (yaml-cpp) writes them. With `extra_styles`, a few entries in
    the forms other writers use and YAML allows too: single quotes ('it''s'), a complex key
    (`? key` / `: id`)."""
    lines = []
    for i, p in enumerate(pieces):
        if extra_styles and i % 7 == 3 and "\n" not in p and _plain_ok(p):
            lines.append(f"'{p.replace(chr(39), chr(39) * 2)}': {i}")
        elif extra_styles and i % 7 == 5:
            lines += [f"? {yaml_cpp_key(p)}", f": {i}"]
        else:
            lines.append(f"{yaml_cpp_key(p)}: {i}")
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _yaml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return yaml_cpp_key(str(v))


def model_yml(options: dict[str, Any]) -> str:
    """Options as Marian writes them into special:model.yml (keys sorted, lists in block style)."""
    lines = []
    for key in sorted(options):
        value = options[key]
        if isinstance(value, list):
            lines.append(f"{key}:" + ("" if value else " []"))
            lines += [f"  - {_yaml_value(x)}" for x in value]
        else:
            lines.append(f"{key}: {_yaml_value(value)}")
    return "".join(line + "\n" for line in lines)


def npz_text(text: str) -> np.ndarray:
    """A YAML text as Marian stores it in a .npz: its bytes and a NUL, int8."""
    return np.frombuffer(text.encode("utf-8") + b"\0", dtype=np.int8)


# ------------------------------------------------------------------ the model


def marian_options(v: Variant, vocab_size: int) -> dict[str, Any]:
    """special:model.yml of an OPUS-MT-style transformer (the keys such a file holds)."""
    return {
        "type": "transformer",
        "version": v.version,
        "dim-vocabs": [vocab_size, vocab_size],
        "dim-emb": v.d_model,
        "enc-depth": v.layers[0],
        "dec-depth": v.layers[1],
        "transformer-heads": v.heads,
        "transformer-dim-ffn": v.ffn,
        "transformer-ffn-depth": 2,
        "transformer-decoder-dim-ffn": 0,
        "transformer-decoder-ffn-depth": 0,
        "transformer-ffn-activation": v.activation,
        "transformer-preprocess": "n" if v.pre_norm else "",
        "transformer-postprocess": "da" if v.pre_norm else "dan",
        "transformer-postprocess-top": "n" if v.pre_norm and v.top_norm else "",
        "transformer-postprocess-emb": "d",
        "transformer-decoder-autoreg": "self-attention",
        "transformer-no-projection": False,
        "transformer-train-position-embeddings": False,
        "transformer-tied-layers": [],
        "transformer-guided-alignment-layer": "last",
        "transformer-aan-activation": "swish",
        "transformer-aan-depth": 2,
        "transformer-aan-nogate": False,
        "transformer-dim-aan": 2048,
        "transformer-depth-scaling": False,
        "transformer-pool": False,
        "transformer-dropout": 0.1,
        "transformer-dropout-attention": 0,
        "transformer-dropout-ffn": 0,
        "tied-embeddings-all": v.tying == "all",
        "tied-embeddings": v.tying == "decoder",
        "tied-embeddings-src": v.tying == "src",
        "right-left": False,
        "lemma-dim-emb": 0,
        "skip": False,
        "layer-normalization": False,
        "input-types": [],
        "ulr": False,
        "ulr-dim-emb": 0,
        "enc-type": "bidirectional",
        "enc-cell": "gru",
        "dec-cell": "gru",
        "dim-rnn": 1024,
        "bert-train-type-embeddings": True,
        "bert-type-vocab-size": 2,
    }


def random_weights(v: Variant, vocab_size: int) -> dict[str, np.ndarray]:
    """Parameters under Marian's names and shapes; LayerNorm scales near 1, biases non-zero, an
    output bias that spreads the logits (no near-ties)."""
    rng = np.random.default_rng(v.seed)
    d, f = v.d_model, v.ffn
    w: dict[str, np.ndarray] = {}

    def mat(name: str, rows: int, cols: int, scale: float | None = None) -> None:
        w[name] = (rng.standard_normal((rows, cols)) * (scale or 1 / math.sqrt(rows))).astype(
            np.float32
        )

    def row(name: str, n: int, mean: float = 0.0, scale: float = 0.1) -> None:
        w[name] = (mean + rng.standard_normal((1, n)) * scale).astype(np.float32)

    def norm(prefix: str) -> None:
        tail = "_pre" if v.pre_norm else ""
        row(f"{prefix}_ln_scale{tail}", d, mean=1.0, scale=0.2)
        row(f"{prefix}_ln_bias{tail}", d)

    def attention(prefix: str) -> None:
        for m in "qkvo":
            mat(f"{prefix}_W{m}", d, d)
            row(f"{prefix}_b{m}", d)
        norm(f"{prefix}_Wo")

    def ffn(prefix: str) -> None:
        mat(f"{prefix}_ffn_W1", d, f)
        row(f"{prefix}_ffn_b1", f)
        mat(f"{prefix}_ffn_W2", f, d)
        row(f"{prefix}_ffn_b2", d)
        norm(f"{prefix}_ffn_ffn")

    if v.tying in ("all", "src"):
        mat("Wemb", vocab_size, d, scale=0.3)
    else:
        mat("encoder_Wemb", vocab_size, d, scale=0.3)
        mat("decoder_Wemb", vocab_size, d, scale=0.3)
    if v.tying in ("src", "none") and v.untied_name == "W":
        mat("decoder_ff_logit_out_W", d, vocab_size, scale=0.3)
    elif v.tying in ("src", "none"):
        mat("decoder_ff_logit_out_Wt", vocab_size, d, scale=0.3)
    row("decoder_ff_logit_out_b", vocab_size, scale=1.0)
    for i in range(1, v.layers[0] + 1):
        attention(f"encoder_l{i}_self")
        ffn(f"encoder_l{i}")
    for i in range(1, v.layers[1] + 1):
        attention(f"decoder_l{i}_self")
        attention(f"decoder_l{i}_context")
        ffn(f"decoder_l{i}")
    if v.pre_norm and v.top_norm:
        for side in ("encoder", "decoder"):
            row(f"{side}_top_ln_scale", d, mean=1.0, scale=0.2)
            row(f"{side}_top_ln_bias", d)
    return w


def write_release(folder: Path, v: Variant = Variant()) -> Release:
    """A Marian release of `v` in `folder` (created): model.npz, vocab.yml, source.spm,
    target.spm, decoder.yml."""
    folder.mkdir(parents=True, exist_ok=True)
    source, pieces = (
        separate_vocabularies() if v.separate else (None, marian_vocabulary(v.eos_index))
    )
    weights = random_weights(v, len(pieces))
    options = marian_options(v, len(pieces))
    np.savez(folder / "model.npz", **weights, **{"special:model.yml": npz_text(model_yml(options))})
    release = Release(
        folder, folder / "decoder.yml", folder / "model.npz", pieces, weights, options, source
    )
    for path, side in zip(release.vocab_files, (source or pieces, pieces), strict=True):
        write_vocab_yml(path, side)
    src, tgt = spm_models()
    (folder / "source.spm").write_bytes(src)
    (folder / "target.spm").write_bytes(tgt)
    (folder / "decoder.yml").write_text(
        "relative-paths: true\nmodels:\n  - model.npz\nvocabs:\n"
        + "".join(f"  - {path.name}\n" for path in release.vocab_files)
        + "beam-size: 4\nnormalize: 1\nword-penalty: 0\nmini-batch: 16\nmaxi-batch: "
        "100\nmaxi-batch-sort: "
        "src\n",
        encoding="utf-8",
    )
    return release


def rewrite_npz(
    release: Release,
    *,
    options: dict[str, Any] | None = None,
    drop: Sequence[str] = (),
    replace: dict[str, np.ndarray] | None = None,
    model_yml_text: str | None = None,
) -> None:
    """Write the release's model.npz again with some options, parameters or the options' text
    changed."""
    weights = {k: a for k, a in release.weights.items() if k not in drop} | (replace or {})
    text = (
        model_yml_text
        if model_yml_text is not None
        else model_yml(release.options | (options or {}))
    )
    np.savez(release.npz, **weights, **{"special:model.yml": npz_text(text)})


# ------------------------------------------------------------------ Marian's computation


def marian_sinusoids(length: int, dim: int) -> torch.Tensor:
    """SinusoidalPositionEmbeddings (src/tensors/cpu/tensor_operators.cpp), in float64."""
    half = dim / 2
    step = math.log(10000.0) / (half - 1.0)
    i = torch.arange(dim, dtype=torch.float64)
    v = torch.arange(length, dtype=torch.float64)[:, None] * torch.exp((i % int(half)) * -step)
    return torch.where(i < int(half), torch.sin(v), torch.cos(v))


def marian_activation(name: str, version: str) -> Any:
    """transformer-ffn-activation as that Marian version computes it: gelu was swish with beta
    1.702 up to v1.12.2 and x*Phi(x) from v1.12.3 on (marian-dev d225c24d bumped VERSION
    v1.12.2 -> v1.12.3 and changed src/graph/expression_operators.cpp's gelu)."""
    if name == "relu":
        return torch.relu
    if name == "swish":
        return lambda x: x * torch.sigmoid(x)
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version)
    assert name == "gelu" and m, (name, version)
    if tuple(map(int, m.groups())) <= (1, 12, 2):
        return lambda x: x * torch.sigmoid(1.702 * x)
    return lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def marian_log_probs(release: Release, src: Sequence[int], tgt: Sequence[int]) -> list[float]:
    """log p(tgt[t] | tgt[:t], src) for each t, as Marian computes it (float64); `src` and `tgt`
    are Marian ids, each ending with </s>."""
    table = marian_log_prob_table(release, src, tgt[:-1])
    return table.gather(1, torch.tensor(list(tgt))[:, None])[:, 0].tolist()


def marian_greedy(release: Release, src: Sequence[int], max_len: int, *, unk: int) -> list[int]:
    """Greedy search with Marian's computation: the likeliest token each step, never <unk>,
    </s> not first (as nmt decodes: allow_unk off, min_len 1); the tokens before </s>, at most
    `max_len`."""
    out: list[int] = []
    for _ in range(max_len):
        scores = marian_log_prob_table(release, src, out)[-1]
        scores[unk] = -math.inf
        if not out:
            scores[release.eos] = -math.inf
        best = int(torch.argmax(scores))
        if best == release.eos:
            break
        out.append(best)
    return out


def marian_log_prob_table(
    release: Release, src: Sequence[int], prev: Sequence[int]
) -> torch.Tensor:
    """(len(prev) + 1, V) float64: the log-probabilities of each next target token after a zero
    vector and then the tokens `prev`, for the source `src` (Marian ids, ending with </s>)."""
    o, w = release.options, {k: torch.from_numpy(a).double() for k, a in release.weights.items()}
    d, heads = int(o["dim-emb"]), int(o["transformer-heads"])
    pre, top = o["transformer-preprocess"] == "n", o["transformer-postprocess-top"] == "n"
    act = marian_activation(o["transformer-ffn-activation"], str(o["version"]))

    def vec(name: str) -> torch.Tensor:
        return w[name].reshape(-1)

    def layer_norm(x: torch.Tensor, prefix: str, suffix: str = "") -> torch.Tensor:
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-6) * vec(f"{prefix}_ln_scale{suffix}") + vec(
            f"{prefix}_ln_bias{suffix}"
        )

    def sublayer(
        prefix: str, x: torch.Tensor, fn: Any
    ) -> torch.Tensor:  # pre: n ... da; post: ... dan
        if pre:
            return fn(layer_norm(x, prefix, "_pre")) + x
        return layer_norm(fn(x) + x, prefix)

    def attention(prefix: str, q_in: torch.Tensor, kv: torch.Tensor, causal: bool) -> torch.Tensor:
        def split(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0], heads, d // heads).transpose(0, 1)

        q = split(q_in @ w[f"{prefix}_Wq"] + vec(f"{prefix}_bq"))
        k = split(kv @ w[f"{prefix}_Wk"] + vec(f"{prefix}_bk"))
        v = split(kv @ w[f"{prefix}_Wv"] + vec(f"{prefix}_bv"))
        z = q @ k.transpose(1, 2) / math.sqrt(d // heads)
        if causal:
            z = z.masked_fill(torch.ones_like(z, dtype=torch.bool).triu(1), -math.inf)
        out = (torch.softmax(z, -1) @ v).transpose(0, 1).reshape(q_in.shape[0], d)
        return out @ w[f"{prefix}_Wo"] + vec(f"{prefix}_bo")

    def ffn(prefix: str, x: torch.Tensor) -> torch.Tensor:
        return act(x @ w[f"{prefix}_W1"] + vec(f"{prefix}_b1")) @ w[f"{prefix}_W2"] + vec(
            f"{prefix}_b2"
        )

    def embedding(side: str) -> torch.Tensor:
        return w["Wemb"] if "Wemb" in w else w[f"{side}_Wemb"]

    x = embedding("encoder")[list(src)] * math.sqrt(d) + marian_sinusoids(len(src), d)
    for i in range(1, int(o["enc-depth"]) + 1):
        p = f"encoder_l{i}"
        x = sublayer(f"{p}_self_Wo", x, lambda h, p=p: attention(f"{p}_self", h, h, causal=False))
        x = sublayer(f"{p}_ffn_ffn", x, lambda h, p=p: ffn(f"{p}_ffn", h))
    if top:
        x = layer_norm(x, "encoder_top")
    y = torch.cat([torch.zeros(1, d, dtype=torch.float64), embedding("decoder")[list(prev)]])
    y = y * math.sqrt(d) + marian_sinusoids(len(prev) + 1, d)
    for i in range(1, int(o["dec-depth"]) + 1):
        p = f"decoder_l{i}"
        y = sublayer(f"{p}_self_Wo", y, lambda h, p=p: attention(f"{p}_self", h, h, causal=True))
        y = sublayer(
            f"{p}_context_Wo", y, lambda h, p=p: attention(f"{p}_context", h, x, causal=False)
        )
        y = sublayer(f"{p}_ffn_ffn", y, lambda h, p=p: ffn(f"{p}_ffn", h))
    if top:
        y = layer_norm(y, "decoder_top")
    if "decoder_ff_logit_out_W" in w:
        out = w["decoder_ff_logit_out_W"]
    elif "decoder_ff_logit_out_Wt" in w:
        out = w["decoder_ff_logit_out_Wt"].T
    else:
        out = embedding("decoder").T
    return torch.log_softmax(y @ out + vec("decoder_ff_logit_out_b"), -1)


# ------------------------------------------------------------------ a trained model


def to_marian_layout(
    state: dict[str, torch.Tensor], cfg: ModelConfig, like: Release
) -> dict[str, np.ndarray]:
    """An nmt state dict of an imported `like` (trained further, `cfg` its model config) ->
    parameters under `like`'s Marian names and shapes: the weight table's MARIAN layout written
    (pad row dropped, matrices (in, out), fused q/k/v split), vectors (1, n) as Marian stores
    them."""
    out = write(MARIAN, cfg, {k: t.detach().float() for k, t in state.items()})
    missing = set(like.weights) - set(out)
    assert not missing, sorted(missing)
    return {
        k: (out[k][None] if out[k].dim() == 1 else out[k]).contiguous().numpy()
        for k in like.weights
    }


def train_to_end(release: Release, updates: int = 150, seed: int = 0) -> None:
    """Train the release's model (imported into nmt, with positions hf_marian: the table of
    CTranslate2's conversion) `updates` Adam steps to reverse its source pieces, and write the
    weights back into its model.npz. A random model repeats a token until the length limit;
    this one ends its outputs with </s> at lengths its input decides, as a trained model does."""
    from nmt.convert.marian import import_model
    from nmt.models.transformer import Transformer

    imported = import_model(release.decoder_yml)
    tok = imported.tokenizer
    cfg = dataclasses.replace(imported.model, positions="hf_marian", dropout=0.0)
    torch.manual_seed(seed)
    model = Transformer(cfg, tok.vocab_size, tok.specials.pad)
    model.load_state_dict(imported.weights)
    model.train()
    pad, eos, bos = tok.specials.pad, tok.specials.eos, tok.specials.bos
    pairs = [(ids, ids[::-1]) for ids in map(tok.encode, sample_texts(256, seed + 100))]
    rng = random.Random(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def rows(seqs: list[list[int]]) -> torch.Tensor:
        n = max(map(len, seqs)) + 1
        return torch.tensor([[*s, eos] + [pad] * (n - len(s) - 1) for s in seqs])

    for _ in range(updates):
        batch = rng.sample(pairs, 32)
        src, tgt = rows([s for s, _ in batch]), rows([t for _, t in batch])
        prev = torch.cat([torch.full((len(batch), 1), bos), tgt[:, :-1]], 1)
        loss = torch.nn.functional.cross_entropy(
            model(src, prev).flatten(0, 1), tgt.flatten(), ignore_index=pad
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    release.weights = to_marian_layout(model.state_dict(), cfg, release)
    rewrite_npz(release)
