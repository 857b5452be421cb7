"""Typed configuration: YAML files and `--set` overrides -> frozen dataclasses.

Every key, its type, default and help text live here and nowhere else. Loading checks
each key against the dataclass fields (unknown keys are errors with a close-match
suggestion), each value against the field type, and each section's invariants.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from nmt.atomic import read_regular
from nmt.device import DEVICES, is_device_name
from nmt.errors import ConfigError, NmtError
from nmt.fields import check_bounds, opt
from nmt.fields import coerce as _coerce


@dataclass(frozen=True)
class DataConfig:
    dir: str = opt("data-bin/m30k", "Directory written by `nmt prepare-bpe`.")
    source_lang: str = opt("", "Source language suffix; empty = the one in prepare.json.")
    target_lang: str = opt("", "Target language suffix; empty = the one in prepare.json.")
    train_split: str = opt("train", "Split used for training.")
    valid_split: str = opt("valid", "Split used for validation loss and BLEU.")


@dataclass(frozen=True)
class ModelConfig:
    arch: Literal["transformer", "rnn"] = opt(
        "transformer",
        "transformer (Vaswani et al. 2017) or rnn: a bidirectional RNN encoder and an attentional "
        "RNN decoder (Bahdanau et al. 2015); the rnn_* and cell/attention keys below apply to rnn "
        "only, the Transformer "
        "keys (layers, heads, ffn_dim, norm_first, positions) to transformer only.",
    )
    cell: Literal["gru", "lstm"] = opt("gru", "rnn: the recurrent cell of encoder and decoder.")
    attention: Literal["bahdanau", "none"] = opt(
        "bahdanau",
        "rnn: bahdanau = additive attention over the encoder states at every target step; none = "
        "the "
        "decoder sees one fixed summary vector of the source (the bottleneck attention lifted).",
    )
    rnn_hidden: int = opt(
        512,
        "rnn: hidden size of each encoder direction and of the decoder; also "
        "the attention's inner size. d_model is the embedding and readout size.",
        at_least=1,
    )
    rnn_layers: int = opt(
        1, "rnn: stacked bidirectional encoder layers (the decoder has one).", at_least=1
    )
    encoder_layers: int = opt(6, "Number of encoder layers.", at_least=1)
    decoder_layers: int = opt(6, "Number of decoder layers.", at_least=1)
    d_model: int = opt(512, "Model (embedding) dimension.", at_least=1)
    ffn_dim: int = opt(
        2048, "Inner dimension of the position-wise feed-forward layers.", at_least=1
    )
    heads: int = opt(8, "Attention heads; must divide d_model.", at_least=1)
    dropout: float = opt(
        0.1, "Dropout on sub-layer outputs and on embeddings+positions.", at_least=0, below=1
    )
    attention_dropout: float = opt(0.0, "Dropout on attention weights.", at_least=0, below=1)
    activation_dropout: float = opt(
        0.0, "Dropout after the feed-forward ReLU.", at_least=0, below=1
    )
    norm_first: bool = opt(False, "Pre-norm (true) instead of the paper's post-norm (false).")
    final_norm: bool = opt(
        True,
        "Pre-norm: a LayerNorm after the last layer of each side (Marian's "
        "transformer-postprocess-top n); false: none, as Marian trains with top empty.",
    )
    share_embeddings: bool = opt(
        True,
        "Tie the source and target embeddings (joint vocabulary); with tie_output (the default) "
        "the output projection too, three-way (Marian's tied-embeddings-all).",
    )
    tie_output: bool = opt(
        True,
        "transformer: the output projection is the target embedding (Marian's tied-embeddings, "
        "fairseq's share_decoder_input_output_embed); false = its own (V, d_model) matrix "
        "(Marian's decoder_ff_logit_out_W).",
    )
    output_bias: bool = opt(
        False,
        "transformer: a learned bias on the output projection (Marian's "
        "decoder_ff_logit_out_b, Hugging Face's final_logits_bias).",
    )
    activation: Literal["relu", "gelu", "gelu_tanh", "gelu_sigmoid", "swish"] = opt(
        "relu",
        "transformer: the feed-forward activation. gelu = x*Phi(x) with the exact erf (Hugging "
        "Face's activation_function gelu; also current Marian's gelu); gelu_tanh = the tanh "
        "approximation (Hugging Face's gelu_new); gelu_sigmoid = x*sigmoid(1.702x), what Marian's "
        "transformer-ffn-activation gelu computed until March 2023 (marian-dev d225c24d; "
        "CTranslate2's Marian converter maps it so); swish = x*sigmoid(x) (SiLU; Marian's and "
        "Hugging Face's swish).",
    )
    norm_eps: float = opt(
        1e-5,
        "transformer: the LayerNorms' epsilon (PyTorch's and Hugging Face MarianMT's 1e-5; "
        "Marian's Transformer uses 1e-6).",
        above=0,
    )
    learned_positions: bool = opt(False, "Learned position embeddings instead of sinusoids.")
    positions: Literal["nmt", "marian", "hf_marian"] = opt(
        "nmt",
        "transformer: the sinusoid table (positions count from 0, added to the token embedding "
        "scaled by sqrt(d_model), in all three). nmt and marian: sin in the first half of the "
        "columns, cos in the second, frequency 10000^(-i/(d/2-1)) for column i of a half "
        "(tensor2tensor; Marian's SinusoidalPositionEmbeddings; the two equal for an even "
        "d_model). hf_marian: the table Hugging Face's MarianMT runs (and CTranslate2's Marian "
        "converter writes): the same halves, frequency 10000^(-2i/d), so it differs from Marian's "
        "own; a model fine-tuned there expects it. Not with learned_positions.",
    )
    decoder_start: Literal["bos", "zeros"] = opt(
        "bos",
        "transformer: the decoder's first input. bos = the embedding of the start token the "
        "search feeds; zeros = a zero vector (plus the position) whatever that token is, as "
        "Marian starts (Hugging Face MarianMT feeds pad, whose embedding row is zero).",
    )
    max_positions: int = opt(
        1024, "Longest source or target sequence the model accepts.", at_least=1
    )


# Model keys that shape training, not the network (no weight depends on them): a run started
# from a checkpoint's weights (train.init_from) may set them otherwise.
TRAINING_ONLY_MODEL_KEYS = ("dropout", "attention_dropout", "activation_dropout")

# the Transformer's options that the rnn would silently ignore: refused with arch rnn unless at
# their defaults
TRANSFORMER_ONLY = (
    "tie_output",
    "output_bias",
    "activation",
    "norm_eps",
    "positions",
    "decoder_start",
)


@dataclass(frozen=True)
class TrainConfig:
    max_tokens: int = opt(4096, "Padded source+target tokens per batch (per GPU).", at_least=1)
    update_freq: int = opt(1, "Gradient accumulation: batches per update.", at_least=1)
    lr: float = opt(
        7e-4,
        "Peak learning rate (inverse_sqrt) or the scale factor of the paper's formula (noam).",
        above=0,
    )
    lr_schedule: Literal["inverse_sqrt", "noam"] = opt(
        "inverse_sqrt",
        "inverse_sqrt: linear warm-up to lr then lr*sqrt(warmup/step) (fairseq); "
        "noam: lr * d_model^-0.5 * min(step^-0.5, step*warmup^-1.5) (Vaswani et al.).",
    )
    warmup_updates: int = opt(4000, "Linear warm-up length in updates.", at_least=0)
    warmup_init_lr: float = opt(1e-7, "Learning rate at update 0 (inverse_sqrt).", at_least=0)
    adam_beta1: float = opt(0.9, "Adam beta1.", at_least=0, below=1)
    adam_beta2: float = opt(0.98, "Adam beta2.", at_least=0, below=1)
    adam_eps: float = opt(1e-9, "Adam epsilon.", above=0)
    weight_decay: float = opt(0.0, "Decoupled weight decay (AdamW); 0 = plain Adam.", at_least=0)
    label_smoothing: float = opt(0.1, "Label smoothing epsilon.", at_least=0, below=1)
    dropout_ramp_end: int = opt(
        0,
        "Curriculum dropout: model.dropout until update dropout_ramp_start, then rising linearly "
        "to dropout_ramp_to at this update and staying there; 0 = model.dropout "
        "throughout. Applies to the sub-layer output and embedding dropout.",
    )
    dropout_ramp_start: int = opt(0, "See dropout_ramp_end.", at_least=0)
    dropout_ramp_to: float = opt(0.0, "See dropout_ramp_end.", at_least=0, below=1)
    clip_norm: float = opt(0.0, "Clip gradients to this global norm; 0 = no clipping.", at_least=0)
    max_updates: int = opt(0, "Stop after this many updates; 0 = no limit.", at_least=0)
    max_epochs: int = opt(0, "Stop after this many epochs; 0 = no limit.", at_least=0)
    max_time: float = opt(
        0.0, "Stop after this many seconds of training; 0 = no limit.", at_least=0
    )
    save_interval_updates: int = opt(
        0, "Write checkpoint_<update>.pt every N updates; 0 = at epoch ends only.", at_least=0
    )
    keep_last: int = opt(
        5, "Keep this many checkpoint_<update>.pt files; 0 = keep all.", at_least=0
    )
    validate_interval_updates: int = opt(
        0, "Validate every N updates; 0 = at epoch ends only.", at_least=0
    )
    patience: int = opt(0, "Stop after N validations without improvement; 0 = never.", at_least=0)
    best_metric: Literal["bleu", "loss"] = opt("bleu", "Metric that picks checkpoint_best.pt.")
    valid_bleu: bool = opt(True, "Decode the valid set and compute BLEU at each validation.")
    valid_beam: int = opt(1, "Beam size for validation BLEU (1 = greedy).", at_least=1)
    seed: int = opt(1, "Random seed (parameters, dropout, batch order).", at_least=0, below=2**62)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = opt(
        "fp32",
        "Autocast precision; auto = bf16 where the device computes it natively (CUDA with bf16, a "
        "CPU with AVX512-BF16 or AMX), else fp32; fp16 is CUDA only and uses dynamic loss scaling.",
    )
    fp16_init_scale: float = opt(128.0, "Initial loss scale for fp16.", above=0)
    fp16_min_scale: float = opt(
        1e-4, "Stop with an error when the fp16 loss scale falls below.", above=0
    )
    run_dir: str = opt("runs/default", "Run directory: config, checkpoints, logs, metrics.")
    init_from: str = opt(
        "",
        "Fine-tuning: a new run starts from the model weights of this nmt checkpoint, with a "
        "fresh optimizer, lr schedule, update counter and data position; empty = random weights. "
        "Its model config must equal this one except "
        f"{', '.join(f'model.{k}' for k in TRAINING_ONLY_MODEL_KEYS)} (they shape training, not "
        "the network), and its tokenizer must be data.dir's spm.model (prepare the data with `nmt "
        "prepare-bpe --tokenizer-from CHECKPOINT`). "
        "Ignored once the run directory has checkpoints: the run resumes from them.",
    )
    log_interval: int = opt(
        50,
        "Log training metrics every N updates: loss and nll per target token over those N "
        "updates, their mean gnorm.",
        at_least=1,
    )
    threads: int = opt(0, "CPU threads for torch; 0 = torch's default.", at_least=0, at_most=4096)
    device: str = opt("auto", "auto (CUDA when present), cpu, cuda or cuda:N.")
    pad_to_multiple: int = opt(
        0,
        "Pad each batch's source and target lengths to a multiple of this, so that kernels and "
        "torch.compile see few distinct shapes (the batch's token budget counts the "
        "padding); 0 = 8 on CUDA, 1 (no padding) on the CPU.",
        at_least=0,
    )
    compile: bool = opt(
        False,
        "Compile the model with torch.compile (needs a C++ compiler on the CPU; the "
        "loss runs eagerly; the first updates of the first few shapes are slow).",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = opt(
        "default", "torch.compile mode; reduce-overhead records CUDA graphs (one per batch shape)."
    )
    tensorboard: bool = opt(
        False,
        "Also write the metrics.jsonl records as TensorBoard scalars to "
        "RUN_DIR/tensorboard (needs the tensorboard package).",
    )


@dataclass(frozen=True)
class DecodeConfig:
    beam: int = opt(5, "Beam size.", at_least=1)
    lenpen: float = opt(
        1.0,
        "Length penalty exponent alpha (see lenpen_style); a larger alpha favours longer outputs.",
    )
    lenpen_style: Literal["gnmt", "length", "none"] = opt(
        "length",
        "Score normalisation: gnmt divides log-prob by ((5+|Y|)/6)^alpha, length by "
        "|Y|^alpha (fairseq/Marian), none leaves it unnormalised.",
    )
    max_len_a: float = opt(
        1.2, "Maximum output length is max_len_a * source_len + max_len_b.", at_least=0
    )
    max_len_b: int = opt(10, "See max_len_a.", at_least=0)
    min_len: int = opt(1, "EOS is blocked until the hypothesis has this many tokens.", at_least=0)
    no_repeat_ngram_size: int = opt(
        0, "Forbid repeating n-grams of this size; 0 = off.", at_least=0
    )
    allow_unk: bool = opt(False, "Allow the search to produce <unk>.", cli=False)
    sampling: bool = opt(
        False,
        "Sample each output token from the model's distribution instead of beam search (for "
        "back-translation and generation); see topk, topp, temperature, seed.",
    )
    topk: int = opt(
        0, "Sampling: draw from the k likeliest tokens only; 0 = all. 1 = greedy.", at_least=0
    )
    topp: float = opt(
        1.0,
        "Sampling: draw from the smallest set of likeliest tokens whose "
        "probability reaches p (nucleus sampling, Holtzman et al. 2020); 1 = all.",
        above=0,
        at_most=1,
    )
    temperature: float = opt(
        1.0,
        "Sampling: divide the log-probabilities by this before sampling (<1 sharper, >1 flatter); "
        "any positive number: towards 0 it is greedy "
        "search, a huge one draws every allowed token alike.",
        above=0,
    )
    seed: int = opt(
        1,
        "Sampling: input sentence i draws from a generator seeded by (seed, i), so "
        "a seed repeats its outputs whatever the batching.",
        at_least=0,
        below=2**62,
    )
    batch_size: int = opt(128, "Sentences per translation batch.", at_least=1)
    max_tokens: int = opt(0, "Source tokens per translation batch; 0 = use batch_size.", at_least=0)


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


SECTIONS: dict[str, type] = typing.get_type_hints(
    Config
)  # {"data": DataConfig, "model": ModelConfig, ...}


# ---------------------------------------------------------------- loading


def _unknown(key: str, where: str) -> ConfigError:
    """An unknown key, with the closest known one: within its section where the section is
    known (`train.foo` is not a misspelt `train`), else among all keys and sections."""
    section, _, name = key.partition(".")
    if section in SECTIONS and name:
        names = [f.name for f in fields(SECTIONS[section])]
        close = [f"{section}.{c}" for c in difflib.get_close_matches(name, names, n=1, cutoff=0.6)]
    else:
        keys = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)] + list(
            SECTIONS
        )
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"{where}: unknown key {key}{hint}")


def _build_section(name: str, raw: dict[str, Any], where: dict[str, str]) -> Any:
    cls = SECTIONS[name]
    types_ = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        path = f"{name}.{key}"
        source = where.get(path, where["_file"])
        if key not in types_:
            raise _unknown(path, source)
        kwargs[key] = _coerce(value, types_[key], path, source)
    return cls(**kwargs)


def _override_value(section: str, name: str, text: str) -> Any:
    """The value of `--set section.name=text`: a string key (a path, a language, a device) takes
    the text as written (`runs/exp #2`, `2024`, `no`); any other is read as YAML (`7e-4`,
    `true`)."""
    tp = typing.get_type_hints(SECTIONS[section]).get(name)
    if tp is str or (get_origin(tp) is Literal and all(isinstance(c, str) for c in get_args(tp))):
        return text
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    except RecursionError:  # PyYAML recurses once per level: `[[[...]]]` 5,000 deep
        raise ConfigError(f"--set {section}.{name}: the value is nested too deep") from None


class _UniqueKeys(yaml.SafeLoader):
    """yaml.safe_load refusing a key written twice in one mapping (PyYAML keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key.value} given twice", key.start_mark
                    )
                seen.add(key.value)
        return super().construct_mapping(node, deep)


