"""Every command that README.md and docs/**/*.md show works as written, so that none can rot.

The code blocks are found when the tests are collected (tests/doc_blocks.py reads the shell
blocks as bash would), one test per place (FILE:LINE):
- an `nmt ...` line (also `python -m nmt`, `torchrun ... -m nmt`) parses against the real
  command tree, nothing run: unknown commands and options, missing values and bad types
  fail as `nmt` fails them, and the values given keep the bounds and choices nmt declares;
- each `--set KEY=VALUE` names a config key and its value converts (nmt.config.load_config);
- the configs/, scripts/ and tests/ files a command names exist; `make TARGET` is a target
  of the Makefile;
- a Python block compiles, and what it imports from nmt exists;
- a `curl` line, run by bash against a real `nmt serve` of a tiny checkpoint, is answered 2xx,
  with valid JSON where the answer says it is JSON.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from doc_blocks import (
    PYTHON_LANGS,
    ROOT,
    Block,
    Command,
    all_blocks,
    at_server,
    commands,
    config_overrides,
    make_targets,
    makefile_targets,
    nmt_args,
    repository_paths,
)
from serving import Server

from nmt import cli
from nmt.config import DecodeConfig, load_config
from nmt.errors import NmtError
from nmt.fields import check_bounds, flag

# ---------------------------------------------------------- what the docs hold, read at collection


def _collect() -> tuple[list[Block], list[Command], list[str]]:
    """Every block, every command of the shell blocks, and the lines that did not tokenize."""
    blocks, found, broken = all_blocks(), [], []
    for block in blocks:
        try:
            found += commands(block)
        except ValueError as e:
            broken.append(f"{block.where}: {e}")
    return blocks, found, broken


BLOCKS, COMMANDS, UNREADABLE = _collect()
NMT_COMMANDS = [c for c in COMMANDS if nmt_args(c) is not None]
OVERRIDES = [c for c in COMMANDS if config_overrides(c)]
NAMING_FILES = [c for c in COMMANDS if repository_paths(c)]
MAKES = [c for c in COMMANDS if make_targets(c)]
PYTHON = [b for b in BLOCKS if b.lang in PYTHON_LANGS]
# one test per line: `curl a; curl b` is run as the line it is
CURL_LINES = list({(c.file, c.line): c for c in COMMANDS if c.program == "curl"}.values())


def _ids(items: list[Any]) -> list[str]:
    """FILE:LINE, numbered where a line holds several (`nmt a | nmt b`)."""
    seen: dict[str, int] = {}
    ids = []
    for item in items:
        seen[item.where] = seen.get(item.where, 0) + 1
        ids.append(item.where if seen[item.where] == 1 else f"{item.where}#{seen[item.where]}")
    return ids


def _parametrize(name: str, items: list[Any]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(name, items, ids=_ids(items))


# ------------------------------------------------------------------ nmt's command line, parsed only


def _options_class(command: Any) -> type | None:
    """The dataclass of nmt.options that a command of nmt.cli is made from (None for a group)."""
    if command.callback is None:
        return None
    return inspect.getclosurevars(inspect.unwrap(command.callback)).nonlocals.get("cls")


def _check_declared_bounds(command: Any, ctx: Any) -> None:
    """The values given on the command line within the bounds and choices nmt declares for them
    (the library checks them when it runs; the parser does not): a ConfigError naming the flag."""
    cls = _options_class(command)
    if cls is None:
        return
    given = {
        name: value
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name).name == "COMMANDLINE"
    }
    own = {f.name for f in dataclasses.fields(cls)}
    for owner, values in (
        (cls, {k: v for k, v in given.items() if k in own}),
        (DecodeConfig, {k: v for k, v in given.items() if k not in own}),
    ):
        if values:  # none given: check_bounds would check every field's default
            check_bounds(owner, flag, **values)


def _command_tree(relax_required: bool) -> Any:
    """nmt's command tree, built afresh; with `relax_required`, no parameter is required
    (`nmt train ...` elides them)."""
    root = typer.main.get_command(cli.app)
    stack = [root] if relax_required else []
    while stack:
        command = stack.pop()
        for param in command.params:
            param.required = False
        stack += list(getattr(command, "commands", {}).values())
    return root


def parse_nmt(args: list[str]) -> None:
    """Parse `nmt ARGS` down the command tree (`nmt plot attention ...`) as `nmt` does, invoking
    nothing: a usage error (typer.TyperException) or a value out of its bounds (NmtError)
    raises. `--help` and `--version` end the parse, as they end `nmt`. A `...` stands for
    elided arguments: it is dropped, and required ones may then be missing."""
    command, name, parent = _command_tree(relax_required="..." in args), "nmt", None
    args = [a for a in args if a != "..."]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            while True:
                ctx = command.make_context(name, args, parent=parent)
                _check_declared_bounds(command, ctx)
                if not hasattr(command, "resolve_command"):
                    return
                rest = [*ctx._protected_args, *ctx.args]
                if not rest:
                    ctx.fail("Missing command.")
                name, command, args = command.resolve_command(ctx, rest)
                parent = ctx
        except typer.Exit as e:  # --help, --version
            if e.exit_code:
                raise


def _usage_error(e: Exception) -> str:
    """The one line `nmt` prints for this error."""
    if isinstance(e, typer.TyperException):
        ctx = getattr(e, "ctx", None)
        return f"{ctx.command_path if ctx else 'nmt'}: error: {e.format_message()}"
    return f"nmt: error: {e}"


def _parse_error(args: list[str]) -> str | None:
    try:
        parse_nmt(args)
    except (typer.TyperException, NmtError) as e:
        return _usage_error(e)
    return None


@_parametrize("command", NMT_COMMANDS)
def test_nmt_command_parses(command: Command) -> None:
    error = _parse_error(nmt_args(command) or [])
    if error:
        pytest.fail(f"{command.where}: {command.text.strip()}\n  {error}", pytrace=False)


@_parametrize("command", OVERRIDES)
def test_config_overrides_name_real_keys(command: Command) -> None:
    """Every `--set` of the command, applied together to the default config as `nmt train`
    applies them."""
    try:
        load_config(None, config_overrides(command))
    except NmtError as e:
        pytest.fail(f"{command.where}: {command.text.strip()}\n  nmt: error: {e}", pytrace=False)


def test_the_parser_fails_what_nmt_fails() -> None:
    """The checks above are not vacuous: what `nmt` refuses, `parse_nmt` refuses."""
    accepted = [
        ["--help"],
        ["--version"],
        ["--debug", "translate", "-c", "CHECKPOINT"],
        ["translate", "--help"],
        ["plot", "attention", "att.npz", "-o", "maps/"],
        ["train", "..."],
        ["translate", "--lenpen-style", "gnmt", "--beam", "5"],
        ["prepare-bpe", "--model-type", "unigram", "..."],
    ]
    refused = {
        "translat": "No such command",
        "--debug": "Missing command",
        "plot": "Usage: nmt plot",
        "translate --beem 5": "No such option",
        "translate --beam": "requires an argument",
        "translate --beam five": "Invalid value for '--beam'",
        "translate --lenpen-style gnm": "is not one of",
        "translate --beam 0": "--beam must be at least 1",
        "prepare-bpe --model-type wordpiece ...": "--model-type must be one of",
        "train": "Missing argument",
        "average-checkpoints a.pt": "Missing option",
        "plot attention att.npz -o maps/ extra": "unexpected extra argument",
    }
    assert [args for args in accepted if _parse_error(args)] == []
    for line, expected in refused.items():
        error = _parse_error(line.split())
        assert error is not None and expected in error, (line, error)
    with pytest.raises(NmtError, match="unknown key train.lrr"):
        load_config(None, ["train.lrr=2"])
    with pytest.raises(NmtError, match="train.lr must be a number"):
        load_config(None, ["train.lr=fast"])


def test_every_command_has_its_options_class() -> None:
    """The bounds check above finds what each command is made from; and no option checks that
    its path exists, so that the docs' placeholder paths (`D/train`, `CHECKPOINT`) parse."""
    stack: list[Any] = [typer.main.get_command(cli.app)]
    while stack:
        command = stack.pop()
        children = list(getattr(command, "commands", {}).values())
        stack += children
        if not children and command.callback is not None:
            assert _options_class(command) is not None, command.name
        for param in command.params:
            assert not getattr(param.type_descriptor.parameter_info, "exists", False), (
                command.name,
                param.name,
            )


