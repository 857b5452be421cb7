"""The package map of docs/architecture.md, enforced: which part of nmt may import which.

Every `nmt` import of every module (at the top or inside a function, absolute or relative) is
checked against MAY_IMPORT, so the map cannot drift from the code."""

from __future__ import annotations

import ast
import io
import shutil
import tokenize
from pathlib import Path

import pytest
import tomllib

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"
SUBPACKAGES = {"models", "decoding", "training", "convert", "serve"}
# the top-level modules anything may use: errors, config and options, the file formats (raw
# text, atomic writes, tokenizer, binarized data, prepare-bpe, checkpoints), devices, metrics
BASE = {
    "errors",
    "fields",
    "config",
    "options",
    "textio",
    "atomic",
    "tokenizer",
    "data",
    "prepare",
    "checkpoint",
    "device",
    "evaluate",
    "terminology",
    "segment",
}
# the commands' own modules: nothing imports them but the CLI (and `python -m nmt`)
COMMANDS = {"cli", "__main__", "translate", "plot", "distill"}
CLI = {"nmt.cli", "nmt.__main__"}

# part -> the parts it may import besides itself ("base": any BASE module)
MAY_IMPORT = {
    "base": {"base"},
    "models": {"config", "errors"},  # a model knows nothing of files, tokenizers or search
    "decoding": {"base", "models"},
    "training": {"base", "models", "decoding"},
    "convert": {"base", "models"},
    # CTranslate2 as the inference engine: the exporter converts the model it decodes
    "engine": {"base", "models", "decoding", "convert"},
    "api": {"base", "models", "decoding", "engine"},
    "package": {"api"},  # nmt/__init__.py: `from nmt import Translator`
    "serve": {"base", "decoding", "api"},  # the server: a Translator per model behind HTTP
    "commands": {
        "base",
        "models",
        "decoding",
        "training",
        "convert",
        "engine",
        "api",
        "package",
        "serve",
    },
}