CONFIG_LIMIT = (
    1 << 24
)  # bytes: a config is a few kilobytes; more is a wrong file, refused before it is parsed


def _read_yaml(path: Path) -> dict[str, Any]:
    """The mapping of a config file, read whole under nmt's one rule for such files
    (`nmt.atomic.read_regular`: a FIFO or a link to /dev/zero is refused, never waited on or
    read until memory runs out)."""
    try:
        text = read_regular(path, "the config", CONFIG_LIMIT).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read config ({e})") from None
    except NmtError as e:
        raise ConfigError(str(e)) from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        loc = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{loc}: malformed YAML: {problem}") from None
    except RecursionError:  # PyYAML recurses once per level: `[[[...]]]` 5,000 deep
        raise ConfigError(f"{path}: malformed YAML: nested too deep") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (data, model, train, decode)")
    return raw


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    options: dict[str, tuple[str, Any]] | None = None,
) -> Config:
    """Read a YAML config (or start from defaults), apply `--set` overrides, then `options`
    ({"train.run_dir": ("--run-dir", "runs/x")}: errors name the option), validate."""
    raw: dict[str, Any] = {}
    where: dict[str, str] = {"_file": str(path) if path else "defaults"}
    if path is not None:
        raw = _read_yaml(Path(path))
        for section, body in raw.items():
            if section not in SECTIONS:
                raise _unknown(str(section), str(path))
            if body is None:
                raw[section] = {}
            elif not isinstance(body, dict):
                raise ConfigError(f"{path}: section {section} must be a mapping of keys")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set train.lr=7e-4")
        written_key, text = item.split("=", 1)
        key = written_key.strip()
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise _unknown(key, "--set")
        raw.setdefault(section, {})[name] = _override_value(section, name, text)
        where[key] = "--set"
    for key, (option, value) in (options or {}).items():
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = value
        where[key] = option
    cfg = Config(**{name: _build_section(name, raw.get(name, {}), where) for name in SECTIONS})
    validate(cfg, where)
    return cfg


