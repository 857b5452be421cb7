"""The one error type the library raises for user mistakes.

The CLI turns an `NmtError` into a one-line message and a non-zero exit; anything
else is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A user-facing error: bad input, bad config, missing file. The message names it."""


class ConfigError(NmtError):
    """A config file or `--set` override that cannot be used; the message names the key."""


def require(ok: bool, message: str) -> None:
    """Raise NmtError(message) unless `ok`: the options checks of the commands."""
    if not ok:
        raise NmtError(message)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message squeezed onto one line (whitespace runs become one space), cut at
    `limit` characters; for an OSError its strerror; the type's name for an empty message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())[:limit] or type(exc).__name__
