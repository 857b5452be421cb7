"""The server's rooms, enforced: no import circle inside nmt/serve/ (an import hidden inside a
function included), no private attribute of another object read there, and no private method of
`Translator` called from outside nmt/api.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nmt.api import Translator

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"
SERVE = PACKAGE / "serve"


def serve_imports(folder: Path) -> dict[str, set[str]]:
    """Each module of `folder` (nmt/serve) -> the modules of that folder it imports, wherever
    the import is: at the top, under `if TYPE_CHECKING`, inside a function."""
    modules = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 1:  # from .answers import answer; from . import stream
                    base = ".".join(["nmt", "serve", *filter(None, [node.module])])
                # `from nmt.serve import libretranslate` imports the module libretranslate
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["nmt", "serve"] and len(parts) > 2 and parts[2] in modules:
                    found.add(parts[2])
        graph[path.stem] = found - {path.stem}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (its modules in order, the first repeated at the end), or
    [] where there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        for imported in sorted(graph.get(module, ())):
            found = visit(imported, path + [module])
            if found:
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return []


def test_nmt_serve_has_no_import_circle() -> None:
    graph = serve_imports(SERVE)
    assert "libretranslate" in graph["app"]  # the graph is read at all
    assert cycle(graph) == []


def test_an_import_circle_is_found_even_inside_a_function(tmp_path: Path) -> None:
    """The check itself: a circle closed by an import inside a function is reported."""
    folder = tmp_path / "serve"
    folder.mkdir()
    (folder / "app.py").write_text("from nmt.serve import pages\n")
    (folder / "pages.py").write_text("from .answers import answer\n")
    (folder / "answers.py").write_text("def f():\n    from nmt.serve.app import Service\n")
    (folder / "alone.py").write_text("import nmt.serve.answers\n")
    graph = serve_imports(folder)
    assert graph == {
        "alone": {"answers"},
        "answers": {"app"},
        "app": {"pages"},
        "pages": {"answers"},
    }
    assert cycle(graph) == ["answers", "app", "pages", "answers"]
    (folder / "answers.py").write_text("def f():\n    return 1\n")
    assert cycle(serve_imports(folder)) == []


def private_reads(source: str) -> list[str]:
    """`x._name` in `source` where x is not self or cls: a private attribute of another object."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_no_module_of_nmt_serve_reads_another_object_s_private_attribute() -> None:
    """libretranslate.py called four private methods of app.py's Service: the request plumbing
    they were is nmt/serve/requests.py's, public."""
    found = {
        path.name: private_reads(path.read_text(encoding="utf-8"))
        for path in sorted(SERVE.glob("*.py"))
    }
    assert {name: reads for name, reads in found.items() if reads} == {}
    assert private_reads("service._payload(request)\nself._jobs\n") == ["1: ._payload"]


def test_no_private_method_of_translator_is_called_outside_the_api() -> None:
    """The names are Translator's own private attributes, so a new one is covered too."""
    private = sorted(
        name for name in vars(Translator) if name.startswith("_") and not name.startswith("__")
    )
    assert "_nbest" in private
    assert re.search(r"(?<!\bself)\._nbest\(", "tr._nbest(texts)")
    assert not re.search(r"(?<!\bself)\._nbest\(", "self._nbest(texts)")
    calls = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "api.py"
        for name in private
        if re.search(rf"(?<!\bself)\.{name}\(", path.read_text(encoding="utf-8"))
    ]
    assert calls == []
