"""The one exception root of scaffold.

Every error a user can cause is a :class:`ScaffoldError` whose message says what is wrong, where, and how
to fix it. The CLI maps this one class to an exit code in one place; nothing else is caught there, so a
bug in scaffold still shows its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator


class ScaffoldError(Exception):
    """A problem with the user's input or files, reported without a traceback.

    ``where`` is the place (a spec file, "command-line flags", the forward), ``key`` the part of it (a key
    of the spec file, ``tensors.x.shape``). Code that knows only the part raises without ``where``; the
    caller that knows the place supplies it with :func:`error_context`.
    """

    def __init__(self, message: str, *, where: str | None = None, key: str | None = None, hint: str | None = None):
        self.message = message
        self.where = where
        self.key = key
        self.hint = hint
        super().__init__(str(self))

    def __reduce__(self):  # keep the parts apart when the error crosses a process boundary
        return (_rebuild, (type(self), self.message, self.where, self.key, self.hint))

    def __str__(self) -> str:
        location = ": ".join(part for part in (self.where, self.key) if part)
        text = f"{location}: {self.message}" if location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


@contextlib.contextmanager
def error_context(where: str) -> Iterator[None]:
    """Report the errors raised inside at ``where`` unless they name their own place (as torchgen's
    ``context.py`` does): the caller that knows which file or expression is being worked on says so once."""
    try:
        yield
    except ScaffoldError as exc:
        if exc.where is None:
            exc.where = where
            exc.args = (str(exc),)
        raise


class ScaffoldWarning(UserWarning):
    """Something about a generated op its author may not expect (the op is still generated and correct)."""


class SpecError(ScaffoldError):
    """The op spec (TOML file or command-line flags) is malformed."""


class ExpressionError(ScaffoldError):
    """The forward expression cannot be parsed or uses something scaffold does not allow."""


class DerivationError(ScaffoldError):
    """A derivative cannot be derived or translated to torch."""


class WriteError(ScaffoldError):
    """Generated files cannot be written (an existing file, a bad directory)."""


def _rebuild(
    cls: type[ScaffoldError], message: str, where: str | None, key: str | None, hint: str | None
) -> ScaffoldError:
    return cls(message, where=where, key=key, hint=hint)


class BenchError(ScaffoldError):
    """A benchmark cannot run as asked (no such device, dtype or native op)."""


class FormatError(ScaffoldError):
    """Generated code cannot be formatted: ruff is missing, not the pinned version, or fails."""


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice nearest to a misspelt ``word`` (``forwrd``: ``forward``), if one is near enough."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return near[0] if near else None