# ------------------------------------------------------------------ files, targets, Python


@_parametrize("command", NAMING_FILES)
def test_repository_files_exist(command: Command) -> None:
    missing = [p for p in repository_paths(command) if not (ROOT / p).exists()]
    assert not missing, (
        f"{command.where}: {command.text.strip()}\n  no such file in the repository: {missing}"
    )


@_parametrize("command", MAKES)
def test_make_targets_exist(command: Command) -> None:
    unknown = [t for t in make_targets(command) if t not in makefile_targets(ROOT / "Makefile")]
    assert not unknown, (
        f"{command.where}: {command.text.strip()}\n  no such target in the Makefile: {unknown}"
    )


@_parametrize("block", PYTHON)
def test_python_block_compiles(block: Block) -> None:
    error = _syntax_error(block)
    if error:
        pytest.fail(error, pytrace=False)


def _syntax_error(block: Block) -> str | None:
    """FILE:LINE: what Python says, for a block that does not compile."""
    try:
        compile(block.source(), block.file, "exec")
    except SyntaxError as e:
        return f"{block.file}:{e.lineno}: {e.msg}\n  {(e.text or '').strip()}"
    return None


def _nmt_imports(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name or None) of each `import nmt...` / `from nmt... import name`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (
                (node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "nmt"
            )
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "nmt"
        ):
            yield from (
                (node.lineno, node.module or "", a.name) for a in node.names if a.name != "*"
            )


