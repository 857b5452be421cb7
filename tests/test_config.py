"""Config loading: key paths in errors, suggestions, type checks, overrides, invariants."""

from pathlib import Path

import pytest

from nmt.config import (
    Config,
    config_from_dict,
    config_to_dict,
    dump_config,
    help_table,
    load_config,
)
from nmt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


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


def test_unknown_nested_key_names_path_file_and_suggestion(tmp_path):
    p = write(tmp_path, "model:\n  d_modle: 256\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg and "model.d_modle" in msg and "did you mean model.d_model?" in msg


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key trian.*did you mean train"):
        load_config(write(tmp_path, "trian:\n  lr: 1\n"))


@pytest.mark.parametrize(
    "text, key",
    [
        ("model:\n  d_model: big\n", "model.d_model must be an integer"),
        ("model:\n  norm_first: 1\n", "model.norm_first must be true or false"),
        ("train:\n  lr: fast\n", "train.lr must be a number"),
        ("train:\n  precision: fp8\n", "train.precision must be one of"),
        ("model:\n  heads: 3\n", "model.heads (3) must divide model.d_model (512)"),
        ("decode:\n  beam: 0\n", "decode.beam must be at least 1"),
        ("train:\n  warmup_updates: -5\n", "train.warmup_updates must not be negative"),
        ("model:\n  dropout: 1.5\n", "model.dropout must be in [0, 1)"),
        ("train:\n  dropout_ramp_start: 50\n  dropout_ramp_end: 50\n",
         "train.dropout_ramp_end (50) must be 0 or above train.dropout_ramp_start (50)"),
        ("train:\n  dropout_ramp_end: 50\n  dropout_ramp_to: 1.0\n", "train.dropout_ramp_to must be in [0, 1)"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert key in str(e.value)


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


def test_docs_config_reference_is_current():
    assert help_table() in (ROOT / "docs/config.md").read_text(encoding="utf-8")
