"""nmt: a small, fast and dependable neural machine translation toolkit.

The Python API is `nmt.Translator` (and its results, `nmt.Translation`), from `nmt.api`:

    from nmt import Translator
    translator = Translator.load("runs/m30k/checkpoint_avg.pt", beam=5)
    translator.translate(["A dog runs in the park."])

They are imported on first use, so `import nmt` (and the command line) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Translation", "Translator", "__version__"]

if TYPE_CHECKING:
    from nmt.api import Translation, Translator


def __getattr__(name: str) -> Any:
    if name in ("Translator", "Translation"):
        from nmt import api

        return getattr(api, name)
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
