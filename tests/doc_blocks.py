"""The fenced code blocks of README.md and docs/**/*.md, and the commands of their shell blocks,
for tests/test_docs.py.

A shell block (```sh, ```bash, ...) is read as bash reads it, as far as documented commands
need: backslash continuations are joined, `# comments` dropped, quotes and escapes undone,
command lists split on `|`, `;`, `&&`, `||` and `&`, redirections (`< in`, `> out`, `2>&1`,
`<<EOF` with its here-document) dropped, leading `VAR=value` assignments taken off (and a
block's own `VAR=value` lines expand `$VAR` after them). A plain ``` or ```console block is a
terminal session: only its `$ ` lines are commands, the rest is output.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

SCRIPT_LANGS = {"sh", "bash", "shell", "zsh"}  # every line is a command
SESSION_LANGS = {"", "console", "shell-session"}  # only `$ ` lines are commands
PYTHON_LANGS = {"python", "py", "python3"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
# longest first: `&&` before `&`, `>>` before `>`
_OPERATORS = (
    "&>>",
    "<<<",
    "<<-",
    "&&",
    "||",
    ";;",
    "|&",
    "&>",
    ">>",
    ">&",
    ">|",
    "<<",
    "<&",
    "<>",
    ";",
    "|",
    "&",
    "<",
    ">",
)
_SEPARATORS = {"&&", "||", ";;", "|&", ";", "|", "&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_WRAPPERS = {
    "time",
    "env",
    "exec",
    "nohup",
    "command",
    "export",
}  # `time nmt ...` is an nmt command


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository, e.g. "docs/guides/serving.md"
    line: int  # the line of its first content line
    lang: str
    lines: tuple[str, ...]  # its content, the fence's indentation removed

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def source(self) -> str:
        """The content, preceded by blank lines so that its line numbers are the file's."""
        return "\n" * (self.line - 1) + "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class Command:
    """One simple command of a shell block: `words` without assignments, wrappers and
    redirections (`words[0]` is the program); `env` its leading `VAR=value` assignments;
    `text` the whole logical line it is on (continuations joined)."""

    file: str
    line: int
    text: str
    words: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def program(self) -> str:
        return PurePosixPath(self.words[0]).name if self.words else ""


class Token(NamedTuple):
    text: str
    operator: bool  # `|`, `&&`, `>`, ... (not quoted)


# ------------------------------------------------------------------ blocks


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/, as they are now."""
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced code blocks of a Markdown file (an unclosed one runs to the end)."""
    name = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = i + 1
        while end < len(lines) and not re.fullmatch(
            rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*", lines[end]
        ):
            end += 1
        body = tuple(
            line[indent:] if line[:indent].strip() == "" else line.lstrip()
            for line in lines[i + 1 : end]
        )
        found.append(Block(name, i + 2, m["lang"].lower(), body))
        i = end + 1
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for path in doc_files(root) if path.is_file() for b in blocks(path, root)]


# ------------------------------------------------------------------ shell


def logical_lines(block: Block) -> Iterator[tuple[int, str]]:
    """(line number, text) of each command line of a shell block: `$ ` prompts removed (in a
    session block, lines without one are output), backslash continuations joined,
    here-documents skipped."""
    session = block.lang in SESSION_LANGS
    i = 0
    while i < len(block.lines):
        start, text = i, block.lines[i]
        i += 1
        prompted = text.startswith("$ ") or text == "$"
        if session and not prompted:
            continue
        text = text[2:] if prompted else text
        while _continued(text) and i < len(block.lines):
            text = text[:-1] + block.lines[i]
            i += 1
        heredoc = re.search(r"(?<!<)<<-?[ \t]*(['\"]?)(\w+)\1", text)
        if heredoc:  # its body is text, not commands
            while i < len(block.lines) and block.lines[i].strip() != heredoc[2]:
                i += 1
            i += 1
        yield block.line + start, text