def config_from_dict(raw: dict[str, Any], where: str = "checkpoint") -> Config:
    """Rebuild a Config saved with `config_to_dict` (e.g. from a checkpoint), `validate`d."""
    w = {"_file": where}
    for section in raw:
        if section not in SECTIONS:
            raise _unknown(section, where)
    cfg = Config(**{name: _build_section(name, raw.get(name, {}), w) for name in SECTIONS})
    validate(cfg, w, decode=False)  # a stored decode setting may be overridden where it is used
    return cfg


def changed_keys(old: Config, new: Config, section: str) -> list[tuple[str, Any, Any]]:
    """(`section.key`, old value, new value) of each key of `section` that differs, in field
    order."""
    a = dataclasses.asdict(getattr(old, section))
    b = dataclasses.asdict(getattr(new, section))
    return [(f"{section}.{key}", a[key], value) for key, value in b.items() if a[key] != value]


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


# ---------------------------------------------------------------- validation


def validate(cfg: Config, where: dict[str, str] | None = None, decode: bool = True) -> None:
    """Reject impossible values, naming the key: each field's declared bounds (`opt(at_least=...)`,
    checked by nmt.fields.check_bounds), then the rules between fields; the decode section's
    with `decode`."""
    where = where or {"_file": "config"}

    def named(section: str) -> Callable[[str], str]:
        return lambda key: f"{where.get(f'{section}.{key}', where['_file'])}: {section}.{key}"

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            section, _, name = key.partition(".")
            raise ConfigError(f"{named(section)(name)} {msg}")

    for section in ("data", "model", "train"):
        check_bounds(getattr(cfg, section), named(section))
    m = cfg.model
    t = cfg.train
    need(
        m.d_model % m.heads == 0,
        "model.heads",
        f"({m.heads}) must divide model.d_model ({m.d_model})",
    )
    for key in TRANSFORMER_ONLY:
        need(
            m.arch == "transformer" or getattr(m, key) == getattr(ModelConfig, key),
            f"model.{key}",
            "applies to model.arch transformer only",
        )
    need(
        not (m.learned_positions and m.positions != "nmt"),
        "model.positions",
        f"{m.positions} is a sinusoid table; it cannot go with model.learned_positions",
    )
    need(
        t.pad_to_multiple <= m.max_positions,
        "train.pad_to_multiple",
        f"({t.pad_to_multiple}) must not exceed model.max_positions ({m.max_positions})",
    )
    need(
        t.lr_schedule != "noam" or t.warmup_updates > 0,
        "train.warmup_updates",
        "must be positive with lr_schedule noam",
    )
    need(
        t.dropout_ramp_end == 0 or t.dropout_ramp_end > t.dropout_ramp_start,
        "train.dropout_ramp_end",
        f"({t.dropout_ramp_end}) must be 0 or above train.dropout_ramp_start "
        f"({t.dropout_ramp_start})",
    )
    need(is_device_name(t.device), "train.device", f"must be {DEVICES}")
    need(bool(t.run_dir), "train.run_dir", "must not be empty")
    need(bool(cfg.data.dir), "data.dir", "must not be empty")
    if decode:
        check_decode(cfg.decode, named("decode"))


