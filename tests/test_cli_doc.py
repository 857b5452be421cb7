"""The generated references of the documentation are current: docs/cli.md (every command,
argument and option of `nmt`) and docs/config.md's key table, both written by
scripts/update_docs.py; a command or flag added without regenerating fails here."""

import importlib.util
import re
from pathlib import Path

import typer

from nmt.cli import app

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "run `python scripts/update_docs.py` and commit the result"


def _load_generator():
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts/update_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


update_docs = _load_generator()


def _commands(command, path="nmt"):
    """(`nmt plot curves`, its click command) for every command of the app, depth first."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, f"{path} {name}")


def _sections(text: str) -> dict[str, str]:
    """docs/cli.md's `## heading` sections by heading."""
    return {m[1]: m[2] for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)}


def test_docs_cli_reference_is_current():
    doc = ROOT / "docs/cli.md"
    assert doc.is_file(), f"docs/cli.md is missing: {REGENERATE}"
    assert doc.read_text(encoding="utf-8") == update_docs.cli_doc(), (
        f"docs/cli.md is not current: {REGENERATE}"
    )


def test_docs_config_reference_is_current():
    text = (ROOT / "docs/config.md").read_text(encoding="utf-8")
    assert update_docs.config_doc(text) == text, (
        f"docs/config.md's key table is not current: {REGENERATE}"
    )


def test_docs_cli_has_every_command_and_option():
    """Every command of the click tree is a heading of docs/cli.md, and every argument and
    non-hidden option of it (all its flags) is in that section's tables."""
    sections = _sections((ROOT / "docs/cli.md").read_text(encoding="utf-8"))
    missing = []
    for path, command in _commands(typer.main.get_command(app)):
        if path not in sections:
            missing.append(f"## {path}")
            continue
        # the first cell of each argument's or option's row: its names
        cells = [
            line.split(" | ")[0] for line in sections[path].splitlines() if line.startswith("| `")
        ]
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            names = (
                param.opts + param.secondary_opts
                if param.param_type_name == "option"
                else [param.name]
            )
            cell = next((c for c in cells if f"`{names[0]}`" in c), "")
            missing += [f"{path} {name}" for name in names if f"`{name}`" not in cell]
    assert not missing, f"not in docs/cli.md: {', '.join(missing)}; {REGENERATE}"


def test_check_names_the_stale_file(tmp_path, monkeypatch, capsys):
    """`update_docs.py --check`: exit 1 with one line naming the stale file; 0 when current."""
    monkeypatch.setattr(update_docs, "ROOT", tmp_path)
    cli, config = tmp_path / "docs/cli.md", tmp_path / "docs/config.md"
    cli.parent.mkdir()
    config.write_text((ROOT / "docs/config.md").read_text(encoding="utf-8"), encoding="utf-8")
    cli.write_text(
        update_docs.cli_doc().replace("## nmt translate\n", "## nmt translate\n\nedited\n"),
        encoding="utf-8",
    )
    monkeypatch.setattr(update_docs, "CLI_DOC", cli)
    monkeypatch.setattr(update_docs, "CONFIG_DOC", config)
    assert update_docs.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err == "docs/cli.md is not current: run `python scripts/update_docs.py`\n"
    assert update_docs.main([]) == 0 and capsys.readouterr().out == "wrote docs/cli.md\n"
    assert update_docs.main(["--check"]) == 0 and capsys.readouterr().err == ""
