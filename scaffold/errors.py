"""The one exception root of scaffold.

Every error a user can cause is a :class:`ScaffoldError` whose message says what is wrong, where, and how
to fix it. The CLI maps this one class to an exit code in one place; nothing else is caught there, so a
bug in scaffold still shows its traceback.
"""

from __future__ import annotations


class ScaffoldError(Exception):
    """A problem with the user's input or files, reported without a traceback."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(str(self))

    def __reduce__(self):  # keep where and hint apart when the error crosses a process boundary
        return (_rebuild, (type(self), self.message, self.where, self.hint))

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


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


def _rebuild(cls: type[ScaffoldError], message: str, where: str | None, hint: str | None) -> ScaffoldError:
    return cls(message, where=where, hint=hint)


class BenchError(ScaffoldError):
    """A benchmark cannot run as asked (no such device, dtype or native op)."""


class FormatError(ScaffoldError):
    """Generated code cannot be formatted: ruff is missing, not the pinned version, or fails."""