def _continued(text: str) -> bool:
    """Ends with an unescaped backslash."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def tokenize(line: str, variables: Mapping[str, str] | None = None) -> list[Token]:
    """Words and operators of one logical line, quotes and escapes undone, `$VAR` of `variables`
    expanded (others kept as written), a `# comment` dropped. ValueError for an unclosed quote."""
    variables = variables or {}
    tokens: list[Token] = []
    word: list[str] | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if c in " \t" or c in "|&;<>":
            if word is not None:
                if not (c in "<>" and "".join(word).isdigit()):  # `2>`: a descriptor, not a word
                    tokens.append(Token("".join(word), False))
                word = None
            if c in " \t":
                i += 1
            else:
                op = next(o for o in _OPERATORS if line.startswith(o, i))
                tokens.append(Token(op, True))
                i += len(op)
            continue
        if c == "#" and word is None:
            break
        word = [] if word is None else word
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ValueError(f"unclosed ' in: {line}")
            word.append(line[i + 1 : end])
            i = end + 1
        elif c == '"':
            i = _double_quoted(line, i + 1, word, variables)
        elif c == "\\":
            word.append(line[i + 1 : i + 2])
            i += 2
        else:
            i = _plain(line, i, word, variables)
    if word is not None:
        tokens.append(Token("".join(word), False))
    return tokens


def _double_quoted(line: str, i: int, word: list[str], variables: Mapping[str, str]) -> int:
    """Append the inside of a "..." that starts at `i` to `word`; the index after its closing
    quote."""
    while i < len(line):
        c = line[i]
        if c == '"':
            return i + 1
        if c == "\\" and line[i + 1 : i + 2] in ('"', "\\", "$", "`"):
            word.append(line[i + 1])
            i += 2
        else:
            i = _plain(line, i, word, variables)
    raise ValueError(f'unclosed " in: {line}')


def _plain(line: str, i: int, word: list[str], variables: Mapping[str, str]) -> int:
    """Append the character at `i`, or the $variable starting there, to `word`; the index after
    it."""
    if line[i] == "$":
        return _variable(line, i, word, variables)
    word.append(line[i])
    return i + 1


def _variable(line: str, i: int, word: list[str], variables: Mapping[str, str]) -> int:
    m = _VARIABLE.match(line, i)
    if not m:
        word.append("$")
        return i + 1
    name = m[1] or m[2]
    word.append(variables.get(name, m[0]))
    return m.end()


def _simple_commands(tokens: list[Token]) -> Iterator[list[str]]:
    """The words of each simple command: split on separators, redirections and their targets
    dropped."""
    words: list[str] = []
    redirect = False
    for text, operator in tokens:
        if operator and text in _SEPARATORS:
            yield words
            words, redirect = [], False
        elif operator:  # a redirection: its target is the next word
            redirect = True
        elif redirect:
            redirect = False
        else:
            words.append(text)
    yield words


def _strip_assignments(words: list[str], env: dict[str, str]) -> list[str]:
    """Take leading `VAR=value` words (and `env`, `time`, `export`, ... before them) into `env`."""
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
        first = words.pop(0)
        if "=" in first:
            name, _, value = first.partition("=")
            env[name] = value
    return words


def commands(block: Block) -> list[Command]:
    """The simple commands of a shell block, in order. A line of assignments alone
    (`CK=run/checkpoint.pt`) sets what `$CK` expands to in the lines after it.
    ValueError for a line that does not tokenize."""
    if block.lang not in SCRIPT_LANGS | SESSION_LANGS:
        return []
    found: list[Command] = []
    variables: dict[str, str] = {}
    for line, text in logical_lines(block):
        for words in _simple_commands(tokenize(text, variables)):
            env: dict[str, str] = {}
            words = _strip_assignments(words, env)
            if words:
                found.append(Command(block.file, line, text, tuple(words), env))
            else:
                variables.update(env)
    return found


# ------------------------------------------------------------------ what a command is


def nmt_args(command: Command) -> list[str] | None:
    """The arguments of an nmt invocation (`nmt ...`, `.venv/bin/nmt ...`, `python -m nmt ...`,
    `torchrun ... -m nmt ...`); None for another program."""
    words = command.words
    if command.program == "nmt":
        return list(words[1:])
    if command.program.startswith("python") or command.program == "torchrun":
        for i in range(1, len(words) - 1):
            if words[i] == "-m" and words[i + 1] == "nmt":
                return list(words[i + 2 :])
    return None


def config_overrides(command: Command) -> list[str]:
    """The `--set KEY=VALUE` items of a command, also those passed through the environment
    (`EXTRA="--set train.max_time=600" make demo`)."""
    found = []
    for words in [list(command.words), *(_split(v) for v in command.env.values() if "--set" in v)]:
        for i, word in enumerate(words):
            if word == "--set" and i + 1 < len(words):
                found.append(words[i + 1])
            elif word.startswith("--set="):
                found.append(word[len("--set=") :])
    return found


def _split(value: str) -> list[str]:
    """The words of a variable's value, as a command that expands it unquoted into its own
    command line would see them (`$EXTRA` in scripts/demo.sh)."""
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


_REPO_PATH = re.compile(r"^(?:\./)?((?:configs|scripts|tests)/[^\s:]+)")


def repository_paths(command: Command) -> list[str]:
    """The files of the repository a command names (configs/..., scripts/..., tests/...), as
    words or after a `=` (`--config=configs/x.yaml`, `CONFIG=configs/x.yaml`)."""
    found = []
    for word in [*command.words, *command.env.values()]:
        for part in (word, *word.split("=")[1:]):
            m = _REPO_PATH.match(part)
            if m and m[1] not in found:
                found.append(m[1])
    return found


_MAKE_OPTIONS_WITH_VALUE = {
    "-C",
    "-f",
    "-j",
    "-l",
    "-o",
    "-W",
    "-I",
    "--directory",
    "--file",
    "--makefile",
}


def make_targets(command: Command) -> list[str]:
    """The targets of a `make` command (variables `X=y` and options left out)."""
    if command.program != "make":
        return []
    targets, skip = [], False
    for word in command.words[1:]:
        if skip:
            skip = False
        elif word in _MAKE_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-") and not _ASSIGNMENT.match(word):
            targets.append(word)
    return targets


def makefile_targets(makefile: Path) -> set[str]:
    """The targets that have a rule in a Makefile (`name:` lines; variables' targets left out)."""
    targets: set[str] = set()
    for line in makefile.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([^\s#:=$][^:=]*?)\s*::?(?!=)", line)
        if m:
            targets.update(t for t in m[1].split() if "$" not in t)
    return targets


_LOCAL_SERVER = re.compile(r"\b(?:localhost|127\.0\.0\.1):8080\b")


def at_server(text: str, address: str) -> str:
    """A documented line that talks to the default `nmt serve` address (localhost:8080 or
    127.0.0.1:8080), talking to `address` (host:port) instead."""
    return _LOCAL_SERVER.sub(address, text)
