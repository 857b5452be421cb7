"""Regenerate the generated references of the documentation:

- the key table of docs/config.md, from the config dataclasses (`help_table`);
- the whole of docs/cli.md, every command, argument and option of `nmt`, from the Typer app
  (nmt.cli.app): what `nmt COMMAND --help` prints, as Markdown.

    python scripts/update_docs.py           # rewrite the stale ones
    python scripts/update_docs.py --check   # exit 1, naming them, if any is stale (make docs)

tests/test_cli_doc.py checks that both are current. The output is the same on every machine:
a default computed when the CLI is built (a count of cores) is written as "auto".
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]

CONFIG_DOC = ROOT / "docs/config.md"
CLI_DOC = ROOT / "docs/cli.md"
COMMAND = "python scripts/update_docs.py"
TABLE_HEADER = "| key | type | default | meaning |"


# ------------------------------------------------------------------ docs/config.md


def help_table() -> str:
    """Markdown reference of every key (docs/config.md is generated from this)."""
    from nmt.config import SECTIONS
    from nmt.fields import Bounds

    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            tname = (
                " \\| ".join(repr(a) for a in get_args(tp))
                if get_origin(tp) is Literal
                else getattr(tp, "__name__", str(tp))
            )
            rule = (
                f" {f.metadata['bounds'].rule().capitalize()}."
                if f.metadata["bounds"] != Bounds()
                else ""
            )
            lines.append(
                f"| `{section}.{f.name}` | {tname} | `{f.default!r}` | {f.metadata['help']}{rule} |"
            )
    return "\n".join(lines) + "\n"


def config_doc(text: str) -> str:
    """`text` (docs/config.md) with its key table replaced by the one `help_table` makes now."""
    start = text.index(TABLE_HEADER)
    lines = text[start:].split("\n")
    end = next(i for i, line in enumerate(lines) if not line.startswith("|"))
    return text[:start] + help_table() + "\n".join(lines[end:])


# ------------------------------------------------------------------ docs/cli.md

INTRO = f"""\
# Command-line reference

Every command of `nmt`, with its arguments and options: what `nmt COMMAND --help` prints.
This page is generated from the command-line interface itself (`nmt/cli.py` and the options
declared in `nmt/options.py`) by `{COMMAND}`; do not edit it by hand.
A test checks that it is current.

In the usage lines, `[OPTIONS]` stands for any of the options in the command's table,
`{{name}}` for a required argument, and `...` after it for one or more of them. Every
command takes `-h` / `--help`. A `--flag / --no-flag` pair turns a setting on or off; a
repeatable option is given once per value (`--set a=1 --set b=2`).
"""


def walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """`(command, context)` for `command` and every command under it, depth first, in the
    app's order; hidden commands are left out."""
    yield command, ctx
    for name in getattr(command, "commands", {}):
        sub = command.commands[name]
        if not sub.hidden:
            yield from walk(
                sub, sub.context_class(sub, info_name=name, parent=ctx, **sub.context_settings)
            )


def root_command() -> tuple[Any, Any]:
    """The Click command of the Typer app and its context, as `nmt` makes them."""
    import typer

    from nmt.cli import app

    command = typer.main.get_command(app)
    return command, command.context_class(command, info_name="nmt", **command.context_settings)


def computed_defaults() -> dict[str, Any]:
    """The flags of options whose default a factory computes on this machine (a count of
    cores; nmt.fields.opt(factory=...)), with the value it computes here."""
    from nmt import options
    from nmt.fields import flag

    computed = {}
    for cls in vars(options).values():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        for f in dataclasses.fields(cls):
            if f.default_factory is dataclasses.MISSING or not f.metadata.get("cli", True):
                continue
            value = f.default_factory()
            if value not in ([], {}, ()):
                for name in f.metadata.get("flags") or (flag(f.name),):
                    computed[name] = value
    return computed


def _code(text: str) -> str:
    """`text` as inline code that a table cell can hold (a `|` would end the cell)."""
    if "|" in text or "`" in text:
        return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"
    return f"`{text}`"


def markdown(text: str, table: bool = False) -> str:
    """Help text as Markdown: its `code spans` kept; elsewhere what would start an HTML tag
    (`<unk>`, `</s>`) or emphasis (`*`) escaped, and a `docs/PAGE.md` that exists made a link
    to it; in a table cell, `|` escaped."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span
            out.append(_code(part[1:-1]) if table else part)
            continue
        part = re.sub(r"&(?=#?\w+;)", "&amp;", part)  # not an entity
        part = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", part).replace(
            "*", r"\*"
        )  # not a tag, not emphasis
        if table:
            part = part.replace("|", r"\|")
        out.append(
            re.sub(
                r"\bdocs/([\w/-]+\.md)\b",
                lambda m: f"[docs/{m[1]}]({m[1]})" if (ROOT / "docs" / m[1]).is_file() else m[0],
                part,
            )
        )
    return "".join(out)


def paragraphs(help: str) -> list[str]:
    """A command's help text (its docstring up to a form feed, as `--help` takes it) in
    paragraphs, each on one line."""
    text = inspect.cleandoc(help).partition("\f")[0]
    return [
        " ".join(line.strip() for line in p.splitlines() if line.strip() not in ("", "\b"))
        for p in re.split(r"\n\s*\n", text)
        if p.strip()
    ]


def _type(param: Any, ctx: Any) -> str:
    """The type column: the value `--help` shows (`<int>`, `<gnmt|length|none>`), without its
    angle brackets; `flag` for a flag; repeatable or one-or-more where it is."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return "flag"
    label = param.metavar or param.display_type(ctx)
    if label.startswith("<") and label.endswith(">"):
        label = label[1:-1]
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    if label.isidentifier():
        label = label.lower()  # Path: path, as the help of a single path says
    cell = (
        "one of " + ", ".join(_code(c) for c in label.split("|")) if "|" in label else _code(label)
    )
    if param.param_type_name == "argument" and param.nargs != 1:
        return cell + (", one or more" if param.required else ", any number")
    if getattr(param, "multiple", False):
        return cell + ", repeatable"
    return cell