def _resolves(module: str, name: str | None) -> bool:
    try:
        imported = importlib.import_module(module)
        if name is None or hasattr(imported, name):
            return True
        importlib.import_module(f"{module}.{name}")  # a submodule
        return True
    except ImportError:
        return False


@_parametrize("block", [b for b in PYTHON if "nmt" in "\n".join(b.lines)])
def test_python_block_imports_exist(block: Block) -> None:
    if _syntax_error(block):
        pytest.fail(
            f"{block.where}: does not compile (test_python_block_compiles says why)", pytrace=False
        )
    unresolved = [
        f"{block.file}:{line}: {module}{'' if name is None else ' has no ' + name}"
        for line, module, name in _nmt_imports(ast.parse(block.source()))
        if not _resolves(module, name)
    ]
    assert not unresolved, "\n".join(unresolved)


# ------------------------------------------------------------------ curl against a real nmt serve

# Each curl of the line, run by bash as written, writes its status, content type and body
# file to $DOCS_OUT/answers; the body still goes to stdout for a pipe after it.
_CURL_WRAPPER = r"""
set -eo pipefail
curl() {
  local body
  body=$(mktemp "$DOCS_OUT/body.XXXXXX")
  command curl --fail-with-body -sS --max-time 120 -o "$body" \
    -w "%{http_code}\t%{content_type}\t$body\n" "$@" >> "$DOCS_OUT/answers" || return
  cat "$body"
}
"""


@pytest.fixture(scope="module")
def doc_server(random_checkpoint: Path) -> Iterator[Server]:
    """`nmt serve` of a random tiny en-de checkpoint, as the docs' second example starts one
    (`--model en-de=...`): the LibreTranslate lines ask for source en and target de by name."""
    with Server("--model", f"en-de={random_checkpoint}", "--threads", "1") as server:
        yield server


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@_parametrize("command", CURL_LINES)
def test_curl_line_is_answered(command: Command, doc_server: Server, tmp_path: Path) -> None:
    line = at_server(command.text, f"127.0.0.1:{doc_server.port}")
    run = subprocess.run(
        ["bash", "-c", _CURL_WRAPPER + line],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DOCS_OUT": str(tmp_path), "NO_PROXY": "*", "no_proxy": "*"},
    )
    answers = (
        (tmp_path / "answers").read_text().splitlines() if (tmp_path / "answers").exists() else []
    )
    where = f"{command.where}: {line.strip()}"
    assert run.returncode == 0, f"{where}\n  exit {run.returncode}: {run.stderr.strip()} {answers}"
    expected = sum(
        1 for c in COMMANDS if (c.file, c.line, c.program) == (command.file, command.line, "curl")
    )
    assert len(answers) == expected, f"{where}\n  {len(answers)} answers for {expected} curls"
    for answer in answers:
        status, content_type, body_file = answer.split("\t")
        body = Path(body_file).read_text(encoding="utf-8")
        assert status.startswith("2"), f"{where}\n  HTTP {status}: {body}"
        if "json" in content_type:
            try:
                json.loads(body)
            except ValueError as e:
                pytest.fail(f"{where}\n  not JSON ({e}): {body[:500]}", pytrace=False)