def module_name(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def part_of(module: str) -> str:
    """'nmt.decoding.search' -> 'decoding'; 'nmt.config' -> 'config'; 'nmt.cli' -> 'commands'."""
    head = module.split(".")[1] if "." in module else ""
    if not head:
        return "package"
    if head in SUBPACKAGES or head in ("api", "engine"):
        return head
    if head in COMMANDS:
        return "commands"
    assert head in BASE, (
        f"nmt.{head} is new: give it a place in BASE or COMMANDS and in docs/architecture.md"
    )
    return head


def allowed(src: str, dst: str) -> bool:
    if (
        dst == "nmt"
    ):  # `from nmt import __version__`: every import of nmt.X runs nmt/__init__.py anyway
        return True
    s, d = part_of(src), part_of(dst)
    if d == "commands":
        return src in CLI
    if s == d or (s in BASE and d in BASE):
        return True
    rules = MAY_IMPORT["base" if s in BASE else s]
    return d in rules or ("base" in rules and d in BASE)


def nmt_imports(path: Path, package: Path) -> list[tuple[int, str]]:
    """(line, module) of each import of an nmt module in `path`, relative imports resolved."""
    here = module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "nmt"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "nmt":
                continue
            for a in node.names:  # `from nmt.decoding import search` imports nmt.decoding.search
                sub = package.parent / f"{base}.{a.name}".replace(".", "/")
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.append((node.lineno, f"{base}.{a.name}" if is_module else base))
    return found


def violations(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        src = module_name(path, package)
        for line, dst in nmt_imports(path, package):
            if dst in {"nmt." + p for p in SUBPACKAGES} or not allowed(src, dst):
                out.append(
                    f"{path.relative_to(package.parent)}:{line}: {part_of(src)} may not import "
                    f"{dst}"
                )
    return out


def test_every_import_in_the_package_follows_the_map() -> None:
    assert violations(PACKAGE) == []


def test_pyproject_ships_every_subpackage() -> None:
    """A folder of modules missing from pyproject's package list is silently left out of the
    wheel."""
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    folders = {
        module_name(p.parent / "__init__.py", PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert folders == set(config["tool"]["setuptools"]["packages"])
    assert all((PACKAGE.parent / f.replace(".", "/") / "__init__.py").is_file() for f in folders)


@pytest.mark.parametrize(
    ("module", "line", "message"),
    [
        (
            "models/transformer.py",
            "from nmt.tokenizer import NMT_SPECIALS",
            "models may not import nmt.tokenizer",
        ),
        (
            "models/layers.py",
            "from ..decoding.search import beam_search",
            "models may not import nmt.decoding.search",
        ),
        (
            "decoding/search.py",
            "def f():\n    from nmt.training import trainer",
            "decoding may not import nmt.training.trainer",
        ),
        (
            "decoding/predict.py",
            "from ..convert import ctranslate2",
            "decoding may not import nmt.convert.ctranslate2",
        ),
        (
            "convert/ctranslate2.py",
            "import nmt.training.loss",
            "convert may not import nmt.training.loss",
        ),
        ("training/trainer.py", "import nmt.translate", "training may not import nmt.translate"),
        ("api.py", "from nmt.cli import app", "api may not import nmt.cli"),
        ("translate.py", "from nmt import plot", "commands may not import nmt.plot"),
        (
            "checkpoint.py",
            "from nmt.models.transformer import Transformer",
            "checkpoint may not import nmt.models.transformer",
        ),
    ],
)
def test_a_broken_rule_is_reported(tmp_path: Path, module: str, line: str, message: str) -> None:
    """The check itself: one forbidden import added to a copy of the package is reported, with
    its file and line."""
    copy = tmp_path / "nmt"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    text = target.read_text(encoding="utf-8")
    target.write_text(text + "\n" + line + "\n", encoding="utf-8")
    lineno = text.count("\n") + 2 + line.count("\n")  # the import is the last line added
    assert violations(copy) == [f"nmt/{module}:{lineno}: {message}"]


# ------------------------------------------------------------------ rooms: sizes in code tokens

# Size is counted in the tokens that carry code (no comments, docstrings, layout or a trailing
# comma before a closing bracket), as ../shared/tools/code_size.py counts them: rewrapping a
# call moves none, joining `a = x` and `b = y` into `a, b = x, y` adds one. Lines would reward
# packing statements together.
# the budget, with the CTranslate2 engine inside it (docs/architecture.md)
PACKAGE_TOKENS = 100_000
MODULE_TOKENS = 5_000
FUNCTION_TOKENS = 800
LAYOUT = {
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.COMMENT,
}
STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


def code_token_lines(source: str) -> list[int]:
    """The line of each code token of `source`: docstrings, comments, layout and trailing
    commas left out."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    significant = [t for t in tokens if t.type not in (tokenize.NL, tokenize.COMMENT)]
    trailing_commas = {
        id(a) for a, b in zip(significant, significant[1:]) if a.string == "," and b.string in ")]}"
    }
    lines = []
    previous = tokenize.NEWLINE
    for tok in tokens:
        is_docstring = tok.type == tokenize.STRING and previous in STATEMENT_START
        if tok.type not in LAYOUT and not is_docstring and id(tok) not in trailing_commas:
            lines.append(tok.start[0])
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type
    return lines


def sizes(package: Path) -> tuple[int, list[str]]:
    """The package's code tokens, and each module over MODULE_TOKENS and function over
    FUNCTION_TOKENS (a nested function counts in its own and its parent's size)."""
    total = 0
    found = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(package.parent)
        lines = code_token_lines(source)
        total += len(lines)
        if len(lines) > MODULE_TOKENS:
            found.append(f"{name}: {len(lines)} tokens (at most {MODULE_TOKENS})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                last = node.end_lineno or node.lineno
                count = sum(1 for line in lines if first <= line <= last)
                if count > FUNCTION_TOKENS:
                    found.append(
                        f"{name}:{node.lineno}: {node.name} is {count} tokens (at most "
                        f"{FUNCTION_TOKENS})"
                    )
    return total, found


def test_the_package_modules_and_functions_keep_within_their_token_budgets() -> None:
    total, oversized = sizes(PACKAGE)
    assert oversized == []
    assert total <= PACKAGE_TOKENS


def test_token_counts_ignore_layout_comments_and_docstrings() -> None:
    wrapped = '"""Doc."""\n\n# a comment\nx = f(\n    1,\n    2,\n)\n'
    assert len(code_token_lines(wrapped)) == len(code_token_lines("x = f(1, 2)\n")) == 8
    # joining two assignments into one tuple assignment saves a line and costs a token
    assert code_token_lines("a = 1\nb = 2\n") == [1, 1, 1, 2, 2, 2]
    assert code_token_lines("a, b = 1, 2\n") == [1] * 7


def test_an_oversized_module_or_function_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "nmt"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_TOKENS // 3 + 1))
    (package / "long.py").write_text(f"def f():\n{body}\n")
    (package / "big.py").write_text("x = 1\n" * (MODULE_TOKENS // 3 + 1))
    function_tokens = 5 + 3 * (FUNCTION_TOKENS // 3 + 1)  # def f ( ) : and the assignments
    module_tokens = 3 * (MODULE_TOKENS // 3 + 1)
    assert sizes(package)[1] == [
        f"nmt/big.py: {module_tokens} tokens (at most {MODULE_TOKENS})",
        f"nmt/long.py:1: f is {function_tokens} tokens (at most {FUNCTION_TOKENS})",
    ]


# ------------------------------------------------------------------ layout: the formatter's length


def long_lines(folders: list[Path], limit: int) -> list[str]:
    """Every line of the folders' Python files longer than `limit` characters: what `ruff
    format` cannot wrap (a long string, comment or docstring line) must be wrapped by hand."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if len(line) > limit:
                    found.append(
                        f"{path.relative_to(folder.parent)}:{number}: {len(line)} characters"
                    )
    return found


def test_no_line_is_longer_than_the_configured_length() -> None:
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    limit = config["tool"]["ruff"]["line-length"]
    folders = [PACKAGE.parent / name for name in ("nmt", "tests", "benchmarks", "scripts")]
    assert long_lines(folders, limit) == []


def test_a_long_line_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "a.py").write_text("x = 1\n" + "# " + "y" * 99 + "\n")
    assert long_lines([folder], 100) == ["pkg/a.py:2: 101 characters"]
