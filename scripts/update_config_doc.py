"""Regenerate the key table of docs/config.md from nmt/config.py (the test that it is current:
tests/test_config.py::test_docs_config_reference_is_current)."""

from pathlib import Path

from nmt.config import help_table

DOC = Path(__file__).resolve().parents[1] / "docs/config.md"
text = DOC.read_text(encoding="utf-8")
start = text.index("| key | type | default | meaning |")
lines = text[start:].split("\n")
end = next(i for i, line in enumerate(lines) if not line.startswith("|"))
DOC.write_text(text[:start] + help_table() + "\n".join(lines[end:]), encoding="utf-8")