# ------------------------------------------------------------------ the collection itself


def test_the_docs_are_read() -> None:
    """A collector that finds nothing would pass everything: README.md is there and has
    commands, and the docs as a whole have blocks of every kind checked above."""
    assert (ROOT / "README.md").is_file()
    assert any(c.file == "README.md" for c in NMT_COMMANDS), "no nmt command found in README.md"
    assert any(b.file.startswith("docs/") for b in BLOCKS), "no block found under docs/"
    assert len(NMT_COMMANDS) >= 20, len(NMT_COMMANDS)
    assert OVERRIDES and NAMING_FILES and MAKES and PYTHON and CURL_LINES


def test_every_shell_line_reads() -> None:
    """No shell line has an unclosed quote (it would hide the commands of its block)."""
    assert UNREADABLE == []


def test_the_shell_reader() -> None:
    """doc_blocks reads a line as bash does: continuations, comments, prompts, quotes,
    redirections, assignments and producers; `python -m nmt` and `torchrun -m nmt` are nmt."""
    block = Block(
        "x.md",
        10,
        "sh",
        (
            "CK=runs/a/checkpoint_avg.pt   # the checkpoint",
            "SRC=en TGT=fr make demo",
            "echo 'A dog. # not a comment' | nmt translate -c $CK \\",
            '  --beam 5 2>/dev/null > out.de && python -m nmt score --ref "ref #1.de" < out.de',
            "torchrun --standalone --nproc_per_node 2 -m nmt train configs/tiny.yaml "
            "--set train.lr=2",
            "cat > terms.tsv <<EOF",
            "nmt is not a command here",
            "EOF",
        ),
    )
    found = commands(block)
    assert [(c.line, c.words) for c in found] == [
        (11, ("make", "demo")),
        (12, ("echo", "A dog. # not a comment")),
        (12, ("nmt", "translate", "-c", "runs/a/checkpoint_avg.pt", "--beam", "5")),
        (12, ("python", "-m", "nmt", "score", "--ref", "ref #1.de")),
        (
            14,
            (
                "torchrun",
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "nmt",
                "train",
                "configs/tiny.yaml",
                "--set",
                "train.lr=2",
            ),
        ),
        (15, ("cat",)),
    ]
    assert found[0].env == {"SRC": "en", "TGT": "fr"} and make_targets(found[0]) == ["demo"]
    assert nmt_args(found[3]) == ["score", "--ref", "ref #1.de"]
    assert nmt_args(found[4]) == ["train", "configs/tiny.yaml", "--set", "train.lr=2"]
    assert config_overrides(found[4]) == ["train.lr=2"] and repository_paths(found[4]) == [
        "configs/tiny.yaml"
    ]
    session = Block(
        "x.md", 1, "", ("$ echo hi | nmt translate -c rnn.pt --alignment", "Hallo\t0-0")
    )
    assert [c.words[0] for c in commands(session)] == ["echo", "nmt"]


def _readme_links() -> list[str]:
    """The relative link and image targets of README.md (the site's own links are checked by
    `mkdocs build --strict`; the README is outside the site)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_readme_links_to_files_that_exist() -> None:
    links = _readme_links()
    assert len(links) >= 10, links  # the README links into the docs throughout
    for link in links:
        path = link.split("#", 1)[0]
        assert path and (ROOT / path).is_file(), f"README.md links to {link}, which does not exist"
        assert not link.startswith("docs/") or "#" not in link, (
            f"README.md: {link}: link to a docs page, not to an anchor in it "
            "(anchors change with headings)"
        )
