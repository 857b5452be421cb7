"""nmt: a small, fast and dependable neural machine translation toolkit."""

__version__ = "0.1.0"