def check_decode(
    d: DecodeConfig, name: Callable[[str], str], vocab_size: int | None = None
) -> None:
    """The bounds of the decode settings, in one place for a config file, a checkpoint and the
    options of `nmt translate`; `name(key)` says where a value came from ("--beam",
    "cfg.yaml: decode.beam", ...). With `vocab_size` (a model is loaded), also the bounds
    that depend on it."""
    check_bounds(d, name)
    if vocab_size is not None:
        check_beam_fits(d.beam, vocab_size, name("beam"))
    if d.max_len_b < 1 and d.max_len_a == 0:
        raise ConfigError(f"{name('max_len_b')} must allow at least one token, got {d.max_len_b!r}")


def check_beam_fits(beam: int, vocab_size: int, name: str) -> None:
    """A beam smaller than the vocabulary: step 0 takes the whole beam from one row's
    candidates (nmt.decoding.search). `name` names the setting ("--beam", "train.valid_beam")."""
    if beam >= vocab_size:
        raise ConfigError(
            f"{name} must be smaller than the vocabulary ({vocab_size}), got {beam!r}"
        )


def check_nbest(nbest: int, d: DecodeConfig, name: str) -> None:
    """An n-best list of 1 .. beam hypotheses, and of one when sampling. `name` names the
    option ("--nbest", "nbest=", "nbest")."""
    if not 1 <= nbest <= d.beam:
        raise ConfigError(f"{name} must be between 1 and the beam size ({d.beam}), got {nbest}")
    if d.sampling and nbest > 1:
        raise ConfigError(f"{name} {nbest} needs beam search: sampling gives one output per input")