def _row(param: Any, ctx: Any, computed: dict[str, Any]) -> str:
    """A table row of an argument or option: its names, type, default and help, with what
    `--help` adds in brackets ([default: ...], [required], a range) in their columns."""
    if param.param_type_name == "argument":
        names = _code(param.display_name_raw)
    else:

        def joined(opts: list[str]) -> str:  # -c, --checkpoint: short first, as --help
            return ", ".join(
                _code(o) for o in sorted(opts, key=lambda o: len(o) - len(o.lstrip("-/+")))
            )

        names = " / ".join(joined(opts) for opts in (param.opts, param.secondary_opts) if opts)
    help = param.help or ""
    record = param.get_help_record(ctx)[1]
    extras = record[len(help) :].strip() if record.startswith(help) else ""
    default, notes = "", []
    for extra in (
        extras[1:-1].split("; ") if extras.startswith("[") and extras.endswith("]") else []
    ):
        if extra == "required":
            default = "*required*"
        elif extra.startswith("default: "):
            value = extra[len("default: ") :]
            if any(o in computed and param.default == computed[o] for o in param.opts):
                default = "*auto*"  # computed on the machine that builds the CLI: see the help
            elif getattr(param, "is_bool_flag", False) and param.secondary_opts:
                default = _code(param.opts[0] if param.default else param.secondary_opts[0])
            else:
                default = _code(value)
        else:
            notes.append(extra)
    description = markdown(help, table=True) + "".join(
        f" [{markdown(n, table=True)}]" for n in notes
    )
    return f"| {names} | {_type(param, ctx)} | {default} | {description} |"


def _anchor(path: str) -> str:
    """The id the toc extension gives the heading `## path`."""
    return "#" + re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", path).strip().lower())


def command_section(command: Any, ctx: Any, computed: dict[str, Any]) -> str:
    """`## nmt COMMAND`: its help, usage line, arguments, options and subcommands."""
    path = ctx.command_path
    lines = [f"## {path}", ""]
    for paragraph in paragraphs(command.help or ""):
        lines += [markdown(paragraph), ""]
    lines += [
        "```text",
        f"{path} {' '.join(command.collect_usage_pieces(ctx))}".rstrip(),
        "```",
        "",
    ]
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    for kind, title in (("argument", "Arguments"), ("option", "Options")):
        rows = [_row(p, ctx, computed) for p in params if p.param_type_name == kind]
        if rows:
            column = "argument" if kind == "argument" else "option"
            lines += [
                f"{title}:",
                "",
                f"| {column} | type | default | description |",
                "| --- | --- | --- | --- |",
                *rows,
                "",
            ]
    subcommands = [
        (name, sub) for name, sub in getattr(command, "commands", {}).items() if not sub.hidden
    ]
    if subcommands:
        lines += ["Commands:", "", "| command | description |", "| --- | --- |"]
        for name, sub in subcommands:
            summary = markdown((paragraphs(sub.help or "") or [""])[0], table=True)
            lines.append(f"| [`{name}`]({_anchor(f'{path} {name}')}) | {summary} |")
        lines.append("")
    return "\n".join(lines)


def cli_doc() -> str:
    """docs/cli.md: the intro, then a section for `nmt` and each of its commands, in order."""
    command, ctx = root_command()
    computed = computed_defaults()
    return (
        "\n".join(
            [INTRO, *(command_section(c, x, computed) for c, x in walk(command, ctx))]
        ).rstrip()
        + "\n"
    )


# ------------------------------------------------------------------ main


def generated() -> dict[Path, str]:
    """Each generated file and what it should contain now."""
    return {CONFIG_DOC: config_doc(CONFIG_DOC.read_text(encoding="utf-8")), CLI_DOC: cli_doc()}


def stale() -> list[Path]:
    """The generated files that are not what the code makes now (or missing)."""
    return [
        path
        for path, text in generated().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1, naming them, if a generated file is not current",
    )
    args = parser.parse_args(argv)
    import nmt

    checkout = Path(__file__).resolve().parents[1]
    if (
        Path(nmt.__file__).resolve().parents[1] != checkout
    ):  # this checkout's docs, not another nmt's
        sys.exit(
            f"the nmt imported is {Path(nmt.__file__).parent}, not this checkout's: pip install -e "
            f"{checkout}"
        )
    if args.check:
        paths = stale()
        if paths:
            names = " and ".join(str(p.relative_to(ROOT)) for p in paths)
            print(
                f"{names} {'is' if len(paths) == 1 else 'are'} not current: run `{COMMAND}`",
                file=sys.stderr,
            )
            return 1
        return 0
    for path, text in generated().items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
