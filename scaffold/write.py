"""Stage 8: write generated files: all or nothing, atomically, never clobbering without ``force``;
in a project, write the changes :mod:`scaffold.changes` computed (merged with the user's edits)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import WriteError
from .spec import RUNTIME_FILE


@dataclass(frozen=True)
class FileChange:
    """One file of the project, as it is (``old``, None when absent) and as it will be (``new``, None when
    it stays absent).

    ``status`` is one of created, unchanged, updated (the user had not edited it), merged (the user's
    edits kept), conflict (``conflicts`` regions written with markers) or overwritten (``--force``); a
    template update also leaves files alone: kept (there, as they are) or absent (not there, not created),
    with a ``note`` saying why. ``record`` marks scaffold's own bookkeeping under .scaffold/.
    """

    path: PurePosixPath
    old: str | None
    new: str | None
    status: str
    conflicts: int = 0
    record: bool = False
    note: str = ""

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass(frozen=True)
class Written:
    path: Path
    status: str  # "created", "overwritten" or "unchanged"


def write_files(files: dict[str, str], output_dir: str | Path, *, force: bool = False) -> list[Written]:
    """Write ``{relative path: text}`` under ``output_dir``.

    Every check happens before the first byte is written: if any target exists with other content and
    ``force`` is false, nothing is written. Each file is written to a temporary file beside it and moved
    into place with ``os.replace``, so no file is ever left half-written.
    """
    root = Path(output_dir)
    if root.exists() and not root.is_dir():
        raise WriteError(f"{root} exists and is not a directory", where="--output-dir")
    plan: list[tuple[Path, str, str]] = []
    conflicts = []
    for relative, text in files.items():
        path = root / relative
        if path.is_dir():
            raise WriteError(f"{path} is a directory", hint="remove it or choose another --output-dir")
        if path.exists():
            try:
                same = path.read_text(encoding="utf-8") == text
            except (OSError, UnicodeDecodeError):
                same = False
            if same:
                plan.append((path, text, "unchanged"))
                continue
            if not force:
                conflicts.append(path)
            plan.append((path, text, "overwritten"))
        else:
            plan.append((path, text, "created"))
    if conflicts:
        raise _refusal(conflicts)
    _replace_all(root, [(path, text) for path, text, status in plan if status != "unchanged"])
    return [Written(path, status) for path, _, status in plan]


def _refusal(conflicts: list[Path]) -> WriteError:
    """Why nothing was written: files that exist with other content. The runtime module is shared by every op
    in the folder, so another version of it (an older scaffold's, or edited) is not replaced silently either:
    the ops beside it import it."""
    runtime = [p for p in conflicts if p.name == RUNTIME_FILE]
    if runtime and len(conflicts) == 1:
        return WriteError(
            f"refusing to overwrite {runtime[0]}: it differs from the runtime this scaffold writes (another "
            "scaffold version wrote it, or it was edited), and the ops beside it import it; nothing was written",
            hint="pass --force (force=True from Python) to replace it and regenerate the other ops in that folder "
            "with this scaffold, or choose another --output-dir",
        )
    listed = ", ".join(str(p) for p in conflicts)
    return WriteError(
        f"refusing to overwrite {listed}: {'they exist' if len(conflicts) > 1 else 'it exists'} "
        "and may hold your edits; nothing was written",
        hint="pass --force (force=True from Python) to overwrite, or choose another --output-dir",
    )


def apply_changes(root: str | Path, changes: Sequence[FileChange]) -> None:
    """Write the changed files of ``changes`` under the project ``root``, all or nothing (a change whose
    ``new`` is None leaves its file alone)."""
    _replace_all(Path(root), [(Path(root) / c.path, c.new) for c in changes if c.changed and c.new is not None])


def _replace_all(root: Path, files: list[tuple[Path, str]]) -> None:
    """Write every file to a temporary file beside it, then move them all into place.

    A failure before the moves leaves every target as it was; a move (``os.replace``) is atomic, so no
    file is ever half-written.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        staged = []
        try:
            for path, text in files:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                staged.append((tmp, path))
                with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                    handle.write(text)
                os.chmod(tmp, _mode(path))
            for tmp, path in staged:
                os.replace(tmp, path)
        finally:
            for tmp, _ in staged:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError as exc:
        raise WriteError(f"cannot write to {root}: {exc.strerror or exc}") from None


def _mode(path: Path) -> int:
    """The permissions ``path`` keeps (an existing file's own), or gets as a new file under the umask
    (0644 under umask 022), as open() would give it: mkstemp's temporary file is 0600."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
