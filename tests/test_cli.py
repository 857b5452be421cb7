"""The command line: help, version, one-line errors with non-zero exits, no tracebacks."""

import os
import subprocess
import sys

import pytest
from helpers import ROOT, assert_one_line, nmt

COMMANDS = [
    "prepare-bpe",
    "train",
    "distill",
    "average-checkpoints",
    "translate",
    "score",
    "export",
]


def test_help_lists_every_command():
    r = nmt("--help")
    assert r.returncode == 0
    for c in COMMANDS:
        assert c in r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    r = nmt(command, "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout and len(r.stdout.splitlines()) > 5


def test_version():
    from nmt import __version__

    r = nmt("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"nmt {__version__}"


MISTAKES = {  # id: (arguments, what the line names, exit status); {tmp} is the test's tmp_path
    "unknown_option": (["translate", "--beem", "4"], ["--beem"], 2),
    "bad_option_value": (["translate", "--beam", "many"], ["--beam"], 2),
    "missing_config": (["train", "no/such.yaml"], ["no/such.yaml"], 1),
    "bad_override": (["train", "configs/tiny.yaml", "--set", "train.lr=fast"], ["train.lr"], 1),
    "missing_prepare_input": (
        [
            "prepare-bpe",
            "-s",
            "en",
            "-t",
            "de",
            "--trainpref",
            "{tmp}/nope",
            "--destdir",
            "{tmp}/out",
        ],
        ["nope"],
        1,
    ),
    "missing_checkpoint": (["translate", "-c", "{tmp}/x.pt"], ["x.pt"], 1),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_mistake_is_one_line(tmp_path, mistake):
    """A usage error (exit 2) or a user mistake (exit 1): one line naming what was wrong."""
    args, needles, status = MISTAKES[mistake]
    r = nmt(*(a.format(tmp=tmp_path) for a in args), stdin="hi\n")
    assert_one_line(r.returncode, r.stderr, *needles, status=status)


def test_bad_config_key_is_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  d_modle: 3\n")
    r = nmt("train", str(p))
    assert_one_line(r.returncode, r.stderr, str(p), "model.d_modle", "did you mean model.d_model?")


def test_debug_shows_the_traceback():
    r = nmt("--debug", "train", "no/such.yaml")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_dump_config_prints_resolved_yaml():
    r = nmt("train", "configs/tiny.yaml", "--set", "train.lr=0.5", "--dump-config")
    assert r.returncode == 0 and "lr: 0.5" in r.stdout and "d_model: 32" in r.stdout


def test_dry_run_prints_parameters():
    r = nmt("train", "configs/tiny.yaml", "--dry-run", "--vocab-size", "100")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("parameters: ")


def test_torch_logs_nothing_after_our_last_line(tmp_path):
    """A SIGTERM during `import torch` (`nmt export` imports it late) stops it before it sets its
    loggers to WARNING; its atexit hook then logged "FakeTensor cache stats" at INFO after our
    one line. Simulated here: torch's logger put back to NOTSET before the command runs."""
    code = (
        "import logging, torch; logging.getLogger('torch').setLevel(logging.NOTSET); from nmt "
        "import cli; cli.main(['export', 'missing.pt', 'out'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert_one_line(r.returncode, r.stderr, "missing.pt")


def _commands(group, prefix: str = ""):
    """(path, command) of every command under the typer group `group`, sub-commands included."""
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(command, "commands"):  # a group: nmt plot
            yield from _commands(command, path + " ")
        else:
            yield path, command


def test_every_flag_and_argument_comes_from_an_options_field():
    """Each command's arguments and flags are the fields of one dataclass of nmt.options (and,
    for translate, DecodeConfig's decode settings), with the fields' names, flags and help, and
    a field's bound refused naming a flag of the command: CLI, API and docs declared once."""
    import dataclasses

    import typer

    from nmt import options
    from nmt.cli import app
    from nmt.config import DecodeConfig
    from nmt.fields import Bounds, flag

    def cli_fields(cls: type) -> dict[str, dataclasses.Field]:
        names = {f.name for f in dataclasses.fields(cls)}
        extra = (
            dataclasses.fields(DecodeConfig) if "decode" in names else ()
        )  # translate's overrides
        return {
            f.name: f for f in (*dataclasses.fields(cls), *extra) if f.metadata.get("cli", True)
        }

    classes = [
        c
        for c in vars(options).values()
        if dataclasses.is_dataclass(c) and c.__module__ == options.__name__
    ]
    root = typer.main.get_command(app)
    assert {p.name for p in root.params} == {
        "version",
        "verbose",
        "debug",
    }  # the app's own, before any command
    seen = set()
    for path, command in _commands(root):
        params = {p.name: p for p in command.params}
        matches = [c for c in classes if set(cli_fields(c)) == set(params)]
        assert len(matches) == 1, (
            f"nmt {path}: {sorted(params)} are not the fields of one options dataclass"
        )
        cls = matches[0]
        seen.add(cls)
        for name, f in cli_fields(cls).items():
            param = params[name]
            argument = param.param_type_name == "argument"
            assert argument == bool(f.metadata.get("argument")), (path, name)
            assert (param.help or "").startswith(f.metadata["help"]), (path, name)
            flags = f.metadata.get("flags") or (
                () if argument else (f"--{name.replace('_', '-')}",)
            )
            assert set(flags) <= set(param.opts), (path, name, param.opts)
            if (
                f.metadata.get("bounds", Bounds()) != Bounds()
            ):  # check_bounds(options, flag) names the flag
                assert flag(name) in param.opts, (path, name, param.opts)
    assert seen == {
        c for c in classes if any(f.metadata.get("cli", True) for f in dataclasses.fields(c))
    }
