"""Config loading: key paths in errors, suggestions, type checks, overrides, invariants; the
bounds that fields declare (config keys and commands' options), each enforced."""

import dataclasses
import importlib.util
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from nmt import fields, options
from nmt.api import Translator
from nmt.checkpoint import average_command
from nmt.config import (
    SECTIONS,
    Config,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
)
from nmt.decoding.shortlist import learn_shortlist
from nmt.errors import ConfigError, NmtError
from nmt.fields import Bounds, check_bounds
from nmt.plot import plot_attention
from nmt.prepare import prepare_bpe
from nmt.serve.server import serve

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts/update_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


help_table = _load_generator().help_table


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["base", "big", "multi30k", "tiny"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert isinstance(cfg, Config)


def test_base_and_big_are_the_papers_models():
    base, big = load_config(ROOT / "configs/base.yaml"), load_config(ROOT / "configs/big.yaml")
    assert (base.model.d_model, base.model.ffn_dim, base.model.heads, base.model.dropout) == (
        512,
        2048,
        8,
        0.1,
    )
    assert (big.model.d_model, big.model.ffn_dim, big.model.heads, big.model.dropout) == (
        1024,
        4096,
        16,
        0.3,
    )
    for cfg in (base, big):
        assert cfg.model.encoder_layers == cfg.model.decoder_layers == 6
        assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup_updates == 4000
        # ~25k source + ~25k target tokens per update (max_tokens counts both sides)
        assert cfg.train.max_tokens * cfg.train.update_freq == 50_000


@pytest.mark.parametrize(
    "text, key",
    [
        pytest.param(
            "model:\n  d_modle: 256\n",
            "unknown key model.d_modle (did you mean model.d_model?)",
            id="unknown-nested-key",
        ),
        pytest.param(
            "trian:\n  lr: 1\n", "unknown key trian (did you mean train?)", id="unknown-section"
        ),
        pytest.param("model:\n  d_model: big\n", "model.d_model must be an integer", id="integer"),
        pytest.param(
            "model:\n  norm_first: 1\n", "model.norm_first must be true or false", id="bool"
        ),
        pytest.param("train:\n  lr: fast\n", "train.lr must be a number", id="number"),
        pytest.param("train:\n  precision: fp8\n", "train.precision must be one of", id="choice"),
        pytest.param(
            "model:\n  heads: 3\n", "model.heads (3) must divide model.d_model (512)", id="heads"
        ),
        pytest.param("decode:\n  beam: 0\n", "decode.beam must be at least 1", id="at-least"),
        pytest.param(
            "train:\n  warmup_updates: -5\n",
            "train.warmup_updates must not be negative",
            id="negative",
        ),
        pytest.param("model:\n  dropout: 1.5\n", "model.dropout must be in [0, 1)", id="range"),
        pytest.param(
            "train:\n  dropout_ramp_start: 50\n  dropout_ramp_end: 50\n",
            "train.dropout_ramp_end (50) must be 0 or above train.dropout_ramp_start (50)",
            id="ramp-end",
        ),
        pytest.param(
            "train:\n  dropout_ramp_end: 50\n  dropout_ramp_to: 1.0\n",
            "train.dropout_ramp_to must be in [0, 1)",
            id="ramp-to",
        ),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, key):
    """An unknown key (with a suggestion) or a bad value: one message starting with the file,
    naming the key."""
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: ") and key in str(e.value), e.value


def test_malformed_yaml_gives_file_line_col(tmp_path):
    p = write(tmp_path, "model:\n  d_model: 256\n  heads: [4\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}:4:") or str(e.value).startswith(f"{p}:3:")
    assert "malformed YAML" in str(e.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config("nope.yaml")


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    # YAML 1.1 reads 5e-4 as a string; a float field accepts it.
    assert load_config(write(tmp_path, "train:\n  lr: 5e-4\n")).train.lr == 5e-4


def test_overrides_are_typed_and_checked(tmp_path):
    cfg = load_config(
        ROOT / "configs/tiny.yaml", ["train.lr=7e-4", "model.dropout=0.3", "model.norm_first=true"]
    )
    assert cfg.train.lr == 7e-4 and cfg.model.dropout == 0.3 and cfg.model.norm_first is True
    with pytest.raises(ConfigError, match="--set: model.d_model must be an integer"):
        load_config(ROOT / "configs/tiny.yaml", ["model.d_model=2.5"])
    with pytest.raises(ConfigError, match="did you mean train.lr"):
        load_config(ROOT / "configs/tiny.yaml", ["train.lrr=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(ROOT / "configs/tiny.yaml", ["train.lr"])


def test_override_beats_file_and_int_is_accepted_for_float(tmp_path):
    p = write(tmp_path, "train:\n  lr: 0.1\n")
    assert load_config(p, ["train.lr=1"]).train.lr == 1.0


def test_round_trip_through_dict_and_dump():
    cfg = load_config(ROOT / "configs/multi30k.yaml")
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert "d_model: 256" in dump_config(cfg)


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(AttributeError):
        cfg.model.d_model = 3  # type: ignore[misc]


def test_help_table_lists_every_required_key():
    table = help_table()
    for key in [
        "data.dir",
        "model.encoder_layers",
        "model.decoder_layers",
        "model.d_model",
        "model.ffn_dim",
        "model.heads",
        "model.dropout",
        "model.attention_dropout",
        "model.norm_first",
        "model.share_embeddings",
        "train.max_tokens",
        "train.update_freq",
        "train.lr",
        "train.warmup_updates",
        "train.label_smoothing",
        "train.clip_norm",
        "train.max_updates",
        "train.max_epochs",
        "train.max_time",
        "train.save_interval_updates",
        "train.keep_last",
        "train.validate_interval_updates",
        "train.patience",
        "train.seed",
        "train.precision",
        "train.run_dir",
        "decode.beam",
        "decode.lenpen",
        "decode.max_len_a",
        "decode.max_len_b",
    ]:
        assert f"`{key}`" in table


# ------------------------------------------------------------------ declared bounds

#: a valid instance of each options dataclass that declares bounds
VALID_OPTIONS: dict[type, dict[str, Any]] = {
    options.DistillOptions: dict(
        source_lang="en",
        target_lang="de",
        trainpref="train",
        out=Path("out"),
        teachers=[Path("teacher.pt")],
    ),
    options.PrepareOptions: dict(
        source_lang="en", target_lang="de", trainpref="train", destdir="out", separate_vocab=True
    ),  # which --target-vocab-size needs
    options.AverageOptions: dict(inputs=[Path("run")], output=Path("avg.pt")),
    options.ShortlistOptions: dict(data_dir=Path("data"), output=Path("shortlist.pt")),
    options.PlotAttentionOptions: dict(attention=Path("attention.npz"), out_dir=Path("maps")),
    options.ServeOptions: dict(checkpoints=[Path("a.pt")]),
    options.TranslateOptions: dict(checkpoints=[Path("a.pt")]),
}
# : the library call that each command makes with its options, which checks them before it reads a
# file
ENFORCED_BY: dict[type, Callable[[Any], object]] = {
    options.DistillOptions: lambda o: o.check(),  # nmt.distill.distill's first step
    options.PrepareOptions: lambda o: prepare_bpe(o, progress=False),
    options.AverageOptions: lambda o: average_command(**vars(o)),
    options.ShortlistOptions: lambda o: learn_shortlist(
        o.data_dir,
        top=o.top,
        frequent=o.frequent,
        iterations=o.iterations,
        max_sentences=o.max_sentences,
    ),
    options.PlotAttentionOptions: lambda o: plot_attention(
        o.attention, o.out_dir, layer=o.layer, average=o.average, sentences=o.sentences
    ),
    options.ServeOptions: lambda o: serve(o),
    options.TranslateOptions: lambda o: Translator.from_options(o),
}
OPTION_CLASSES = [
    c
    for c in vars(options).values()
    if dataclasses.is_dataclass(c) and c.__module__ == options.__name__
]


def bounded_fields(classes: list[type]) -> list[tuple[type, str, Bounds]]:
    """(class, field, its bounds) of every field with bounds: declared, or a Literal's choices."""
    found = []
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            bounds = f.metadata.get("bounds", Bounds())
            if get_origin(hints[f.name]) is Literal:
                bounds = dataclasses.replace(bounds, choices=get_args(hints[f.name]))
            if bounds != Bounds():
                found.append((cls, f.name, bounds))
    return found


def outside(b: Bounds) -> list[Any]:
    """Values just outside the bounds: min - 1 (min for an exclusive one), max + 1 (max), a
    non-choice."""
    return [
        v
        for v in (
            None if b.at_least is None else b.at_least - 1,
            b.above,
            None if b.at_most is None else b.at_most + 1,
            b.below,
        )
        if v is not None
    ] + (["not-a-choice"] if b.choices else [])


def inside(b: Bounds) -> list[Any]:
    """The edges that the bounds allow: an inclusive min and max, every choice."""
    return [v for v in (b.at_least, b.at_most) if v is not None] + list(b.choices)


CONFIG_BOUNDS = bounded_fields(list(SECTIONS.values()))
SECTION_OF = {cls: name for name, cls in SECTIONS.items()}


def test_the_config_sections_declare_bounds():
    """The keys that were hand-checked before their fields declared bounds still are."""
    keys = {f"{SECTION_OF[cls]}.{name}" for cls, name, _ in CONFIG_BOUNDS}
    assert {
        "model.d_model",
        "model.dropout",
        "train.lr",
        "train.adam_beta2",
        "decode.beam",
        "decode.topp",
        "decode.seed",
        "train.precision",
    } <= keys
    assert len(keys) >= 60


@pytest.mark.parametrize(
    "cls, key, bounds", CONFIG_BOUNDS, ids=[f"{SECTION_OF[c]}.{k}" for c, k, _ in CONFIG_BOUNDS]
)
def test_every_declared_config_bound_is_enforced_naming_the_key(cls, key, bounds):
    """Each value just outside a key's bounds is refused by load_config in one message naming
    the key and the rule; the edges the bounds allow pass the bounds (rules between keys aside)."""
    section = SECTION_OF[cls]
    for value in outside(bounds):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"{section}.{key}={value}"])
        assert str(e.value).startswith(f"--set: {section}.{key} must "), e.value
        with pytest.raises(ConfigError, match=f"^{section}.{key} must .*, got "):
            check_bounds(dataclasses.replace(cls(), **{key: value}), lambda k: f"{section}.{k}")
    for value in inside(bounds):
        check_bounds(dataclasses.replace(cls(), **{key: value}), lambda k: f"{section}.{k}")


@pytest.mark.parametrize(
    "key",
    [
        f"{s}.{f.name}"
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if typing.get_type_hints(cls)[f.name] is float
    ],
)
def test_every_float_key_must_be_finite(key):
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(ConfigError, match=f"^--set: {key} must "):
            load_config(None, [f"{key}={value}"])


OPTION_BOUNDS = bounded_fields(OPTION_CLASSES)


def test_the_commands_options_declare_bounds():
    """The options that were hand-checked before their fields declared bounds still are, and
    each class that declares bounds has its enforcing call below."""
    keys = {f"{cls.__name__}.{name}" for cls, name, _ in OPTION_BOUNDS}
    assert {
        f"PrepareOptions.{k}"
        for k in (
            "vocab_size",
            "model_type",
            "character_coverage",
            "input_sentence_size",
            "max_len",
            "workers",
            "seed",
        )
    } <= keys
    assert {
        f"ShortlistOptions.{k}" for k in ("top", "frequent", "iterations", "max_sentences")
    } <= keys
    assert {"PlotAttentionOptions.sentences", "AverageOptions.last", "DistillOptions.nbest"} <= keys
    assert {cls for cls, _, _ in OPTION_BOUNDS} == set(VALID_OPTIONS) == set(ENFORCED_BY)


@pytest.mark.parametrize(
    "cls, key, bounds", OPTION_BOUNDS, ids=[f"{c.__name__}.{k}" for c, k, _ in OPTION_BOUNDS]
)
def test_every_declared_option_bound_is_enforced_naming_the_flag(cls, key, bounds):
    """Each value just outside an option's bounds is refused, naming the flag, by the library
    call its command makes, before any file is read; the edges the bounds allow pass the
    options' own check (`check()`, with the rules between options) or their bounds."""
    flag = "--" + key.replace("_", "-")

    def passes(opts: Any) -> None:
        getattr(opts, "check", lambda: check_bounds(opts, fields.flag))()

    passes(cls(**VALID_OPTIONS[cls]))
    for value in outside(bounds):
        with pytest.raises(NmtError, match=f"^{flag} must .*, got {value!r}$"):
            ENFORCED_BY[cls](cls(**{**VALID_OPTIONS[cls], key: value}))
    for value in inside(bounds):
        passes(cls(**{**VALID_OPTIONS[cls], key: value}))


def test_declared_bounds_are_checked_by_one_function_in_words():
    """The rule's words, as the messages and docs/config.md say them."""
    assert Bounds(at_least=0).rule() == "must not be negative"
    assert Bounds(at_least=1).rule() == "must be at least 1"
    assert Bounds(above=0).rule() == "must be positive"
    assert Bounds(above=0, at_most=1).rule() == "must be in (0, 1]"
    assert Bounds(at_least=0, below=2**62).rule() == "must be in [0, 2^62)"
    assert Bounds(at_most=5).rule() == "must be at most 5"
    assert Bounds(choices=("chrf", "bleu")).rule() == "must be one of 'chrf', 'bleu'"
    with pytest.raises(ConfigError, match=r"^cfg.yaml: decode.topp must be in \(0, 1\], got 0.0$"):
        load_config(None, options={"decode.topp": ("cfg.yaml", 0.0)})
    assert "| Dropout on attention weights. Must be in [0, 1). |" in help_table()  # docs/config.md
